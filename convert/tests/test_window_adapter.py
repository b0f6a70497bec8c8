"""The window adapter (docs/decoding.md, "Window adapter") in the reference: its decoding rule, its training
layout against the decoder's own forwards, the exactness of its anchor row at init, and the objective's one
mask function against the masks training used before it (dense and block-sparse)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from a2d_convert import lora as lora_mod
from a2d_convert.data import TRAIN_FILE, load_rows
from a2d_convert.decode import decode_steps
from a2d_convert.decoding import DecodeParams
from a2d_convert.init_model import init_model
from a2d_convert.model import BlockForward, block_causal_mask, causal_mask, load_transformer
from a2d_convert.objective import Objective, RowSchedule
from a2d_convert.train_config import TrainConfig
from a2d_convert.trainer import LOG_FILE, train

from test_train import tiny_config, workspace  # noqa: F401  (the module's fixture)


def window_model(base, tmp_path, b_std=0.5, seed=1):
    model_dir = init_model(base, tmp_path / "init", block_size=4, shift_logits=True)
    model, _, a2d = load_transformer(model_dir)
    lora_mod.attach(model, lora_mod.LoraConfig(rank=4, alpha=4.0), a2d.mask_token_id, torch.Generator().manual_seed(seed), rows="window")
    if b_std:
        with torch.no_grad():
            for _, module in lora_mod.target_modules(model, lora_mod.TARGETS):
                module.window_b.normal_(0, b_std)
    return model, a2d


@pytest.mark.parametrize("variant", ["adapter", "clean_lora", "rule"])
def test_window_layout_reproduces_decoding_forwards(workspace, tmp_path, variant):
    """Every noisy block of the window layout (its anchor row, then its positions) gives the logits the decoder's
    (commit, window) forward gives: commit = the sample's tokens before the anchor, window = the anchor and the
    block as masked in that copy, under the window rule with the adapter on every window row; with --clean-lora's
    all-row LoRA (random factors) too, which the committed rows carry as well; and under the window rule alone
    (--window-rule: no window factors, a plain LoRA with random factors on every row)."""
    root, base, data = workspace
    clean_lora, rule = variant == "clean_lora", variant == "rule"
    if rule:
        model, _, a2d = load_transformer(init_model(base, tmp_path / "init", block_size=4, shift_logits=True))
        model.attention_rule = "window"
    else:
        model, a2d = window_model(base, tmp_path)
    if clean_lora or rule:
        lora_mod.attach(model, lora_mod.LoraConfig(rank=4, alpha=4.0, train_norms=False, train_mask_embedding=False),
                        a2d.mask_token_id, torch.Generator().manual_seed(2), freeze=False)
        with torch.no_grad():
            for _, module in lora_mod.target_modules(model, lora_mod.TARGETS):
                module.lora_B.normal_(0, 0.5)
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    config = TrainConfig(block_size=4, batch_rows=2, window_adapter=not rule, window_rule=rule, lora_rank=4, mask_pattern="decoder",
                         t_min=0.1, t_max=0.9, clean_lora=clean_lora)
    schedule = RowSchedule(arrays, config, a2d.mask_token_id)
    layout = schedule.layout
    L = arrays["input_ids"].shape[1]
    assert layout.block_rows == 5 and layout.rows == L + 2 * (L // 4) * 5
    batch = schedule.batch(0, [0])
    objective = Objective(model, config, None, layout)
    ids, pos, row_seg = (torch.from_numpy(a) for a in (batch.input_ids, batch.position_ids, batch.row_seg))
    hidden = objective.split_pass(ids, pos, row_seg)
    # The clean stream keeps its graph exactly when its rows train (the all-row LoRA), and costs none otherwise.
    hidden[:, :L].sum().backward(retain_graph=True)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters()) == (clean_lora or rule)
    with torch.no_grad():
        logits = model.logits(hidden.detach()[0])
    clean = batch.input_ids[0]
    seg = batch.segment_ids[0]
    checked = 0
    for c in (1, 2):
        for k in range(1, L // 4):
            first = layout.noisy_row(c, np.array(k * 4)) - 1  # the anchor row
            if seg[k * 4] == 0 or seg[k * 4 - 1] != seg[k * 4]:
                assert batch.row_seg[0, first] in (-1, 0) or seg[k * 4] == 0
                continue
            start = int(np.flatnonzero(seg == seg[k * 4])[0])
            commit = clean[start : k * 4 - 1].tolist()
            window = batch.input_ids[0, first : first + 5].tolist()
            assert window[0] == clean[k * 4 - 1]
            want = BlockForward(model)(commit, window, list(range(len(commit), len(commit) + 5)))
            torch.testing.assert_close(logits[first : first + 5], want, rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked >= 6
    # Position p is predicted from the row before its slot: the anchor for a block's first position.
    R = layout.rows
    for pred, target, teacher in zip(batch.pred_index, batch.targets, batch.teacher_index):
        assert pred // R == 0 and batch.input_ids[0, pred + 1] == a2d.mask_token_id
        assert clean[teacher + 1] == target  # the clean row p - 1 is the teacher's predictor


def test_the_anchor_row_reads_as_the_base_while_the_adapter_is_zero(workspace, tmp_path):
    """With B at zero and nothing revealed to its right, the window's anchor row is the base's causal reading:
    position 0 of the window is predicted exactly as the base predicts the next token; a revealed token to
    its right changes it (the window rule lets the anchor see it)."""
    root, base, _ = workspace
    model, a2d = window_model(base, tmp_path, b_std=0.0)
    plain, _, _ = load_transformer(tmp_path / "init")
    M = a2d.mask_token_id
    prefix = [5, 9, 11, 7, 3, 12]
    with torch.no_grad():
        ar = plain.logits(plain(torch.tensor([prefix]), torch.arange(6)[None], causal_mask(6)[None])[0][0, -1])
    got = BlockForward(model)(prefix[:-1], [prefix[-1], M, M, M, M], [5])[0]
    torch.testing.assert_close(got, ar, rtol=1e-5, atol=1e-5)
    seen = BlockForward(model)(prefix[:-1], [prefix[-1], M, 14, M, M], [5])[0]
    assert (seen - ar).abs().max() > 1e-3


def test_the_window_rule_mask():
    """Real window rows see every real window row, masked ones the whole window; commit rows are causal."""
    mask = block_causal_mask(2, 1, 4, revealed=[True, False, True, False], rule="window")
    window = mask[1:, 3:]
    assert window.tolist() == [[True, False, True, False], [True, True, True, True], [True, False, True, False], [True, True, True, True]]
    assert mask[0].tolist() == [True, True, True, False, False, False, False]
    assert mask[1:, :3].all()


def test_decoding_opens_every_window_with_its_anchor_and_commits_it_one_move_later():
    """The forwards the loop asks for: the window is [anchor] + B positions, commit the finished tokens before
    the anchor, so the cache never holds the anchor; candidate j is read from window row j."""
    M, B = 99, 4
    params = DecodeParams(max_tokens=9, block_size=B, threshold=0.5, min_per_step=1, remasking="low_confidence", advance="slide")
    steps = decode_steps([1, 2, 3], params, mask_token_id=M, shift_logits=True, anchor_in_window=True)
    forwards, request = [], next(steps)
    try:
        while True:
            commit, window, rows = request
            forwards.append((list(commit), list(window), list(rows)))
            assert len(window) == B + 1 and window[0] != M
            assert rows == [len(commit) + j for j, t in enumerate(window[1:]) if t == M][: len(rows)]
            # The first two candidates confident, each choosing the token 10 + its window row: two reveals a step.
            logits = np.full((len(rows), 100), -10.0, dtype=np.float32)
            for i, row in enumerate(rows):
                logits[i, 10 + row - len(commit)] = 10.0 if i < 2 else 0.0
            request = steps.send(logits)
    except StopIteration as stop:
        result = stop.value
    sequence = [1, 2, 3] + result.token_ids
    cached = []
    for commit, window, _ in forwards:
        cached += commit
        assert cached + window[:1] == sequence[: len(cached) + 1]  # the anchor: the last finished token, not cached
    assert forwards[0][:2] == ([1, 2], [3, M, M, M, M])
    assert len(result.token_ids) == 9 and result.forward_passes == len(forwards) < 9  # several tokens a forward


def test_layout_mask_equals_the_masks_training_used_before(workspace):
    """The one mask function gives, for the clean-anchor layout with and without the mask adapter's rule,
    exactly the boolean masks the objective built before it (copied here as they were)."""
    _, _, data = workspace
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    for mask_adapter in (False, True):
        config = TrainConfig(block_size=4, batch_rows=2, mask_adapter=mask_adapter, lora_rank=4 if mask_adapter else 0)
        schedule = RowSchedule(arrays, config, mask_token_id=10_000)
        batch = schedule.batch(2, [0, 1])
        holder = torch.nn.Module()
        holder.attention_rule, holder.mask_token_id = ("mask" if mask_adapter else None), 10_000
        objective = Objective(holder, config, None, schedule.layout)
        ids, row_seg, seg = (torch.from_numpy(a) for a in (batch.input_ids, batch.row_seg, batch.segment_ids))
        R, L = schedule.layout.rows, seg.shape[1]
        ours = objective.attention_mask(ids, row_seg, slice(0, R), R)
        revealed = (ids[:, L:] != 10_000).view(2, 2, L) if mask_adapter else None
        assert torch.equal(ours, mask_used_before(seg, 4, 3, revealed))


def test_block_sparse_attention_equals_the_dense_mask(workspace, tmp_path):
    """The noisy pass through FlexAttention's BlockMask gives the hidden states of the dense boolean mask."""
    root, base, data = workspace
    model, a2d = window_model(base, tmp_path)
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    config = TrainConfig(block_size=4, batch_rows=2, window_adapter=True, lora_rank=4, attention="dense")
    schedule = RowSchedule(arrays, config, a2d.mask_token_id)
    dense = Objective(model, config, None, schedule.layout)
    flex = Objective(model, TrainConfig(**{**config.__dict__, "attention": "flex"}), None, schedule.layout)
    mask_mods = []
    for step in (1, 2):  # two micro-batches through one objective: its mask_mod is reused, refilled in place
        batch = schedule.batch(step, [0, 1])
        ids, pos, row_seg = (torch.from_numpy(a) for a in (batch.input_ids, batch.position_ids, batch.row_seg))
        with torch.no_grad():
            want = dense.split_pass(ids, pos, row_seg)
            got = flex.split_pass(ids, pos, row_seg)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        L = schedule.layout.L
        mask_mods.append(flex.attention_mask(ids, row_seg, slice(L, schedule.layout.rows), schedule.layout.rows).mask_mod)
    assert mask_mods[0] is mask_mods[1]


