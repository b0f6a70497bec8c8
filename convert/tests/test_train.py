"""The training objective sees exactly what decoding sees, the tiny run learns, and it resumes exactly."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from a2d_convert.data import HELDOUT_FILE, DataConfig, Source, TRAIN_FILE, build_data, load_rows
from a2d_convert.init_model import init_model
from a2d_convert.model import BlockForward, load_transformer
from a2d_convert import lora as lora_mod
from a2d_convert.objective import Objective, RowSchedule, block_masks, curriculum_t_max
from a2d_convert.tiny import TinySpec, make_tiny_base
from a2d_convert.errors import A2DError
from a2d_convert.train_config import TrainConfig, check_config
from a2d_convert.trainer import LOG_FILE, train


def arithmetic_rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        a, b = (int(v) for v in rng.integers(0, 20, 2))
        rows.append({"prompt": f"What is {a} plus {b}?", "response": f"{a} plus {b} is {a + b}."})
    return rows


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    base = make_tiny_base(root / "base", TinySpec(layers=2, hidden=64, heads=4, kv_heads=2))
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(96)))
    data = build_data([Source(path=rows, name="arith")], base, root / "data", DataConfig(block_size=4, seq_len=96))
    return root, base, data


def tiny_config(root: Path, base: Path, data: Path, name: str, **overrides) -> TrainConfig:
    config = TrainConfig(
        base=str(base), data=str(data), out=str(root / name), block_size=4, max_steps=40, batch_rows=4,
        micro_batch_rows=2, lr=3e-3, warmup_steps=5, log_every=5, threads=1, activation_checkpointing=False,
    )
    return replace(config, **overrides)


@pytest.mark.parametrize("shift_logits,mask_adapter", [(True, False), (False, False), (True, True)])
def test_training_layout_reproduces_decoding_forwards(workspace, tmp_path, shift_logits, mask_adapter):
    """Every noisy block's hidden states (and the anchor row) equal the decoder's (commit, window) forward;
    with a mask adapter (random factors) too, under its attention rule for revealed rows."""
    root, base, data = workspace
    model_dir = init_model(base, tmp_path / "init", block_size=4, shift_logits=shift_logits)
    model, _, a2d = load_transformer(model_dir)
    if mask_adapter:
        lora_mod.attach(model, lora_mod.LoraConfig(rank=4, alpha=4.0), a2d.mask_token_id, torch.Generator().manual_seed(1), rows="mask")
        with torch.no_grad():
            for _, module in lora_mod.target_modules(model, lora_mod.TARGETS):
                module.mask_b.normal_(0, 0.5)
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    config = TrainConfig(block_size=4, batch_rows=2, shift_logits=shift_logits)
    schedule = RowSchedule(arrays, config, a2d.mask_token_id)
    row_with_two = next(r for r in range(schedule.rows) if len(set(arrays["segment_ids"][r].tolist()) - {0}) >= 2)
    schedule.row_of = lambda step, slot: row_with_two
    batch = schedule.batch(0, [0])
    L = arrays["input_ids"].shape[1]
    seg = torch.from_numpy(batch.segment_ids)
    with torch.no_grad():
        input_ids = torch.from_numpy(batch.input_ids)
        R = schedule.layout.rows
        mask = Objective(model, config, None, schedule.layout).attention_mask(input_ids, torch.from_numpy(batch.row_seg), slice(0, R), R)
        hidden, _ = model(input_ids, torch.from_numpy(batch.position_ids), mask)
        logits = model.logits(hidden[0])
    ids = batch.input_ids[0]
    checked = 0
    for s in sorted(set(batch.segment_ids[0].tolist()) - {0}):
        where = np.flatnonzero(batch.segment_ids[0] == s)
        start, end = int(where[0]), int(where[-1]) + 1
        for block_start in range(start - start % 4 + 4 if start % 4 else start, end, 4):
            if block_start - start < 1:
                continue
            for copy in (1, 2):
                window = ids[copy * L + block_start : copy * L + block_start + 4].tolist()
                forward = BlockForward(model)
                commit = ids[start:block_start].tolist()
                rows = list(range(len(commit) + 4))
                want = forward(commit, window, rows)
                got_clean = logits[block_start - 1]
                got_window = logits[copy * L + block_start : copy * L + block_start + 4]
                torch.testing.assert_close(got_clean, want[len(commit) - 1], rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(got_window, want[len(commit) :], rtol=1e-4, atol=1e-4)
                checked += 1
    assert checked >= 4
    # Each target is predicted by the row decoding would use: the anchor (clean p-1) for a block's first
    # position with the shift, the noisy row p-1 inside the block, or the noisy row p without the shift.
    for pred, target in zip(batch.pred_index, batch.targets):
        r, col = divmod(int(pred), 3 * L)
        copy, p = divmod(col, L)
        target_pos = p + 1 if shift_logits else p
        if shift_logits and copy == 0:
            assert target_pos % 4 == 0
        else:
            assert copy in (1, 2) and (target_pos // 4 == p // 4)
            assert ids[copy * L + target_pos] == a2d.mask_token_id  # only masked positions are targets
        assert ids[target_pos] == target


def test_mask_adapter_two_pass_equals_one_forward_and_its_gradients(workspace, tmp_path):
    """Objective.split_pass (the clean stream under no_grad, then the noisy copies over its keys and values)
    gives the one-forward hidden states and the same gradients of the adapter's factors."""
    from a2d_convert.objective import Objective

    root, base, data = workspace
    model_dir = init_model(base, tmp_path / "init", block_size=4, shift_logits=True)
    model, _, a2d = load_transformer(model_dir)
    lora_mod.attach(model, lora_mod.LoraConfig(rank=4, alpha=4.0), a2d.mask_token_id, torch.Generator().manual_seed(1), rows="mask")
    with torch.no_grad():
        for _, module in lora_mod.target_modules(model, lora_mod.TARGETS):
            module.mask_b.normal_(0, 0.5)
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    config = TrainConfig(block_size=4, batch_rows=2, mask_adapter=True, lora_rank=4, kl_weight=1.0)
    schedule = RowSchedule(arrays, config, a2d.mask_token_id)
    batch = schedule.batch(0, [0, 1])
    objective = Objective(model, config, None, schedule.layout)
    ids, pos, seg, row_seg = (torch.from_numpy(a) for a in (batch.input_ids, batch.position_ids, batch.segment_ids, batch.row_seg))
    factors = [p for name, p in model.named_parameters() if "mask_" in name]

    def grads(hidden):
        model.zero_grad()
        (hidden[:, seg.shape[1]:] ** 2).mean().backward()
        return [p.grad.clone() for p in factors]

    R = schedule.layout.rows
    one = model(ids, pos, objective.attention_mask(ids, row_seg, slice(0, R), R))[0]
    one_grads = grads(one)
    two = objective.split_pass(ids, pos, row_seg)
    torch.testing.assert_close(two, one, rtol=1e-5, atol=1e-5)
    for g1, g2 in zip(one_grads, grads(two)):
        torch.testing.assert_close(g2, g1, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in one_grads)


