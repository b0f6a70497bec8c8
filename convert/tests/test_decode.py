"""The decode loop (docs/decoding.md): hand-checkable reveal rules on scripted logits, then a real model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from a2d_convert.decode import DecodeParams, choose_token, decode, lookup_branch, tree_window
from a2d_convert.errors import A2DError
from a2d_convert.model import BlockForward, load_transformer
from a2d_convert.rng import SplitMix64

V, MASK = 8, 7


def test_splitmix64_reference_values():
    rng = SplitMix64(0)
    assert [rng.next_u64() for _ in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    top = SplitMix64(2**64 - 1)
    assert top.next_u64() == 0xE4D971771B652C20  # the state wraps mod 2^64
    u = SplitMix64(0).uniform()
    assert u == (0xE220A8397B1DCDAF >> 11) / 2**53 and 0 <= u < 1
    for bad in (-1, 2**64, 1.5, True):
        with pytest.raises(A2DError):
            SplitMix64(bad)


class Scripted:
    """A ForwardFn whose logits row for the token at absolute position p is table[p] (log-probabilities).

    It tracks the cache length like the real model, so a decoder that asks for the wrong row (anchor,
    shift) or commits the wrong tokens gets the wrong table entry.
    """

    def __init__(self, table: dict[int, list[float]], shift: bool = True) -> None:
        self.table, self.shift, self.cached, self.calls = table, shift, [], []

    def __call__(self, commit, window, rows):
        self.calls.append((list(commit), list(window), list(rows)))
        start = len(self.cached)
        self.cached += list(commit)
        out = []
        for r in rows:
            predicted = start + r + (1 if self.shift else 0)
            probs = self.table.get(predicted, [1.0] * V)
            out.append([math.log(x) if x > 0 else -np.inf for x in probs])
        return np.array(out, dtype=np.float32)


def peaked(token: int, confidence: float) -> list[float]:
    """Probabilities with `token` at `confidence` and the rest spread evenly over the other non-mask ids."""
    rest = (1 - confidence) / (V - 2)
    return [confidence if i == token else (0.0 if i == MASK else rest) for i in range(V)]


PROMPT = [1, 2, 3]


def run(table, shift=True, **kw):
    params = DecodeParams(**{"max_tokens": 4, "block_size": 4, "eos_token_ids": (6,), **kw})
    fn = Scripted(table, shift)
    return decode(fn, PROMPT, params, mask_token_id=MASK, shift_logits=shift, trace=True), fn


def reveals(result):
    return [[(j, tok) for j, tok, _ in step["revealed"]] for step in result.trace]


BLOCK0 = {3: peaked(1, 0.95), 4: peaked(2, 0.5), 5: peaked(3, 0.92), 6: peaked(4, 0.3)}


@pytest.mark.parametrize("shift", [True, False])
def test_threshold_then_one_by_confidence(shift):
    result, fn = run(BLOCK0, shift)
    assert reveals(result) == [[(0, 1), (2, 3)], [(1, 2)], [(3, 4)]]
    assert [s["candidates"] for s in result.trace] == [[0, 1, 2, 3], [1, 3], [3]]
    assert result.token_ids == [1, 2, 3, 4] and result.finish_reason == "length"
    assert result.forward_passes == 3 and [s["forward"] for s in result.trace] == [0, 1, 2]
    assert fn.calls[0][:2] == (PROMPT, [MASK] * 4) and fn.calls[1][:2] == ([], [1, MASK, 3, MASK])
    assert result.trace[0]["revealed"][0][2] == pytest.approx(0.95, abs=1e-6)


def test_min_per_step_and_the_steps_schedule():
    result, _ = run(BLOCK0, min_per_step=2)
    assert reveals(result) == [[(0, 1), (2, 3)], [(1, 2), (3, 4)]]
    # threshold 1 never passes: the linear schedule alone, ceil(4/2) then ceil(2/1).
    result, _ = run(BLOCK0, threshold=1.0, steps=2)
    assert reveals(result) == [[(0, 1), (2, 3)], [(1, 2), (3, 4)]]
    # steps=3: ceil(4/3)=2, ceil(2/2)=1, ceil(1/1)=1.
    result, _ = run(BLOCK0, threshold=1.0, steps=3)
    assert reveals(result) == [[(0, 1), (2, 3)], [(1, 2)], [(3, 4)]]


def test_threshold_is_strict_and_ties_go_to_the_lower_position():
    certain = {p: [0.0] * t + [1.0] + [0.0] * (V - t - 1) for p, t in zip(range(3, 7), (1, 2, 3, 4))}
    result, _ = run(certain, threshold=1.0)  # confidence exactly 1.0 does not pass threshold 1.0
    assert reveals(result) == [[(0, 1)], [(1, 2)], [(2, 3)], [(3, 4)]]
    result, _ = run(certain, threshold=0.999)
    assert reveals(result) == [[(0, 1), (1, 2), (2, 3), (3, 4)]]


def test_random_remasking_ranks_by_draws():
    result, _ = run(BLOCK0, threshold=1.0, remasking="random", seed=42)
    rng = SplitMix64(42)
    draws = [rng.uniform() for _ in range(4)]
    first = max(range(4), key=lambda j: (draws[j], -j))
    assert reveals(result)[0] == [(first, [1, 2, 3, 4][first])]
    # Draws continue from the same generator: the second step ranks the 3 remaining candidates.
    remaining = [j for j in range(4) if j != first]
    second_draws = [rng.uniform() for _ in remaining]
    second = remaining[max(range(3), key=lambda i: (second_draws[i], -i))]
    assert reveals(result)[1] == [(second, [1, 2, 3, 4][second])]


def test_leftmost_remasking_tops_up_from_the_left():
    # Position 2 passes the threshold; the top-up to two takes position 0 (leftmost), not 1 or 3.
    table = {3: peaked(1, 0.5), 4: peaked(2, 0.6), 5: peaked(3, 0.95), 6: peaked(4, 0.7)}
    result, _ = run(table, remasking="leftmost", min_per_step=2)
    assert reveals(result)[0] == [(0, 1), (2, 3)]
    # With low-confidence remasking the same step tops up with position 3 (0.7), the most confident.
    result, _ = run(table, remasking="low_confidence", min_per_step=2)
    assert reveals(result)[0] == [(2, 3), (3, 4)]


def test_eos_ends_the_block_and_the_generation():
    table = {**BLOCK0, 5: peaked(6, 0.97)}  # EOS (6) revealed at j=2 in the first step
    result, _ = run(table, max_tokens=12)
    assert reveals(result) == [[(0, 1), (2, 6)], [(1, 2)]]
    assert [s["candidates"] for s in result.trace] == [[0, 1, 2, 3], [1]]  # j=3 is past the EOS
    assert result.token_ids == [1, 2] and result.finish_reason == "stop" and result.forward_passes == 2


def test_max_tokens_cuts_the_last_block_and_zero_runs_nothing():
    table = {p: peaked(p % 5, 0.99) for p in range(3, 20)}
    result, fn = run(table, max_tokens=6)
    assert result.token_ids == [3, 4, 0, 1, 2, 3] and result.finish_reason == "length"
    assert [s["candidates"] for s in result.trace] == [[0, 1, 2, 3], [0, 1]]
    assert fn.calls[1][:2] == ([3, 4, 0, 1], [MASK] * 4)  # fused: commit block 0 with block 1's first step
    separate, fn = run(table, max_tokens=6, commit="separate")
    assert separate.token_ids == result.token_ids and separate.forward_passes == 4
    assert [c[:2] for c in fn.calls] == [(PROMPT, []), ([], [MASK] * 4), ([3, 4, 0, 1], []), ([], [MASK] * 4)]
    nothing, fn = run(table, max_tokens=0)
    assert nothing.token_ids == [] and nothing.forward_passes == 0 and fn.calls == []


def test_top_p_keeps_the_nucleus_and_samples_by_id():
    row = np.array([math.log(p) if p else -np.inf for p in (0.05, 0.5, 0.0, 0.3, 0.15, 0.0, 0.0, 0.0)], dtype=np.float32)
    for seed in range(20):
        u = SplitMix64(seed).uniform()
        token, conf = choose_token(row, MASK, 1.0, 0.7, SplitMix64(seed))
        # kept = {1: 0.5, 3: 0.3} (0.5 + 0.3 >= 0.7), walked in id order against r = u * 0.8
        expected = 1 if u * 0.8 < 0.5 else 3
        assert token == expected and conf == pytest.approx({1: 0.625, 3: 0.375}[token], abs=1e-6)
    # Temperature sharpens: at T = 0.5, p ~ p^2, so the top token's share is 0.25 / (0.0025+0.25+0.09+0.0225).
    _, conf = choose_token(row, MASK, 0.5, 1.0, SplitMix64(1))
    assert conf in (pytest.approx(0.25 / 0.365, abs=1e-6), pytest.approx(0.09 / 0.365, abs=1e-6),
                    pytest.approx(0.0225 / 0.365, abs=1e-6), pytest.approx(0.0025 / 0.365, abs=1e-6))
    # The mask token is never chosen, even when it has the largest logit.
    masked_top = np.zeros(V, dtype=np.float32)
    masked_top[MASK] = 50
    assert choose_token(masked_top, MASK, 0.0, 1.0, SplitMix64(0))[0] == 0


def test_bad_parameters_are_rejected():
    for bad in ({"min_per_step": 5}, {"steps": 5}, {"threshold": 1.5}, {"top_p": 0}, {"remasking": "x"}, {"seed": -1}, {"max_tokens": -1}):
        with pytest.raises(A2DError):
            run(BLOCK0, **bad)
    with pytest.raises(A2DError, match="empty"):
        decode(Scripted({}), [], DecodeParams(max_tokens=1), mask_token_id=MASK, shift_logits=True)


def real_decode(model, a2d, prompt, **kw):
    params = DecodeParams(**{"max_tokens": 20, "block_size": a2d.block_size, "eos_token_ids": (), **kw})
    return decode(BlockForward(model), prompt, params, mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits, trace=True)


PROMPT_IDS = [1, 299, 272, 201, 57, 74, 271, 274, 264, 290, 2, 201, 1, 67, 85]


def test_real_model_fused_equals_separate_and_is_deterministic(llama_model):
    model, _, a2d = load_transformer(llama_model)
    fused = real_decode(model, a2d, PROMPT_IDS)
    separate = real_decode(model, a2d, PROMPT_IDS, commit="separate")
    assert fused.token_ids == separate.token_ids and len(fused.token_ids) == 20
    blocks = 5
    assert separate.forward_passes == fused.forward_passes + blocks  # prompt commit + 4 block commits
    # Same decisions; confidences agree to fp32 rounding (the two policies batch rows differently).
    assert [[r[:2] for r in s["revealed"]] for s in fused.trace] == [[r[:2] for r in s["revealed"]] for s in separate.trace]
    confidences = lambda result: [r[2] for s in result.trace for r in s["revealed"]]  # noqa: E731
    assert np.allclose(confidences(fused), confidences(separate), rtol=0, atol=1e-5)
    assert len(set(fused.token_ids)) > 3  # random weights still give varied output
    assert real_decode(model, a2d, PROMPT_IDS).token_ids == fused.token_ids
    assert real_decode(model, a2d, PROMPT_IDS, seed=99).token_ids == fused.token_ids  # no draws at T = 0
    assert fused.ms > 0 and fused.tokens_per_forward == 20 / fused.forward_passes


def test_real_model_sampling_follows_the_seed(llama_model):
    model, _, a2d = load_transformer(llama_model)
    a = real_decode(model, a2d, PROMPT_IDS, temperature=1.0, top_p=0.95, seed=1234)
    b = real_decode(model, a2d, PROMPT_IDS, temperature=1.0, top_p=0.95, seed=1234)
    c = real_decode(model, a2d, PROMPT_IDS, temperature=1.0, top_p=0.95, seed=1235)
    assert a.token_ids == b.token_ids and a.trace == b.trace
    assert a.token_ids != c.token_ids


def test_real_model_stops_at_eos(llama_model):
    model, _, a2d = load_transformer(llama_model)
    greedy = real_decode(model, a2d, PROMPT_IDS)
    eos = greedy.token_ids[6]
    stopped = real_decode(model, a2d, PROMPT_IDS, eos_token_ids=(eos,))
    assert stopped.finish_reason == "stop" and eos not in stopped.token_ids
    assert len(stopped.token_ids) < 20
    last = stopped.trace[-1]
    assert eos in [t for s in stopped.trace if s["block_start"] == last["block_start"] for _, t, _ in s["revealed"]]


class Successor:
    """A ForwardFn with a known exact reading: the row of a real token t predicts succ(t) = t % 5 + 1 at 0.9
    (ids 1..5 only, so the greedy stream from any token is 1 2 3 4 5 1 ...), and the row of a mask predicts
    the next position from `drafts` (absolute position -> (token, confidence)). It tracks the cache and
    reads the window's tokens, so a decoder that puts a token at the wrong place reads the wrong row."""

    def __init__(self, drafts: dict[int, tuple[int, float]]) -> None:
        self.drafts, self.cached, self.calls = drafts, [], []

    def __call__(self, commit, window, rows):
        self.calls.append((list(commit), list(window), list(rows)))
        start = len(self.cached)
        self.cached += list(commit)
        tokens = self.cached + list(window)
        out = []
        for r in rows:
            token = tokens[start + r]
            probs = peaked(token % 5 + 1, 0.9) if token != MASK else peaked(*self.drafts.get(start + r + 1, (1, 0.3)))
            out.append([math.log(x) if x > 0 else -np.inf for x in probs])
        return np.array(out, dtype=np.float32)