def test_a_window_adapter_trains_and_exports_unmerged(workspace, tmp_path):
    """train --window-adapter: the factors on every window row, shipped beside the base's weights with the
    config's a2d.window_adapter; the export decodes in the reference with the anchor in the window."""
    from a2d_convert.decode import decode
    from a2d_convert.export import export, rebuild
    from a2d_convert.weights import read_tensors

    root, base, data = workspace
    folder = train(tiny_config(root, base, data, "window-adapter", max_steps=10, lora_rank=4, kl_weight=0.5, lr=1e-2,
                               window_adapter=True, mask_pattern="decoder", confidence_weight=0.5, confidence_temperature=0.5))
    log = [json.loads(line) for line in (root / "window-adapter" / LOG_FILE).read_text().splitlines()]
    assert all(r["mfu"] > 0 and np.isfinite(r["certainty"]) for r in log)
    out = export(folder, tmp_path / "model", delta_dir=tmp_path / "delta")
    config = json.loads((out / "config.json").read_text())
    assert config["a2d"]["window_adapter"]["rank"] == 4 and "mask_adapter" not in config["a2d"]
    rebuilt = rebuild(base, tmp_path / "delta", tmp_path / "rebuilt")  # bit for bit from the checkpoint and the delta
    assert (rebuilt / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    shipped, init = read_tensors(out), read_tensors(root / "window-adapter" / "init")
    assert torch.equal(shipped["model.layers.0.self_attn.q_proj.weight"], init["model.layers.0.self_attn.q_proj.weight"])
    assert shipped["model.layers.1.mlp.down_proj.window_b"].abs().sum() > 0
    model, _, a2d = load_transformer(out)
    assert a2d.anchor_in_window and model.attention_rule == "window"
    params = DecodeParams(max_tokens=8, block_size=4, threshold=0.5, advance="slide")
    result = decode(BlockForward(model), [3, 4, 5], params, mask_token_id=a2d.mask_token_id, shift_logits=True, anchor_in_window=True)
    assert len(result.token_ids) >= 1 and result.forward_passes >= 1
    with pytest.raises(Exception, match="window-adapter"):
        train(tiny_config(root, base, data, "window-ar", max_steps=1, lora_rank=4, window_adapter=True, ar_weight=1.0))


def test_a_clean_lora_trains_every_row_and_ships_merged_beside_the_window_adapter(workspace, tmp_path):
    """train --window-adapter --clean-lora: the all-row LoRA's factors and the window adapter's both train (the
    clean stream keeps its graph; the KL teacher is the model with both off); the export merges the LoRA into the
    base's weights and ships the window adapter unmerged, `rebuild` gives it bit for bit, and it decodes."""
    from a2d_convert.decode import decode
    from a2d_convert.export import export, rebuild
    from a2d_convert.weights import read_tensors

    root, base, data = workspace
    folder = train(tiny_config(root, base, data, "clean-lora", max_steps=6, lora_rank=4, kl_weight=0.5, lr=1e-2,
                               window_adapter=True, clean_lora=True, mask_pattern="decoder"))
    trained = load_file(folder / "adapter.safetensors")
    assert any(n.endswith(".lora_B") and t.abs().sum() > 0 for n, t in trained.items())
    assert any(n.endswith(".window_b") and t.abs().sum() > 0 for n, t in trained.items())
    out = export(folder, tmp_path / "model", delta_dir=tmp_path / "delta")
    rebuilt = rebuild(base, tmp_path / "delta", tmp_path / "rebuilt")
    assert (rebuilt / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    shipped, init = read_tensors(out), read_tensors(root / "clean-lora" / "init")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(shipped[name], init[name]) and shipped["model.layers.1.mlp.down_proj.window_b"].abs().sum() > 0
    assert not any(n.endswith((".lora_A", ".lora_B")) for n in shipped)
    model, _, a2d = load_transformer(out)
    assert a2d.anchor_in_window and model.attention_rule == "window"
    params = DecodeParams(max_tokens=8, block_size=4, threshold=0.5, advance="slide")
    result = decode(BlockForward(model), [3, 4, 5], params, mask_token_id=a2d.mask_token_id, shift_logits=True, anchor_in_window=True)
    assert len(result.token_ids) >= 1
    with pytest.raises(Exception, match="--clean-lora"):
        train(tiny_config(root, base, data, "clean-alone", max_steps=1, lora_rank=4, clean_lora=True))


@pytest.mark.parametrize("lora_rank", [4, 0])
def test_a_window_rule_trains_every_row_and_ships_the_base_shape(workspace, tmp_path, lora_rank):
    """train --window-rule: the window layout and attention rule with no factors of their own; every row trains
    the model's weights (a plain LoRA merged at export, or a full fine-tune). The export is the base's shape with
    a2d.window_rule (no factor tensor), `rebuild` gives it bit for bit, and it decodes with the anchor in the window
    under the window rule."""
    from a2d_convert.decode import decode
    from a2d_convert.export import export, rebuild
    from a2d_convert.weights import read_tensors

    root, base, data = workspace
    name = f"window-rule-{lora_rank}"
    folder = train(tiny_config(root, base, data, name, max_steps=6, lora_rank=lora_rank, kl_weight=0.5, lr=1e-2,
                               window_rule=True, mask_pattern="decoder", confidence_weight=0.5))
    log = [json.loads(line) for line in (root / name / LOG_FILE).read_text().splitlines()]
    assert all(r["mfu"] > 0 and np.isfinite(r["ce"]) for r in log)
    out = export(folder, tmp_path / "model", delta_dir=tmp_path / "delta")
    config = json.loads((out / "config.json").read_text())
    assert config["a2d"]["window_rule"] is True and not {"window_adapter", "mask_adapter"} & set(config["a2d"])
    rebuilt = rebuild(base, tmp_path / "delta", tmp_path / "rebuilt")
    assert (rebuilt / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    shipped, init = read_tensors(out), read_tensors(root / name / "init")
    assert shipped.keys() == init.keys()  # the base's tensors, nothing beside them
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(shipped[weight], init[weight])
    model, _, a2d = load_transformer(out)
    assert a2d.anchor_in_window and a2d.attention_rule == "window" and model.attention_rule == "window"
    params = DecodeParams(max_tokens=8, block_size=4, threshold=0.5, advance="slide")
    result = decode(BlockForward(model), [3, 4, 5], params, mask_token_id=a2d.mask_token_id, shift_logits=True, anchor_in_window=True)
    assert len(result.token_ids) >= 1
    with pytest.raises(Exception, match="--window-rule"):
        train(tiny_config(root, base, data, "rule-and-adapter", max_steps=1, lora_rank=4, window_rule=True, window_adapter=True))


def mask_used_before(segment_ids: torch.Tensor, block: int, copies: int, revealed: torch.Tensor | None) -> torch.Tensor:
    """The objective's boolean mask before layout_mask (objective.training_attention_mask), for the comparison."""
    b, L = segment_ids.shape
    idx = torch.arange(L)
    blk = idx // block
    seg = segment_ids
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
    eye = torch.eye(L, dtype=torch.bool)[None]
    causal = idx[:, None] >= idx[None, :]
    before_block = idx[None, :] < (blk * block)[:, None]
    same_block = blk[:, None] == blk[None, :]
    mask = torch.zeros(b, copies * L, copies * L, dtype=torch.bool)
    mask[:, :L, :L] = (same & causal) | eye
    for c in range(1, copies):
        rows = slice(c * L, (c + 1) * L)
        mask[:, rows, :L] = same & before_block
        noisy_noisy = (same & same_block) | eye
        if revealed is None:
            mask[:, rows, rows] = noisy_noisy
        else:
            rev = revealed[:, c - 1]
            causal_revealed = (same & same_block & causal & rev[:, None, :]) | eye
            mask[:, rows, rows] = torch.where(rev[:, :, None], causal_revealed, noisy_noisy)
    return mask


def loss_and_grads(objective, model, batch):
    """(loss, statistics, gradients by name) of one forward and backward of `objective` on a RowSchedule batch."""
    tensors = {name: torch.from_numpy(np.ascontiguousarray(getattr(batch, name))) for name in (
        "input_ids", "position_ids", "segment_ids", "row_seg", "pred_index", "targets", "weights", "teacher_index",
        "ar_index", "ar_targets", "clean_index", "clean_teacher_index")}
    loss, stats = objective(**tensors)
    loss.backward()
    return loss.detach(), stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(grads, expected):
    """fp32 sums in another order (fused or compiled kernels, grouped GEMMs) differ by a few ulps of the largest
    terms, so an entry near zero can be off by far more than its own size: each gradient is held to 1e-4 of its
    tensor's largest entry."""
    for name in expected:
        scale = float(expected[name].abs().max())
        assert scale > 0, name
        torch.testing.assert_close(grads[name], expected[name], rtol=0, atol=1e-4 * scale, msg=name)


def test_compiled_loss_chunks_give_the_eager_loss_and_gradients(workspace, tmp_path):
    """Objective.compile_terms (torch.compile of the loss chunks: CE, KL to the base, certainty) gives the eager
    loss, statistics and adapter gradients; the chunk is small, so the last chunk is padded."""
    root, base, data = workspace
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    config = TrainConfig(block_size=4, batch_rows=2, window_adapter=True, lora_rank=4, mask_pattern="decoder", t_min=0.1,
                         t_max=0.9, kl_weight=1.0, confidence_weight=2.0, confidence_temperature=0.5, logits_chunk=48,
                         loss_weighting="none", attention="dense")
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)  # window_model draws B from the global generator
        model, a2d = window_model(base, tmp_path / str(compiled), b_std=0.05)
        schedule = RowSchedule(arrays, config, a2d.mask_token_id)
        objective = Objective(model, config, None, schedule.layout)
        if compiled:
            objective.compile_terms()
        batch = schedule.batch(0, [0, 1])
        assert batch.pred_index.size % 48  # a ragged last chunk
        results.append(loss_and_grads(objective, model, batch))
    (loss0, stats0, grads0), (loss1, stats1, grads1) = results
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(stats1, stats0, rtol=1e-5, atol=1e-4)
    assert grads0.keys() == grads1.keys() and len(grads0) > 0
    assert_grads_close(grads1, grads0)


@pytest.mark.parametrize("rule", ["window", "mask"])
def test_grouped_projections_give_the_hooks_loss_and_gradients(workspace, tmp_path, rule):
    """lora.fuse_projections (q/k/v and gate/up as one GEMM each, a group's factors as one A and one block-diagonal
    B product: what training runs) gives the loss, statistics and factor gradients of a projection at a time with
    its hook, for both row rules (the mask adapter's gate applied to t)."""
    root, base, data = workspace
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    config = TrainConfig(block_size=4, batch_rows=2, lora_rank=4, mask_pattern="decoder" if rule == "window" else "random",
                         t_min=0.1, t_max=0.9, kl_weight=1.0, confidence_weight=2.0, confidence_temperature=0.5,
                         loss_weighting="none", attention="dense", window_adapter=rule == "window", mask_adapter=rule == "mask")
    results = []
    for grouped in (False, True):
        torch.manual_seed(0)
        model_dir = init_model(base, tmp_path / f"{rule}{grouped}", block_size=4, shift_logits=True)
        model, _, a2d = load_transformer(model_dir)
        lora_mod.attach(model, lora_mod.LoraConfig(rank=4, alpha=8.0), a2d.mask_token_id, torch.Generator().manual_seed(1), rows=rule)
        with torch.no_grad():
            for _, module in lora_mod.target_modules(model, lora_mod.TARGETS):
                getattr(module, f"{rule}_b").normal_(0, 0.05)
        if grouped:
            assert lora_mod.fuse_projections(model) == model.config.num_layers
        schedule = RowSchedule(arrays, config, a2d.mask_token_id)
        objective = Objective(model, config, None, schedule.layout)
        batch = schedule.batch(0, [0, 1])
        results.append(loss_and_grads(objective, model, batch))
    (loss0, stats0, grads0), (loss1, stats1, grads1) = results
    assert abs(float(loss0)) > 0
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats1, stats0, rtol=1e-5, atol=1e-5)
    assert grads0.keys() == grads1.keys() and any(n.endswith(f"{rule}_a") for n in grads0)
    assert_grads_close(grads1, grads0)


def test_profile_steps_write_the_kernels_and_the_busy_share(workspace):
    """--profile-steps A:B writes OUT/profile.txt: the wall time of those steps, the host's share and the table."""
    root, base, data = workspace
    train(tiny_config(root, base, data, "profiled", max_steps=3, lora_rank=4, window_adapter=True, profile_steps="1:3"))
    text = (root / "profiled" / "profile.txt").read_text()
    assert text.startswith("steps 1..2: wall ") and "host building batches" in text and "Name" in text


def test_flex_backward_tiles_become_kernel_options_and_bad_ones_name_the_fix():
    from a2d_convert.errors import A2DError
    from a2d_convert.train_config import check_config, flex_backward_options

    assert flex_backward_options("32,64,64,32") == {"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32}
    for bad in ("64,32,64,64", "64,64,32,64", "64,64,64", "48,96,96,48", "a,b,c,d"):
        with pytest.raises(A2DError, match="M1,N1,M2,N2"):
            check_config(TrainConfig(base="b", data="d", out="o", flex_backward_tiles=bad))


def test_the_flex_tile_is_64_for_small_heads_unless_asked():
    from a2d_convert.trainer import flex_tile

    assert flex_tile(TrainConfig(), 64) == 64 and flex_tile(TrainConfig(), 128) == 0
    assert flex_tile(TrainConfig(flex_block=32), 128) == 32
    with pytest.raises(Exception, match="flex-block"):
        from a2d_convert.train_config import check_config

        check_config(TrainConfig(flex_block=48))


def test_init_adapter_starts_a_run_from_an_earlier_runs_export(workspace, tmp_path):
    """train --init-adapter: a run started from an earlier run's export (its delta folder or its model folder) begins
    with that run's factors and mask row, so at learning rate 0 it ships the same adapter bit for bit; the train
    stage's lineage records the folder's files; another rank is refused with the flag to fix named."""
    from a2d_convert.errors import A2DError
    from a2d_convert.export import export, row_adapter_tensors
    from a2d_convert.weights import read_tensors

    root, base, data = workspace
    common = dict(lora_rank=4, window_adapter=True, mask_pattern="decoder")
    first = train(tiny_config(root, base, data, "warm-first", max_steps=6, lr=1e-2, **common))
    model_dir = export(first, tmp_path / "first", delta_dir=tmp_path / "first-delta")
    mask_id = load_transformer(model_dir)[2].mask_token_id
    from_delta = row_adapter_tensors(tmp_path / "first-delta", "window", mask_id)
    from_model = row_adapter_tensors(model_dir, "window", mask_id)
    assert from_delta.keys() == from_model.keys() and "mask_embedding" in from_delta
    assert all(torch.equal(from_delta[name], from_model[name]) for name in from_delta)
    before = read_tensors(model_dir)
    factors = [name for name in before if name.endswith((".window_a", ".window_b"))]
    assert factors and before["model.layers.1.mlp.down_proj.window_b"].abs().sum() > 0
    for source in ("first-delta", "first"):
        again = train(tiny_config(root, base, data, f"warm-again-{source}", max_steps=2, lr=0.0, init_adapter=str(tmp_path / source),
                                  **common))
        shipped = read_tensors(export(again, tmp_path / f"again-{source}"))
        assert all(torch.equal(shipped[name], before[name]) for name in factors)
        assert torch.equal(shipped["model.embed_tokens.weight"][mask_id], before["model.embed_tokens.weight"][mask_id])
        stage = json.loads((again / "lineage.json").read_text())["stages"][-1]
        assert stage["stage"] == "train" and any(name.startswith("init_adapter/") for name in stage["inputs"])
    with pytest.raises(A2DError, match="--lora-rank"):
        train(tiny_config(root, base, data, "warm-rank", max_steps=1, init_adapter=str(tmp_path / "first-delta"),
                          **{**common, "lora_rank": 2}))
    with pytest.raises(A2DError, match="--window-adapter"):
        train(tiny_config(root, base, data, "warm-plain", max_steps=1, lora_rank=4, init_adapter=str(tmp_path / "first-delta")))