def test_complementary_masks_cover_every_target_once(workspace):
    _, _, data = workspace
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    schedule = RowSchedule(arrays, TrainConfig(block_size=4, batch_rows=2), mask_token_id=10_000)
    batch = schedule.batch(3, [0, 1])
    positions = {int(i) + 1 for i in batch.teacher_index}  # (row, position) flattened, one per target
    assert len(batch.targets) == batch.eligible == len(positions)
    again = schedule.batch(3, [0, 1])  # masks depend only on (seed, step, slot): resumable and world-size free
    assert np.array_equal(again.input_ids, batch.input_ids) and np.array_equal(again.weights, batch.weights)
    assert (batch.weights >= 1.0 / 0.8 - 1e-6).all() and (batch.weights <= 1.0 / 0.2 + 1e-6).all()


def test_the_anchor_weight_weighs_each_blocks_leftmost_masked_position(workspace):
    """--anchor-weight: a masked target whose block holds no masked position before it (the decoder's next token)
    weighs anchor_weight, every other target 1; the default leaves every weight at 1."""
    _, _, data = workspace
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    base = TrainConfig(block_size=4, batch_rows=2, loss_weighting="none", t_min=0.3, t_max=0.9, complementary=False)
    plain = RowSchedule(arrays, base, mask_token_id=10_000).batch(2, [0, 1])
    assert (plain.weights == 1.0).all()
    config = replace(base, anchor_weight=3.0)
    check_config(config)
    batch = RowSchedule(arrays, config, mask_token_id=10_000).batch(2, [0, 1])
    assert np.array_equal(batch.targets, plain.targets) and np.array_equal(batch.pred_index, plain.pred_index)
    L = arrays["input_ids"].shape[1]
    assert batch.input_ids.shape[1] == 2 * L  # the clean stream, then one noisy copy
    for w, teacher in zip(batch.weights, batch.teacher_index):
        r, p = divmod(int(teacher) + 1, L)  # the target's (row, position)
        noisy = batch.input_ids[r, L:]
        start = p // 4 * 4
        first = noisy[p] == 10_000 and not (noisy[start:p] == 10_000).any()
        assert w == (3.0 if first else 1.0), (r, p, noisy[start : start + 4])
    assert (batch.weights == 3.0).any() and (batch.weights == 1.0).any()
    with pytest.raises(A2DError, match="--anchor-weight"):
        check_config(replace(base, anchor_weight=0.0))