def verify_run(drafts, **kw):
    params = DecodeParams(**{"max_tokens": 8, "block_size": 4, "threshold": 0.5, "remasking": "verify", "eos_token_ids": (6,), **kw})
    fn = Successor(drafts)
    return decode(fn, PROMPT, params, mask_token_id=MASK, shift_logits=True, trace=True), fn


def test_verify_keeps_matching_drafts_and_corrects_the_first_wrong_one():
    # The exact stream after the prompt 1 2 3 (positions 0-2) is 4 5 1 2 3 4 5 1 (positions 3-10).
    result, fn = verify_run({4: (5, 0.9), 5: (1, 0.8), 6: (3, 0.9), 8: (4, 0.9), 9: (5, 0.4), 10: (1, 0.9)})
    assert result.token_ids == [4, 5, 1, 2, 3, 4, 5, 1] and result.finish_reason == "length"
    M = MASK
    assert fn.calls == [
        ([1, 2, 3], [M, M, M, M], [2, 3, 4, 5]),  # position 3 read exactly; 4-6 drafted (5 1 3)
        ([4], [5, 1, 3, M, M, M, M], [0, 1, 2, 3, 4, 5, 6]),  # 5 and 1 hold, 3 is wrong: 2 replaces it, no drafts
        ([5, 1, 2], [M, M, M, M], [2, 3, 4, 5]),  # 3 read; draft 4, then 5 is below the threshold
        ([3], [4, M, M, M, M], [0, 1, 2]),  # 4 holds, 5 read at the mask; draft 1 (past max_tokens: dropped)
        ([4, 5], [M, M, M, M], [1]),  # one token left: no drafts, the reading only
    ]
    assert [[(j, t) for j, t, _ in s["revealed"]] for s in result.trace] == [
        [(0, 4)], [(0, 5), (1, 1), (2, 2)], [(0, 3)], [(0, 4), (1, 5)], [(0, 1)],
    ]
    assert [[(j, t) for j, t, _ in s["drafts"]] for s in result.trace] == [[(0, 5), (1, 1), (2, 3)], [], [(0, 4)], [(0, 1)], []]
    assert [s["block_start"] for s in result.trace] == [3, 4, 7, 8, 10]
    assert result.forward_passes == 5 and result.tokens_per_forward == 8 / 5


