"""The decode loop (docs/decoding.md): hand-checkable reveal rules on scripted logits, then a real model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from a2d_convert.decode import choose_token, decode, prefix_set
from a2d_convert.decoding import DecodeParams
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


SLIDE = {3: peaked(1, 0.95), 4: peaked(2, 0.5), 5: peaked(3, 0.92), 6: peaked(4, 0.3), 7: peaked(5, 0.95), 8: peaked(1, 0.4)}


def test_slide_moves_the_window_past_every_revealed_prefix():
    result, fn = run(SLIDE, max_tokens=6, advance="slide", threshold=0.9)
    # Forward 0 reveals positions 3 and 5; 3 starts the window, so it is committed and the window moves
    # on by one (to 4..7, position 5 still revealed). Forward 1 reveals 7, forward 2 tops up 4 (from the
    # kept anchor: nothing was committed), which makes 4, 5 a revealed prefix; and so on.
    assert reveals(result) == [[(0, 1), (2, 3)], [(3, 5)], [(0, 2)], [(2, 1)], [(0, 4)]]
    assert [s["block_start"] for s in result.trace] == [3, 4, 4, 6, 6]
    assert [s["step"] for s in result.trace] == [0, 0, 1, 0, 1]
    assert [s["candidates"] for s in result.trace] == [[0, 1, 2, 3], [0, 2, 3], [0, 2], [0, 2], [0]]  # 6 tokens: j 3 of the last is past them
    assert result.token_ids == [1, 2, 3, 4, 5, 1] and result.finish_reason == "length" and result.forward_passes == 5
    # Six reveals in five steps, three of them by the one-per-step floor (nothing passed the threshold).
    assert (result.steps, result.revealed, result.topped_up) == (5, 6, 3) and result.parallel_share == pytest.approx(1 / 6)
    assert [c[:2] for c in fn.calls] == [
        (PROMPT, [MASK] * 4), ([1], [MASK, 3, MASK, MASK]), ([], [MASK, 3, MASK, 5]), ([2, 3], [MASK, 5, MASK, MASK]), ([], [MASK, 5, 1, MASK]),
    ]
    block, _ = run(SLIDE, max_tokens=6, threshold=0.9)  # the same table a block at a time
    assert block.forward_passes == 5 and block.token_ids == [1, 2, 3, 4, 5, 1]


def test_slide_stops_at_an_eos_once_everything_before_it_is_revealed():
    table = {**SLIDE, 5: peaked(6, 0.97)}  # EOS (6) revealed at position 5 in the first step
    result, _ = run(table, max_tokens=12, advance="slide", threshold=0.9)
    assert reveals(result) == [[(0, 1), (2, 6)], [(0, 2)]]
    assert [s["candidates"] for s in result.trace] == [[0, 1, 2, 3], [0]]  # after the move: j 0 only, the EOS at j 1
    assert result.token_ids == [1, 2] and result.finish_reason == "stop" and result.forward_passes == 2


def test_slide_with_separate_commits_gives_the_same_tokens():
    fused, _ = run(SLIDE, max_tokens=6, advance="slide", threshold=0.9)
    separate, fn = run(SLIDE, max_tokens=6, advance="slide", threshold=0.9, commit="separate")
    assert separate.token_ids == fused.token_ids and reveals(separate) == reveals(fused)
    assert separate.forward_passes == fused.forward_passes + 3  # the prompt, then [1] and [2, 3] alone
    assert [c[:2] for c in fn.calls if not c[1]] == [(PROMPT, []), ([1], []), ([2, 3], [])]


def test_real_model_slide_is_deterministic_and_takes_no_more_forwards_than_blocks(llama_model):
    model, _, a2d = load_transformer(llama_model)
    for threshold in (0.0, 0.05, 1.0):
        slide = real_decode(model, a2d, PROMPT_IDS, advance="slide", threshold=threshold)
        again = real_decode(model, a2d, PROMPT_IDS, advance="slide", threshold=threshold)
        assert slide.token_ids == again.token_ids and len(slide.token_ids) == 20
        if threshold == 0.0:  # every candidate passes: each forward reveals the whole window
            assert slide.forward_passes == 20 // a2d.block_size
        if threshold == 1.0:  # one token per forward, the most confident first
            assert slide.forward_passes == 20


def test_prefix_set_reveals_the_run_from_the_left():
    # engine/tests/reveal_test.cpp's case: position 1 below the threshold, a gap before position 5.
    candidates, confidences = [0, 1, 2, 3, 5], [0.3, 0.4, 0.9, 0.8, 0.9]
    assert prefix_set(confidences, candidates, 0.5, 1) == [0]
    assert prefix_set(confidences, candidates, 0.5, 2) == [0, 1, 2, 3]
    assert prefix_set([0.9] * 5, candidates, 0.5, 1) == [0, 1, 2, 3]