def test_full_pattern_masks_every_block_and_targets_every_eligible_position(workspace):
    _, _, data = workspace
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    config = TrainConfig(block_size=4, batch_rows=2, mask_pattern="full", loss_weighting="none", complementary=False)
    check_config(config)
    batch = RowSchedule(arrays, config, mask_token_id=10_000).batch(5, [0, 1])
    L = arrays["input_ids"].shape[1]
    assert batch.input_ids.shape[1] == 2 * L and (batch.input_ids[:, L:] == 10_000).all()
    assert len(batch.targets) == batch.eligible and (batch.weights == 1.0).all()
    # Block starts are read from the clean stream (the exact anchor row), the rest from the masked rows.
    from_clean = np.isin(batch.pred_index % (2 * L), np.arange(L))
    positions = batch.teacher_index % L + 1
    assert np.array_equal(from_clean, positions % 4 == 0)
    with pytest.raises(A2DError, match="--loss-weighting none --no-complementary"):
        check_config(TrainConfig(mask_pattern="full"))


def test_teacher_masks_hide_what_the_base_was_least_sure_of(workspace):
    """--mask-pattern teacher: about half the blocks (those with the base's probabilities) have their first position
    masked and, of the others, the round(t B) - 1 the base was least sure of; the rest are iid at rate t. Data without
    the probabilities is refused by name."""
    B, blocks = 4, 200
    L = B * blocks
    config = TrainConfig(block_size=B, mask_pattern="teacher", t_min=0.1, t_max=1.0, loss_weighting="none")
    check_config(config)
    confidence = np.random.default_rng(5).permutation(L).astype(np.float32) / L  # distinct: no ties
    confidence[:B] = np.nan  # a block of prompt: no probabilities, so never in teacher order
    masked, t = block_masks(config, np.random.default_rng(1), L, confidence)
    ordered = 0
    for k in range(1, blocks):
        m, c, rate = masked[k * B : (k + 1) * B], confidence[k * B : (k + 1) * B], t[k * B]
        want = np.zeros(B, dtype=bool)
        want[0] = True
        want[1 + np.argsort(c[1:])[: max(0, int(np.rint(rate * B)) - 1)]] = True
        ordered += bool((m == want).all())
    assert 0.4 * blocks <= ordered <= 0.8 * blocks  # half in teacher order, and iid blocks that happen to match
    arrays, _ = load_rows(workspace[2] / TRAIN_FILE, 4)
    with pytest.raises(A2DError, match="self-distillation"):
        RowSchedule(arrays, replace(config, batch_rows=2), mask_token_id=10_000)