def test_verify_output_does_not_depend_on_the_drafts():
    exact = [(p + 3) % 5 + 1 for p in range(20)]  # positions 3.. : 4 5 1 2 3 ...
    no_drafts, _ = verify_run({}, max_tokens=12)
    all_right, _ = verify_run({p + 3: (exact[p], 0.99) for p in range(20)}, max_tokens=12)
    all_wrong, _ = verify_run({p + 3: (exact[p] % 5 + 1, 0.99) for p in range(20)}, max_tokens=12)
    for result in (no_drafts, all_right, all_wrong):
        assert result.token_ids == exact[:12]
    assert no_drafts.forward_passes == all_wrong.forward_passes == 12  # one token per forward
    assert all_right.forward_passes < 12 and all_right.tokens_per_forward == 12 / all_right.forward_passes


def test_verify_stops_at_an_eos_reading_and_checks_its_parameters():
    result, _ = verify_run({}, max_tokens=8, eos_token_ids=(1,))
    assert result.token_ids == [4, 5] and result.finish_reason == "stop"
    with pytest.raises(A2DError, match="shift_logits"):
        decode(Successor({}), PROMPT, DecodeParams(max_tokens=4, remasking="verify"), mask_token_id=MASK, shift_logits=False)
    with pytest.raises(A2DError, match="fused"):
        decode(Successor({}), PROMPT, DecodeParams(max_tokens=4, remasking="verify", commit="separate"), mask_token_id=MASK, shift_logits=True)


