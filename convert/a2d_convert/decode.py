"""The block-diffusion decode loop: docs/decoding.md, implemented once.

`decode` drives any `ForwardFn` (the PyTorch reference model with its KV cache, or a fake logits
function in tests) over a window of `block_size` masked positions. Each denoising step picks a token
and a confidence for every candidate position (greedy or temperature/top-p sampling, in float64), then
reveals every candidate above `threshold` and at least `k` of them (the `min_per_step` floor and the
linear top-k `steps` schedule), by priority (confidence; a random draw with `remasking: random`; the
leftmost first with `remasking: leftmost`). Every committed token is one the denoiser's own prediction
at a masked position chose: nothing is accepted because a causal reading agrees with it.
With `advance: block` the window is a block that moves on once wholly revealed; with `advance: slide`
it moves past every revealed prefix after each step, so that it always holds `block_size` positions
(multi-block decoding in its simplest form: the next block starts before the current one is finished).
This is confidence-thresholded parallel decoding (Fast-dLLM, Wu et al. 2025, sec. 3.3) on top of
block diffusion with a KV cache of committed tokens (Arriola et al. 2025, BD3-LM).

Sums are sequential in increasing id order (numpy cumsum, not the pairwise np.sum), so that a plain
C++ loop computes the same doubles.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Generator, Sequence

import numpy as np

from .decoding import DecodeParams
from .errors import A2DError
from .rng import SplitMix64

# (commit_ids, window_ids, rows) -> fp32 logits [len(rows), vocab]; rows index commit ++ window. The
# function owns the KV cache: after the call it holds the commit tokens too (the window is scratch). The
# window rows sit at consecutive positions after the commit rows and attend by the block rule
# (model.block_causal_mask).
ForwardFn = Callable[..., Any]


@dataclass
class DecodeResult:
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    forward_passes: int
    ms: float
    trace: list[dict] | None = None
    steps: int = 0  # denoising steps (forwards that revealed tokens; commit-only forwards are not steps)
    revealed: int = 0  # tokens the steps revealed, those an EOS then cut off included
    topped_up: int = 0  # of them, revealed by the min_per_step / schedule floor rather than by the threshold

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_forward(self) -> float:
        return self.completion_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def parallel_share(self) -> float:
        """Share of the revealed tokens beyond one per step: what a one-token-per-step decoder would not
        have revealed in that step."""
        return (self.revealed - self.steps) / self.revealed if self.revealed else 0.0


def choose_token(row: np.ndarray, mask_token_id: int, temperature: float, top_p: float, rng: SplitMix64) -> tuple[int, float]:
    """Step 1 of a denoising step for one candidate: (token, confidence) from its fp32 logits row."""
    logits = np.array(row, dtype=np.float64)  # always a copy: the greedy path works in place
    logits[mask_token_id] = -np.inf
    top = logits.max()
    if temperature == 0:
        token = int(np.argmax(logits))  # first maximum: the lowest id on ties
        np.subtract(logits, top, out=logits)  # in place: the same doubles as exp(logits - top), fewer big allocations
        np.exp(logits, out=logits)
        return token, float(1.0 / np.cumsum(logits)[-1])
    weights = np.exp((logits - top) / temperature)
    p = weights / np.cumsum(weights)[-1]
    kept = np.arange(p.size)
    if top_p < 1:
        order = np.lexsort((kept, -p))  # p descending, then lower id first
        reached = np.cumsum(p[order]) >= top_p
        n = int(np.argmax(reached)) + 1 if reached.any() else p.size
        kept = np.sort(order[:n])
    running = np.cumsum(p[kept])
    kept_sum = running[-1]
    r = rng.uniform() * kept_sum
    above = running > r
    index = int(np.argmax(above)) if above.any() else kept.size - 1
    token = int(kept[index])
    return token, float(p[token] / kept_sum)


def reveal_set(confidences: Sequence[float], priorities: Sequence[float], threshold: float, k: int) -> list[int]:
    """Step 3: indices (into the candidate list) to reveal: all above threshold, topped up to k by priority."""
    chosen = [i for i, c in enumerate(confidences) if c > threshold]
    if len(chosen) < k:
        rest = sorted((i for i in range(len(confidences)) if i not in chosen), key=lambda i: (-priorities[i], i))
        chosen += rest[: k - len(chosen)]
    return sorted(chosen)


def prefix_set(confidences: Sequence[float], candidates: Sequence[int], threshold: float, k: int) -> list[int]:
    """Step 3 with `reveal_order: prefix`: indices (into the candidate list) of the first k candidates from the
    left, then of each next one while it is adjacent to the one before it and above the threshold."""
    picked = []
    for c in range(len(candidates)):
        if c >= k and not (candidates[c] == candidates[c - 1] + 1 and confidences[c] > threshold):
            break
        picked.append(c)
    return picked


def decode_steps(
    prompt_ids: Sequence[int],
    params: DecodeParams,
    *,
    mask_token_id: int,
    shift_logits: bool,
    anchor_in_window: bool = False,
    trace: bool = False,
) -> Generator[tuple[list[int], list[int], list[int]], Any, DecodeResult]:
    """The decode loop of one sequence as a generator: it yields each forward it needs as (commit_ids,
    window_ids, rows), is sent that forward's logits rows back, and returns the DecodeResult (ms 0: the
    driver times it). `decode` drives one with a ForwardFn; `decode_batch` drives many in lockstep through
    one batched forward, so both run exactly this code.

    `anchor_in_window` (a window adapter's layout, docs/decoding.md): the window is the anchor, the last
    finished token, followed by the block's positions; the anchor enters the cache with the next move, and
    window position j is predicted from window row j (the anchor predicts position 0)."""
    if anchor_in_window and not shift_logits:
        raise A2DError("the anchor-in-window layout predicts each position from the row before it: it needs shift_logits")
    params.validate()
    if not prompt_ids:
        raise A2DError("the prompt is empty; it must hold at least one token")
    B, eos, slide = params.block_size, set(params.eos_token_ids), params.advance == "slide"
    rng = SplitMix64(params.seed)
    steps_log: list[dict] | None = [] if trace else None
    completion: list[int] = []
    forwards = 0
    finish = "length"
    pending = list(prompt_ids)  # tokens to commit with the next forward
    anchor: np.ndarray | None = None  # logits row of the last committed token (shift_logits)
    anchor_token = pending.pop() if anchor_in_window else None  # the window's first row (anchor_in_window)
    window = [mask_token_id] * B
    revealed = [False] * B
    step = 0  # denoising steps since the window last moved
    counts = {"steps": 0, "revealed": 0, "topped_up": 0}

    while len(completion) < params.max_tokens:
        limit_len = min(B, params.max_tokens - len(completion))
        limit_eos = next((j for j in range(B) if revealed[j] and window[j] in eos), B)
        relevant = min(limit_len, limit_eos)
        candidates = [j for j in range(relevant) if not revealed[j]]
        if candidates:
            if params.commit == "separate" and pending:
                answer = yield (list(pending), [], [] if anchor_in_window else [len(pending) - 1])
                if not anchor_in_window:
                    anchor = _to_numpy(answer)[0]
                forwards += 1
                pending = []
            C = len(pending)
            if anchor_in_window:
                window_rows = {j: C + j for j in candidates}
                rows = [C + j for j in candidates]
                window_ids = [anchor_token] + list(window)
            else:
                window_rows = {j: C + j - 1 if shift_logits else C + j for j in candidates if not (shift_logits and j == 0)}
                rows = ([C - 1] if shift_logits and C else []) + sorted(set(window_rows.values()))
                window_ids = list(window)
            logits = _to_numpy((yield (list(pending), window_ids, rows)))
            row_of = {r: logits[i] for i, r in enumerate(rows)}
            if shift_logits and C and not anchor_in_window:
                anchor = row_of[C - 1]
            pending = []
            forwards += 1

            choices = [
                choose_token(anchor if j not in window_rows else row_of[window_rows[j]], mask_token_id, params.temperature, params.top_p, rng)
                for j in candidates
            ]
            confidences = [c for _, c in choices]
            if params.remasking == "low_confidence":
                priorities = confidences
            elif params.remasking == "leftmost":
                priorities = [float(len(candidates) - c) for c in range(len(candidates))]
            else:
                priorities = [rng.uniform() for _ in candidates]
            k_steps = 0 if params.steps == 0 else math.ceil(len(candidates) / max(params.steps - step, 1))
            k = min(len(candidates), max(params.min_per_step, k_steps))
            if params.reveal_order == "prefix":
                picked = prefix_set(confidences, candidates, params.threshold, k)
            else:
                picked = reveal_set(confidences, priorities, params.threshold, k)
            counts["steps"] += 1
            counts["revealed"] += len(picked)
            counts["topped_up"] += max(0, k - sum(c > params.threshold for c in confidences))
            for i in picked:
                window[candidates[i]], revealed[candidates[i]] = choices[i][0], True
            if steps_log is not None:
                steps_log.append({
                    "forward": forwards - 1,
                    "block_start": len(prompt_ids) + len(completion),
                    "step": step,
                    "candidates": candidates,
                    "revealed": [[candidates[i], choices[i][0], confidences[i]] for i in picked],
                })
            step += 1
            limit_eos = next((j for j in range(B) if revealed[j] and window[j] in eos), B)
            relevant = min(limit_len, limit_eos)

        # The revealed prefix is final: all of the window's relevant positions once no candidate is left
        # (both policies), or with `advance: slide` whatever revealed run starts the window.
        done = next((j for j in range(relevant) if not revealed[j]), relevant)
        if done == relevant:
            completion += window[:relevant]
            if limit_eos < limit_len:
                finish = "stop"
                break
            pending = window[:relevant]
            if anchor_in_window:  # the last finished token opens the next window; the old anchor is committed
                pending, anchor_token = [anchor_token] + pending[:-1], pending[-1]
            window, revealed, step = [mask_token_id] * B, [False] * B, 0
        elif slide and done > 0:
            completion += window[:done]
            pending = window[:done]
            if anchor_in_window:
                pending, anchor_token = [anchor_token] + pending[:-1], pending[-1]
            window, revealed, step = window[done:] + [mask_token_id] * done, revealed[done:] + [False] * done, 0
    return DecodeResult(token_ids=completion, finish_reason=finish, prompt_tokens=len(prompt_ids), forward_passes=forwards,
                        ms=0.0, trace=steps_log, **counts)


def _drive(steps: Generator, forward: ForwardFn) -> DecodeResult:
    try:
        request = next(steps)
        while True:
            request = steps.send(forward(*request))
    except StopIteration as done:
        return done.value


def decode(
    forward: ForwardFn,
    prompt_ids: Sequence[int],
    params: DecodeParams,
    *,
    mask_token_id: int,
    shift_logits: bool,
    anchor_in_window: bool = False,
    trace: bool = False,
) -> DecodeResult:
    """Generate a completion for `prompt_ids` (docs/decoding.md); `forward` starts with an empty cache."""
    started = time.perf_counter()
    steps = decode_steps(prompt_ids, params, mask_token_id=mask_token_id, shift_logits=shift_logits,
                         anchor_in_window=anchor_in_window, trace=trace)
    result = _drive(steps, forward)
    result.ms = (time.perf_counter() - started) * 1000.0
    return result


# (requests) -> logits per request; requests[i] is sequence i's (commit_ids, window_ids, rows), or None
# once that sequence is finished. Each sequence has its own KV cache inside the function.
BatchForwardFn = Callable[[Sequence[Any]], Sequence[Any]]


def run_batch(forward: BatchForwardFn, machines: list[Generator], threads: int = 1) -> list[Any]:
    """Drive generators of forward requests (decode_steps, or any loop written the same way) in lockstep:
    every forward of the batch serves each unfinished sequence's next request. Returns their results in
    order. A sequence's results do not depend on the others: each request is answered from its own cache.
    `threads` > 1 advances the sequences on a thread pool (numpy's float64 work releases the GIL); each
    generator still runs on one thread at a time, so the results are the same."""
    results: list[Any] = [None] * len(machines)
    requests: list[Any] = [None] * len(machines)
    for i, machine in enumerate(machines):
        try:
            requests[i] = next(machine)
        except StopIteration as done:
            results[i] = done.value
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        while any(r is not None for r in requests):
            answers = forward(requests)

            def advance(i: int) -> tuple[int, Any, Any]:
                try:
                    return i, machines[i].send(answers[i]), None
                except StopIteration as done:
                    return i, None, done.value

            active = [i for i, r in enumerate(requests) if r is not None]
            for i, request, result in (pool.map(advance, active) if pool else map(advance, active)):
                requests[i] = request
                if request is None:
                    results[i] = result
    finally:
        if pool is not None:
            pool.shutdown()
    return results


def decode_batch(
    forward: BatchForwardFn,
    prompts: Sequence[Sequence[int]],
    params: Sequence[DecodeParams],
    *,
    mask_token_id: int,
    shift_logits: bool,
    anchor_in_window: bool = False,
    trace: bool = False,
    threads: int = 1,
) -> list[DecodeResult]:
    """`decode` of every (prompt, params) pair at once through a batched forward (model.BatchBlockForward):
    the same decisions as decoding them one by one, in far fewer forward calls. Each result's ms is the
    whole batch's wall time."""
    if len(prompts) != len(params):
        raise A2DError(f"decode_batch: {len(prompts)} prompts but {len(params)} parameter sets")
    started = time.perf_counter()
    machines = [
        decode_steps(ids, p, mask_token_id=mask_token_id, shift_logits=shift_logits, anchor_in_window=anchor_in_window, trace=trace)
        for ids, p in zip(prompts, params)
    ]
    results = run_batch(forward, machines, threads)
    ms = (time.perf_counter() - started) * 1000.0
    for result in results:
        result.ms = ms
    return results


def _to_numpy(logits) -> np.ndarray:
    if hasattr(logits, "detach"):
        logits = logits.detach().to("cpu").float().numpy()
    return np.asarray(logits, dtype=np.float32)