def test_full_share_masks_whole_blocks_over_the_pattern():
    """--full-share P: about P of the blocks wholly masked at rate 1, the others as the pattern left them; at 0 the
    masks (and the random stream) are exactly the pattern's."""
    B, blocks = 4, 400
    L = B * blocks
    config = TrainConfig(block_size=B, mask_pattern="random", t_min=0.1, t_max=0.5)
    plain_masked, plain_t = block_masks(config, np.random.default_rng(3), L)
    masked, t = block_masks(replace(config, full_share=0.0), np.random.default_rng(3), L)
    assert (masked == plain_masked).all() and (t == plain_t).all()
    masked, t = block_masks(replace(config, full_share=0.5), np.random.default_rng(3), L)
    whole = masked.reshape(blocks, B).all(axis=1)
    rate_one = t.reshape(blocks, B)[:, 0] == 1.0
    assert 0.4 * blocks <= rate_one.sum() <= 0.6 * blocks
    assert whole[rate_one].all()
    # The other blocks are the pattern's: the same masks as without the share.
    assert (masked.reshape(blocks, B)[~rate_one] == plain_masked.reshape(blocks, B)[~rate_one]).all()
    masked, t = block_masks(replace(config, full_share=1.0), np.random.default_rng(3), L)
    assert masked.all() and (t == 1.0).all()
    with pytest.raises(A2DError, match="--full-share"):
        check_config(replace(config, full_share=1.5))


def test_the_mask_rate_curriculum_rises_to_t_max():
    config = TrainConfig(t_min=0.1, t_max=0.9, t_max_start=0.3, curriculum_steps=100, loss_weighting="none")
    check_config(config)
    assert [round(curriculum_t_max(config, s), 6) for s in (0, 50, 100, 400)] == [0.3, 0.6, 0.9, 0.9]
    assert curriculum_t_max(replace(config, curriculum_steps=0, max_steps=200), 100) == pytest.approx(0.6)
    assert curriculum_t_max(replace(config, t_max_start=-1), 0) == 0.9
    _, t = block_masks(config, np.random.default_rng(0), 400, None, curriculum_t_max(config, 0))
    assert t.min() >= 0.1 and t.max() <= 0.3
    with pytest.raises(A2DError, match="--t-max-start"):
        check_config(replace(config, t_max_start=0.95))


def test_tiny_base_trains_40_steps_and_its_loss_falls(workspace):
    root, base, data = workspace
    folder = train(tiny_config(root, base, data, "run"))
    log = [json.loads(line) for line in (root / "run" / LOG_FILE).read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(5, 45, 5))
    first, last = log[0]["ce"], np.mean([r["ce"] for r in log[-2:]])
    assert last < 0.5 * first, [r["ce"] for r in log]
    assert all(r["model_tflops"] > 0 and r["mfu"] == pytest.approx(r["model_tflops"] / 790.0) for r in log)
    weights = load_file(folder / "model.safetensors")
    init_weights = load_file(root / "run" / "init" / "model.safetensors")
    assert set(weights) == set(init_weights)
    assert not torch.equal(weights["model.layers.0.mlp.up_proj.weight"], init_weights["model.layers.0.mlp.up_proj.weight"])
    lineage = json.loads((folder / "lineage.json").read_text())
    assert [s["stage"] for s in lineage["stages"]] == ["import", "init", "train"]
    assert lineage["stages"][-1]["outputs"]["model.safetensors"]["bytes"] == (folder / "model.safetensors").stat().st_size