def test_verify_on_a_mask_adapter_model_is_its_greedy_causal_stream(tiny_models, tmp_path):
    """With a mask adapter, the chain rows are the plain causal reading, so verify returns exactly what
    block size 1 (one token per forward from the committed rows) returns, in fewer forwards when drafts hold."""
    import shutil

    from a2d_convert.tiny import add_random_mask_adapter

    model_dir = tmp_path / "adapter"
    shutil.copytree(tiny_models("llama")[1], model_dir)
    add_random_mask_adapter(model_dir, rank=4, seed=3)
    model, _, a2d = load_transformer(model_dir)
    assert a2d.mask_rank == 4
    causal = real_decode(model, a2d, PROMPT_IDS, block_size=1, max_tokens=24)
    for threshold in (0.0, 0.5):
        verified = real_decode(model, a2d, PROMPT_IDS, remasking="verify", threshold=threshold, max_tokens=24)
        assert verified.token_ids == causal.token_ids
        assert verified.forward_passes <= causal.forward_passes


def test_a_config_whose_default_is_verify_needs_shifted_logits_and_fused_commits(llama_model, tmp_path):
    import json
    import shutil

    from a2d_convert.config import load_config

    for change, wanted in (({"shift_logits": False}, "shift_logits true"), ({"commit": "separate"}, "commit 'fused'")):
        folder = tmp_path / next(iter(change))
        shutil.copytree(llama_model, folder)
        config = json.loads((folder / "config.json").read_text())
        config["a2d"]["decoding"].update(remasking="verify", **({"commit": "separate"} if "commit" in change else {}))
        config["a2d"].update({k: v for k, v in change.items() if k != "commit"})
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(A2DError, match=wanted):
            load_config(folder)