def test_a_window_adapter_trains_on_teacher_ordered_masks_under_the_curriculum(workspace, tmp_path):
    """The published recipe's parts together on self-distilled data: the base's answers with its probability of each
    token, teacher-ordered masks, the mask-rate curriculum, the window adapter; the loss is finite and falls."""
    root, base, _ = workspace
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count from {n} to {n + 5}."}) + "\n" for n in range(24)))
    source = Source(path=prompts, name="self", kind="distill", base=str(base), max_new_tokens=12, batch_size=12)
    data = build_data([source], base, tmp_path / "data", DataConfig(block_size=4, seq_len=96, holdout_fraction=0.25))
    assert "confidence" in load_rows(data / TRAIN_FILE)[0] and "confidence" in load_rows(data / HELDOUT_FILE)[0]
    config = tiny_config(tmp_path, base, data, "run", max_steps=12, log_every=4, lora_rank=4, window_adapter=True,
                         mask_pattern="teacher", t_min=0.1, t_max=1.0, t_max_start=0.3, loss_weighting="none", eval_every=12)
    train(config)
    log = [json.loads(line) for line in (tmp_path / "run" / LOG_FILE).read_text().splitlines()]
    steps = [r for r in log if "step" in r and "loss" in r]
    assert [r["step"] for r in steps] == [4, 8, 12] and all(np.isfinite(r["loss"]) for r in steps)
    assert np.isfinite(steps[-1]["eval_ce"])  # the held-out masks are teacher-ordered too
    assert steps[-1]["ce"] < steps[0]["ce"]


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_resume_continues_exactly(workspace, lora_rank):
    root, base, data = workspace
    name = f"straight-{lora_rank}"
    config = tiny_config(root, base, data, name, max_steps=6, save_every=3, log_every=3, lora_rank=lora_rank)
    weights = "adapter.safetensors" if lora_rank else "model.safetensors"
    straight = load_file(train(config) / weights)
    out = root / name
    shutil.rmtree(out / "checkpoints" / "step_000006")
    (out / "latest.json").write_text(json.dumps({"step": 3, "path": "checkpoints/step_000003"}))
    resumed = load_file(train(config, resume=True) / weights)
    assert set(straight) == set(resumed)
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key


def test_lora_run_trains_only_adapters_with_kl(workspace):
    root, base, data = workspace
    folder = train(tiny_config(root, base, data, "lora", max_steps=10, lora_rank=4, kl_weight=0.5, lr=1e-2))
    adapter = load_file(folder / "adapter.safetensors")
    assert "model.layers.0.self_attn.q_proj.lora_A" in adapter and "model.embed_tokens.mask_embedding" in adapter
    assert not any(k.endswith("proj.weight") for k in adapter)
    assert adapter["model.layers.1.mlp.down_proj.lora_B"].abs().sum() > 0  # B left its zero init
    log = [json.loads(line) for line in (root / "lora" / LOG_FILE).read_text().splitlines()]
    assert all(r["kl"] >= 0 for r in log)


def test_time_limit_stops_and_saves(workspace):
    root, base, data = workspace
    folder = train(tiny_config(root, base, data, "timed", max_steps=1000, log_every=1, time_limit_min=1e-5))
    log = [json.loads(line) for line in (root / "timed" / LOG_FILE).read_text().splitlines()]
    assert len(log) == 1 and log[0]["time_limit_reached"] is True
    assert folder.name == "step_000001" and (folder / "model.safetensors").is_file()


def test_certainty_term_is_the_entropy_of_rows_already_right():
    """The certainty term sums the predictive entropy over exactly the target rows whose argmax is the
    target, and its gradient flows only through those rows."""
    from a2d_convert.objective import chunked_terms

    torch.manual_seed(0)
    head = torch.nn.Linear(8, 5, bias=False)
    hidden = torch.randn(6, 8, requires_grad=True)
    argmax = head(hidden).argmax(-1).detach()
    targets = argmax.clone()
    targets[::2] = (argmax[::2] + 1) % 5  # rows 0, 2, 4 wrong; 1, 3, 5 right
    index, weights = torch.arange(6), torch.ones(6)
    _, _, _, certainty = chunked_terms(head, hidden, index, targets, weights, chunk=4, confidence=True)
    logp = torch.log_softmax(head(hidden).float(), -1)
    entropy = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(certainty, entropy[1::2].sum())
    certainty.backward()
    assert hidden.grad[::2].abs().sum() == 0 and hidden.grad[1::2].abs().sum() > 0
    _, _, _, off = chunked_terms(head, hidden, index, targets, weights, chunk=4)
    assert off.item() == 0.0