def spread(probs: dict[int, float]) -> list[float]:
    """Probabilities with the given tokens at theirs and the rest spread evenly over the other non-mask ids."""
    rest = (1 - sum(probs.values())) / (V - 1 - len(probs))
    return [probs.get(i, 0.0 if i == MASK else rest) for i in range(V)]


class TreeSuccessor:
    """Successor for tree windows: a real token's row predicts succ(t) at 0.9; a mask row at absolute
    position q predicts q+1 from `guesses` (position -> {token: probability}). Rows sit where the layout
    puts them, so a guess read from the wrong group comes from the wrong position."""

    def __init__(self, guesses: dict[int, dict[int, float]]) -> None:
        self.guesses, self.cached, self.calls = guesses, [], []

    def __call__(self, commit, window, rows, layout=None):
        self.calls.append((list(commit), list(window), list(rows), layout))
        start = len(self.cached)
        self.cached += list(commit)
        C = len(commit)
        offsets = layout.offsets if layout is not None else range(len(window))
        position = [start + r for r in range(C)] + [start + C + o for o in offsets]
        tokens = list(commit) + list(window)
        out = []
        for r in rows:
            token = tokens[r]
            probs = peaked(token % 5 + 1, 0.9) if token != MASK else spread(self.guesses.get(position[r] + 1, {1: 0.1}))
            out.append([math.log(x) if x > 0 else -np.inf for x in probs])
        return np.array(out, dtype=np.float32)