def test_compiled_loss_chunks_have_one_shape_whatever_the_row_count():
    """With a compiled terms function every chunk is padded to the chunk's rows, so row counts whose last chunk
    holds 1, 2 or 3 rows compile one graph (a last chunk of one row used to be a shape of its own: a mid-run
    compile), and the padding rows change no sum and no gradient against the eager, unpadded chunks."""
    from torch._dynamo.testing import CompileCounter

    from a2d_convert.objective import _chunk_terms, chunked_terms

    torch.manual_seed(0)
    torch._dynamo.reset()
    counter = CompileCounter()
    terms = torch.compile(_chunk_terms, backend=counter)
    head = torch.nn.Linear(8, 11, bias=False)
    teacher = torch.nn.Linear(8, 11, bias=False)
    for rows in (9, 10, 7, 4):
        hidden = torch.randn(rows + 3, 8, requires_grad=True)
        t_hidden = torch.randn(rows + 3, 8)
        index = torch.randperm(rows + 3)[:rows]
        targets = torch.randint(0, 11, (rows,))
        weights = torch.rand(rows)
        sums = []
        for fn in (None, terms):
            hidden.grad = None
            out = chunked_terms(head, hidden, index, targets, weights, t_hidden, index, teacher, chunk=4, confidence=True,
                                temperature=0.5, terms=fn)
            (out[0] + out[2] + out[3]).backward()
            sums.append((torch.stack([o.detach() for o in out]), hidden.grad.clone()))
        (eager, eager_grad), (padded, padded_grad) = sums
        torch.testing.assert_close(padded, eager, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(padded_grad, eager_grad, rtol=1e-5, atol=1e-6)
        assert eager[2] > 0 and eager[1] > 0
    assert counter.frame_count == 1


def test_run_with_every_extra_term_logs_each(workspace):
    """KL, next-token and certainty terms together: each logged per target, finite, and the run trains."""
    root, base, data = workspace
    train(tiny_config(root, base, data, "terms", max_steps=10, lora_rank=4, kl_weight=0.5, ar_weight=0.5, confidence_weight=0.3,
                      clean_kl_weight=0.5, lr=1e-2))
    log = [json.loads(line) for line in (root / "terms" / LOG_FILE).read_text().splitlines()]
    assert [r["step"] for r in log] == [5, 10]
    for r in log:
        assert all(np.isfinite(r[k]) for k in ("loss", "ce", "kl", "ar_ce", "certainty", "clean_kl"))
        assert r["kl"] >= 0 and r["ar_ce"] > 0 and r["certainty"] >= 0 and r["ce"] > 0 and r["clean_kl"] >= 0
    assert log[-1]["ce"] < log[0]["ce"]


def test_clean_kl_is_zero_while_the_adapters_are_zero(workspace):
    """The first step's forward runs with LoRA's B at zero, so the clean stream is the base itself: its KL
    to the base is 0, while the masked targets' KL (noisy rows against the base's clean prefix) is not.
    This pins the clean-KL rows to the clean stream and the base's rows to the same positions."""
    root, base, data = workspace
    train(tiny_config(root, base, data, "clean-kl", max_steps=1, log_every=1, lora_rank=4, kl_weight=1.0, clean_kl_weight=1.0))
    first = json.loads((root / "clean-kl" / LOG_FILE).read_text().splitlines()[0])
    assert abs(first["clean_kl"]) < 1e-6 and first["kl"] > 1e-2


def test_mask_adapter_changes_only_masked_rows_and_exports_unmerged(workspace, tmp_path):
    """A mask adapter trains, ships as bf16 factors beside the base's own weights, and in a decoding forward
    of the exported model every row holding a real token (committed or revealed) is exactly the base's
    causal reading while masked rows differ."""
    from a2d_convert.export import export
    from a2d_convert.model import block_causal_mask, causal_mask
    from a2d_convert.weights import read_tensors

    root, base, data = workspace
    folder = train(tiny_config(root, base, data, "mask-adapter", max_steps=10, lora_rank=4, kl_weight=0.5, lr=1e-2,
                               mask_adapter=True, lora_targets="q_proj,v_proj,down_proj"))
    adapter = load_file(folder / "adapter.safetensors")
    assert "model.layers.0.self_attn.q_proj.mask_a" in adapter and "model.layers.0.self_attn.k_proj.mask_a" not in adapter
    assert not any("norm" in k for k in adapter)
    assert adapter["model.layers.1.mlp.down_proj.mask_b"].abs().sum() > 0
    out = export(folder, tmp_path / "model")
    config = json.loads((out / "config.json").read_text())
    assert config["a2d"]["mask_adapter"] == {"rank": 4, "targets": ["q_proj", "v_proj", "down_proj"]}
    shipped, init = read_tensors(out), read_tensors(root / "mask-adapter" / "init")
    assert torch.equal(shipped["model.layers.0.self_attn.q_proj.weight"], init["model.layers.0.self_attn.q_proj.weight"])
    assert shipped["model.layers.0.self_attn.q_proj.mask_b"].dtype == torch.bfloat16

    model, _, a2d = load_transformer(out)
    plain, _, _ = load_transformer(root / "mask-adapter" / "init")
    M = a2d.mask_token_id
    commit, window = [5, 9, 11, 7, 3], [12, M, 14, M]
    C, T = len(commit), len(commit) + len(window)
    positions = torch.arange(T)[None]
    with torch.no_grad():
        adapted, _ = model(torch.tensor([commit + window]), positions, block_causal_mask(0, C, len(window), revealed=[True, False, True, False])[None])
        # The base's causal reading of the real tokens alone (the masked position 6 left out).
        keep = [0, 1, 2, 3, 4, 5, 7]
        reference, _ = plain(torch.tensor([[(commit + window)[i] for i in keep]]), positions[:, keep], causal_mask(len(keep))[None])
    torch.testing.assert_close(adapted[0, keep], reference[0], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        no_adapter, _ = plain(torch.tensor([commit + window]), positions, block_causal_mask(0, C, len(window), revealed=[True, False, True, False])[None])
    assert (adapted[0, [6, 8]] - no_adapter[0, [6, 8]]).abs().max() > 1e-4
    with pytest.raises(Exception, match="mask-adapter"):
        train(tiny_config(root, base, data, "mask-adapter-ar", max_steps=1, lora_rank=4, mask_adapter=True, ar_weight=1.0))


def test_a_write_interrupted_before_its_rename_leaves_the_old_pointer(tmp_path, monkeypatch):
    # A time box kills training while it moves latest.json on; the run must stay resumable.
    import os
    from a2d_convert.config import read_json, write_json

    pointer = tmp_path / "latest.json"
    write_json(pointer, {"step": 2, "path": "checkpoints/step_000002"})

    def killed(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        write_json(pointer, {"step": 4, "path": "checkpoints/step_000004"})
    monkeypatch.undo()
    assert read_json(pointer)["step"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["latest.json"]


@pytest.mark.parametrize("adapter", ["window", "window+clean", "mask", "lora", "full", "rule", "rule+lora"])
def test_model_flops_are_the_matrix_products_a_step_computes(workspace, tmp_path, adapter):
    """The trainer's MFU counts the projections' products as torch's FLOP counter sees a training forward and
    backward compute them (attention and the loss chunks aside), adapter factors included: a row adapter's clean
    stream forward only and without the adapter (with --clean-lora forward and backward, its LoRA on every row),
    its noisy rows forward and backward, and the factors' gradients."""
    from torch.utils.flop_counter import FlopCounterMode

    from a2d_convert.trainer import model_flops

    root, base, data = workspace
    model_dir = init_model(base, tmp_path / "init", block_size=4, shift_logits=True)
    model, _, a2d = load_transformer(model_dir)
    rank = 0 if adapter in ("full", "rule") else 8
    if rank:
        lora_mod.attach(model, lora_mod.LoraConfig(rank=rank, alpha=8.0), a2d.mask_token_id, torch.Generator().manual_seed(1),
                        rows=None if adapter in ("lora", "rule+lora") else adapter.removesuffix("+clean"))
    if adapter.startswith("rule"):
        model.attention_rule = "window"
    if adapter == "window+clean":
        lora_mod.attach(model, lora_mod.LoraConfig(rank=rank, alpha=8.0, train_norms=False, train_mask_embedding=False),
                        a2d.mask_token_id, torch.Generator().manual_seed(2), freeze=False)
    rule = {"window": {"window_adapter": True}, "window+clean": {"window_adapter": True, "clean_lora": True},
            "mask": {"mask_adapter": True}, "rule": {"window_rule": True}, "rule+lora": {"window_rule": True}}.get(adapter, {})
    arrays, _ = load_rows(data / TRAIN_FILE, 4)
    config = TrainConfig(block_size=4, batch_rows=2, lora_rank=rank, **rule)
    schedule = RowSchedule(arrays, config, a2d.mask_token_id)
    batch = schedule.batch(0, [0, 1])
    objective = Objective(model, config, None, schedule.layout)
    ids, pos, row_seg = (torch.from_numpy(a) for a in (batch.input_ids, batch.position_ids, batch.row_seg))
    R = schedule.layout.rows
    with FlopCounterMode(display=False) as counter:
        if rule:
            hidden = objective.split_pass(ids, pos, row_seg)
        else:
            hidden = model(ids, pos, objective.attention_mask(ids, row_seg, slice(0, R), R))[0]
        hidden.pow(2).mean().backward()
    counted = counter.get_flop_counts()["Global"]
    products = sum(v for op, v in counted.items() if op in (torch.ops.aten.mm, torch.ops.aten.addmm))
    assert products > 0
    assert model_flops(objective, config, 2, 0, (0, 0)) == products


def test_steps_that_fit_leave_a_log_interval_and_a_margin():
    from a2d_convert.trainer import steps_that_fit

    assert steps_that_fit(13, 0.5, 100.0, 5, 10**6) == 13 + 190 - 5  # 95 s of 0.5 s steps, less a log interval
    assert steps_that_fit(13, 0.5, 100.0, 5, 150) == 150  # the ceiling (--max-steps)
    assert steps_that_fit(13, 10.0, 20.0, 5, 10**6) == 14  # always one more
    with pytest.raises(A2DError, match="--steps-from-time sizes the schedule to --time-limit-min"):
        check_config(TrainConfig(base="b", data="d", out="o", steps_from_time=True))


def test_steps_from_time_size_the_schedule_and_a_resume_keeps_it(workspace):
    """--steps-from-time: a step is timed after the first ones, the schedule (LR decay, stop) becomes what the time
    limit holds, train_config.json and the checkpoints record it, and a resumed run keeps it instead of sizing again."""
    root, base, data = workspace
    config = tiny_config(root, base, data, "sized", max_steps=100000, log_every=1, save_every=0, time_limit_min=0.1,
                         steps_from_time=True)
    folder = train(config)
    sized = json.loads((root / "sized" / "train_config.json").read_text())["max_steps"]
    assert 14 <= sized < 100000
    log = [json.loads(line) for line in (root / "sized" / LOG_FILE).read_text().splitlines()]
    assert log[-1]["step"] == sized or log[-1]["time_limit_reached"]
    record = json.loads((folder / "checkpoint.json").read_text())
    assert record["progress"]["max_steps"] == sized and record["config"]["max_steps"] == sized
    if log[-1]["step"] == sized:  # the schedule ran out: the LR is at its floor
        assert log[-1]["lr"] == pytest.approx(config.lr * config.min_lr_ratio, rel=1e-2)
    # A resume with another time limit keeps the size (and, its schedule done, stops at once).
    train(replace(config, time_limit_min=10.0), resume=True)
    assert json.loads((root / "sized" / "train_config.json").read_text())["max_steps"] == sized