def tree_run(guesses, **kw):
    params = DecodeParams(**{"max_tokens": 8, "block_size": 3, "threshold": 0.2, "remasking": "tree", "tree_width": 2, "eos_token_ids": (6,), **kw})
    fn = TreeSuccessor(guesses)
    return decode(fn, PROMPT, params, mask_token_id=MASK, shift_logits=True, trace=True), fn


def test_tree_walks_the_branch_the_reading_chooses_and_drafts_from_the_group_where_it_stops():
    # The exact stream after the prompt 1 2 3 (positions 0-2) is 4 5 1 2 3 4 5 1 (positions 3-10).
    result, fn = tree_run({4: {5: 0.6, 2: 0.3}, 5: {1: 0.7}, 7: {3: 0.8}, 8: {5: 0.9}, 9: {5: 0.9}, 10: {1: 0.9}})
    assert result.token_ids == [4, 5, 1, 2, 3, 4, 5, 1] and result.finish_reason == "length"
    M = MASK
    (c1, w1, r1, l1), (c2, w2, r2, l2), (c3, w3, r3, l3), (c4, w4, r4, l4) = fn.calls
    # 1: no drafts: the root's group only; position 3 read exactly (4), positions 4 and 5 guessed.
    assert (c1, w1, r1) == ([1, 2, 3], [M, M, M], [2, 3, 4]) and l1.offsets == (0, 1, 2) and l1.visible == (7, 7, 7)
    # 2: branches 5 1 and 2 1, then the groups of the root, 5, 1, 2 and 1. The reading takes 5, then 1,
    # then reads 2 after the branch's end.
    assert (c2, w2) == ([4], [5, 1, 2, 1] + [M] * 15)
    assert l2.offsets == (0, 1, 0, 1, 0, 1, 2, 1, 2, 3, 2, 3, 4, 1, 2, 3, 2, 3, 4)
    assert l2.visible == (1, 3, 4, 12) + (7 << 4,) * 3 + (1 | 7 << 7,) * 3 + (3 | 7 << 10,) * 3 + (4 | 7 << 13,) * 3 + (12 | 7 << 16,) * 3
    assert r2 == [0, 1, 2, 3, 4, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18]
    # 3: the group after the second 1 (positions 6-8) guessed 3 5 for positions 7-8: 3 holds, 5 does not.
    assert (c3, w3, r3) == ([5, 1, 2], [3, 5] + [M] * 9, [2, 3, 4, 5, 6, 8, 9, 11, 12])
    # 4: the group after 3 guessed 5 1 for positions 9-10; one token left after 5, so the branch is cut to 5.
    assert (c4, w4, r4) == ([3, 4], [5] + [M] * 6, [1, 2, 3, 4, 6, 7])
    assert [[(j, t) for j, t, _ in s["revealed"]] for s in result.trace] == [[(0, 4)], [(0, 5), (1, 1), (2, 2)], [(0, 3), (1, 4)], [(0, 5), (1, 1)]]
    assert [[tuple(d[:3]) for d in s["drafts"]] for s in result.trace] == [
        [(0, 1, 5), (0, 2, 1), (1, 1, 2), (1, 2, 1)], [(0, 1, 3), (0, 2, 5)], [(0, 1, 5), (0, 2, 1)], [],
    ]
    assert [s["block_start"] for s in result.trace] == [3, 4, 7, 9]
    assert result.forward_passes == 4


def test_tree_output_does_not_depend_on_the_guesses():
    exact = [(p + 3) % 5 + 1 for p in range(24)]  # positions 3.. : 4 5 1 2 3 ...
    runs = {
        "none": tree_run({}, max_tokens=12)[0],
        "right": tree_run({p + 3: {exact[p]: 0.99} for p in range(24)}, max_tokens=12)[0],
        "second": tree_run({p + 3: {exact[p] % 5 + 1: 0.5, exact[p]: 0.4} for p in range(24)}, max_tokens=12)[0],
        "wrong": tree_run({p + 3: {exact[p] % 5 + 1: 0.99} for p in range(24)}, max_tokens=12)[0],
    }
    for result in runs.values():
        assert result.token_ids == exact[:12]
    assert runs["none"].forward_passes == runs["wrong"].forward_passes == 12
    # Right guesses confirm a whole branch and the reading after it: 3 tokens a forward after the first.
    assert runs["right"].forward_passes == 5
    # The second guess for the first position is the right one and holds; the chain after it does not.
    assert runs["second"].forward_passes < 12


def test_tree_lookup_drafts_what_followed_the_context_s_last_match():
    # The exact stream 4 5 1 2 3 4 5 1 2 3 4 5 repeats itself. Forward 3 confirms 1 (position 5): the group
    # guesses 2 5 for positions 6-7, and the prompt's 1 was followed by 2 3, so the window of forward 4
    # holds the branches 2 5 and 2 3 as one node 2 with the children 5 and 3.
    result, fn = tree_run({6: {2: 0.9}, 7: {5: 0.9}}, max_tokens=12, tree_width=1, lookup_ngram=2)
    assert result.token_ids == [4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    M = MASK
    assert [c[0] for c in fn.calls] == [[1, 2, 3], [4], [5], [1], [2, 3, 4], [5, 1, 2]]
    commit, window, rows, layout = fn.calls[3]
    assert window == [2, 5, 3] + [M] * 12
    assert layout.offsets == (0, 1, 1, 0, 1, 2, 1, 2, 3, 2, 3, 4, 2, 3, 4)
    assert layout.visible == (1, 3, 5) + (7 << 3,) * 3 + (1 | 7 << 6,) * 3 + (3 | 7 << 9,) * 3 + (5 | 7 << 12,) * 3
    assert [tuple(d) for d in result.trace[2]["drafts"]] == [(0, 1, 2, pytest.approx(0.9)), (0, 2, 5, pytest.approx(0.9)), (1, 1, 2, 0.0), (1, 2, 3, 0.0)]
    # After it, the lookup alone drafts 5 1, then 3 4 (cut to the two tokens left).
    assert [fn.calls[i][1][:2] for i in (4, 5)] == [[5, 1], [3, 4]]
    assert [len(s["revealed"]) for s in result.trace] == [1, 1, 1, 3, 3, 3]
    assert tree_run({6: {2: 0.9}, 7: {5: 0.9}}, max_tokens=12, tree_width=1)[0].forward_passes == 11


def test_verify_lookup_drafts_after_a_mismatch_and_where_the_masks_agree():
    # The same stream in verify: forward 3's masks guess 2 5 and the context's 1 was followed by 2 3, the
    # same first token, so 2 3 is drafted; forward 4's masks guess nothing and the context drafts 5 1.
    fn = TreeSuccessor({6: {2: 0.9}, 7: {5: 0.9}})
    params = DecodeParams(max_tokens=12, block_size=3, threshold=0.2, remasking="verify", lookup_ngram=2, eos_token_ids=(6,))
    result = decode(fn, PROMPT, params, mask_token_id=MASK, shift_logits=True, trace=True)
    assert result.token_ids == [4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    assert [c[0] for c in fn.calls] == [[1, 2, 3], [4], [5], [1], [2, 3, 4], [5, 1, 2]]
    assert [c[1] for c in fn.calls[3:5]] == [[2, 3] + [MASK] * 3, [5, 1] + [MASK] * 3]
    assert [tuple(d) for d in result.trace[2]["drafts"]] == [(0, 2, 0.0), (1, 3, 0.0)]
    without = decode(TreeSuccessor({6: {2: 0.9}, 7: {5: 0.9}}), PROMPT, DecodeParams(**{**params.__dict__, "lookup_ngram": 0}),
                     mask_token_id=MASK, shift_logits=True)
    assert without.token_ids == result.token_ids and without.forward_passes == 11


def test_lookup_branch_takes_the_longest_latest_match_and_stops_after_an_eos():
    assert lookup_branch([1, 2, 3, 9, 2, 3, 8, 7, 2, 3], 3, 4, set()) == [8, 7, 2, 3]  # "2 3": the latest, at 4
    assert lookup_branch([5, 2, 3, 1, 4, 3, 6, 2, 3], 3, 2, set()) == [1, 4]  # "2 3" beats the later "3"
    assert lookup_branch([1, 2, 6, 5, 1, 2], 2, 4, {6}) == [6]
    assert lookup_branch([1, 2, 3], 3, 4, set()) == []
    assert lookup_branch([4], 3, 4, set()) == []


def test_tree_window_shares_the_prefixes_of_branches():
    ids, layout, parents, groups = tree_window([[5, 1], [5, 2], [6]], 2, 9)
    assert ids[:4] == [5, 1, 2, 6] and parents == [-1, 0, 0, -1]
    assert layout.offsets[:4] == (0, 1, 1, 0) and layout.visible[:4] == (1, 3, 5, 8)
    assert groups == [4, 6, 8, 10, 12]


def test_tree_stops_at_an_eos_and_checks_its_parameters():
    result, _ = tree_run({}, max_tokens=8, eos_token_ids=(1,))
    assert result.token_ids == [4, 5] and result.finish_reason == "stop"
    with pytest.raises(A2DError, match="shift_logits"):
        decode(TreeSuccessor({}), PROMPT, DecodeParams(max_tokens=4, remasking="tree"), mask_token_id=MASK, shift_logits=False)
    with pytest.raises(A2DError, match="fused"):
        decode(TreeSuccessor({}), PROMPT, DecodeParams(max_tokens=4, remasking="tree", commit="separate"), mask_token_id=MASK, shift_logits=True)
    with pytest.raises(A2DError, match="tree_width"):
        DecodeParams(max_tokens=4, remasking="tree", tree_width=9).validate()
    with pytest.raises(A2DError, match="64 rows"):
        DecodeParams(max_tokens=4, block_size=8, remasking="tree", tree_width=1).validate()
    DecodeParams(max_tokens=4, block_size=4, remasking="tree", tree_width=4).validate()  # 12 + 4 x 13 = 64 rows
    DecodeParams(max_tokens=4, block_size=4, remasking="tree", tree_width=3, lookup_ngram=2).validate()  # 4 branches
    with pytest.raises(A2DError, match="lookup_ngram"):
        DecodeParams(max_tokens=4, block_size=4, remasking="tree", tree_width=4, lookup_ngram=2).validate()
    with pytest.raises(A2DError, match="lookup_ngram is 9"):
        DecodeParams(max_tokens=4, remasking="tree", lookup_ngram=9).validate()


def test_tree_on_a_mask_adapter_model_is_its_greedy_causal_stream(tiny_models, tmp_path):
    """As verify: every confirmed token is a reading of real tokens only, so the stream is the causal one."""
    import shutil

    from a2d_convert.tiny import add_random_mask_adapter

    model_dir = tmp_path / "adapter"
    shutil.copytree(tiny_models("llama")[1], model_dir)
    add_random_mask_adapter(model_dir, rank=4, seed=3)
    model, _, a2d = load_transformer(model_dir)
    causal = real_decode(model, a2d, PROMPT_IDS, block_size=1, max_tokens=24)
    for width in (1, 3):
        tree = real_decode(model, a2d, PROMPT_IDS, remasking="tree", tree_width=width, threshold=0.0, max_tokens=24)
        assert tree.token_ids == causal.token_ids
        assert tree.forward_passes <= causal.forward_passes
