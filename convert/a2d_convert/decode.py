"""The block-diffusion decode loop: docs/decoding.md, implemented once.

`decode` drives any `ForwardFn` (the PyTorch reference model with its KV cache, or a fake logits
function in tests) through blocks of `block_size` masked positions. Each denoising step picks a token
and a confidence for every candidate position (greedy or temperature/top-p sampling, in float64), then
reveals every candidate above `threshold` and at least `k` of them (the `min_per_step` floor and the
linear top-k `steps` schedule), by priority (confidence; a random draw with `remasking: random`; the
leftmost first with `remasking: leftmost`).
This is confidence-thresholded parallel decoding (Fast-dLLM, Wu et al. 2025, sec. 3.3) on top of
block diffusion with a KV cache of committed blocks (Arriola et al. 2025, BD3-LM).

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

from .config import COMMIT, REMASKING, DecodingDefaults
from .errors import A2DError
from .rng import MASK64, SplitMix64

# (commit_ids, window_ids, rows[, layout]) -> fp32 logits [len(rows), vocab]; rows index commit ++ window.
# The function owns the KV cache: after the call it holds the commit tokens too (the window is scratch).
# Without a layout the window rows sit at consecutive positions after the commit rows and attend by the
# block rule (model.block_causal_mask); with one (remasking "tree"), as the layout says.
ForwardFn = Callable[..., Any]


@dataclass(frozen=True)
class WindowLayout:
    """Where each window row sits and what it sees (docs/decoding.md, "Tree"): window row i is at position
    cached + C + offsets[i] and attends to every cached and commit position and to the window rows j whose
    bit j is set in visible[i]."""

    offsets: tuple[int, ...]
    visible: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class DecodeParams(DecodingDefaults):
    """Every parameter of docs/decoding.md "Parameters": the ones a model sets defaults for (inherited)
    and the per-request ones; nothing is left to model defaults here."""

    max_tokens: int
    block_size: int = 4
    seed: int = 0
    eos_token_ids: tuple[int, ...] = ()

    @staticmethod
    def from_defaults(defaults: DecodingDefaults, *, block_size: int, max_tokens: int, eos_token_ids: Sequence[int], **overrides) -> "DecodeParams":
        """The model's `a2d` defaults, with request overrides (None means: keep the default)."""
        fields = {name: getattr(defaults, name) for name in DecodingDefaults.__dataclass_fields__}
        fields.update(block_size=block_size, max_tokens=max_tokens, eos_token_ids=tuple(eos_token_ids))
        fields.update({k: (tuple(v) if k == "eos_token_ids" else v) for k, v in overrides.items() if v is not None})
        return DecodeParams(**fields)

    def validate(self, where: str = "decode parameters") -> "DecodeParams":
        """Range checks of docs/decoding.md "Parameters"; raises A2DError naming `where` and the field."""

        def integer(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def number(value) -> bool:
            return (integer(value) or isinstance(value, float)) and math.isfinite(value)

        checks = [
            ("max_tokens", integer(self.max_tokens) and self.max_tokens >= 0, ">= 0"),
            ("block_size", integer(self.block_size) and 1 <= self.block_size <= 64, "in 1..64"),
            ("threshold", number(self.threshold) and 0 <= self.threshold <= 1, "in [0, 1]"),
            ("min_per_step", integer(self.min_per_step) and 1 <= self.min_per_step <= self.block_size, f"in 1..block_size ({self.block_size})"),
            ("steps", integer(self.steps) and 0 <= self.steps <= self.block_size, f"in 0..block_size ({self.block_size})"),
            ("temperature", number(self.temperature) and 0 <= self.temperature <= 2, "in [0, 2]"),
            ("top_p", number(self.top_p) and 0 < self.top_p <= 1, "in (0, 1]"),
            ("remasking", self.remasking in REMASKING, f"one of {', '.join(REMASKING)}"),
            ("commit", self.commit in COMMIT, f"one of {', '.join(COMMIT)}"),
            ("tree_width", integer(self.tree_width) and 1 <= self.tree_width <= 8, "in 1..8"),
            ("lookup_ngram", integer(self.lookup_ngram) and 0 <= self.lookup_ngram <= 8, "in 0..8"),
            ("tree_width", self.remasking != "tree" or tree_window_rows(self.block_size, self.tree_width + (self.lookup_ngram > 0)) <= 64,
             f"small enough for a window of at most 64 rows at block size {self.block_size} "
             f"(W branches, tree_width plus one with lookup_ngram, need W(B-1) + B(W(B-1) + 1) rows; docs/decoding.md, \"Tree\")"),
            ("seed", integer(self.seed) and 0 <= self.seed <= MASK64, "in 0..2^64-1"),
            ("eos_token_ids", all(integer(t) and t >= 0 for t in self.eos_token_ids), "a list of token ids"),
        ]
        for name, ok, wanted in checks:
            if not ok:
                raise A2DError(f"{where}: {name} is {getattr(self, name)!r}, it must be {wanted}")
        return self


@dataclass
class DecodeResult:
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    forward_passes: int
    ms: float
    trace: list[dict] | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_forward(self) -> float:
        return self.completion_tokens / self.forward_passes if self.forward_passes else 0.0


def _result(completion: list[int], finish: str, prompt_ids: Sequence[int], forwards: int, trace: list[dict] | None) -> DecodeResult:
    """A decoder's result (ms stays 0: the callers that time a decode fill it in)."""
    return DecodeResult(token_ids=completion, finish_reason=finish, prompt_tokens=len(prompt_ids),
                        forward_passes=forwards, ms=0.0, trace=trace)


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


def decode_steps(
    prompt_ids: Sequence[int],
    params: DecodeParams,
    *,
    mask_token_id: int,
    shift_logits: bool,
    trace: bool = False,
) -> Generator[tuple[list[int], list[int], list[int]], Any, DecodeResult]:
    """The decode loop of one sequence as a generator: it yields each forward it needs as (commit_ids,
    window_ids, rows), is sent that forward's logits rows back, and returns the DecodeResult (ms 0: the
    driver times it). `decode` drives one with a ForwardFn; `decode_batch` drives many in lockstep through
    one batched forward, so both run exactly this code."""
    params.validate()
    if not prompt_ids:
        raise A2DError("the prompt is empty; it must hold at least one token")
    if params.remasking == "verify":
        return (yield from _verify_steps(prompt_ids, params, mask_token_id=mask_token_id, shift_logits=shift_logits, trace=trace))
    if params.remasking == "tree":
        return (yield from _tree_steps(prompt_ids, params, mask_token_id=mask_token_id, shift_logits=shift_logits, trace=trace))
    B, eos = params.block_size, set(params.eos_token_ids)
    rng = SplitMix64(params.seed)
    steps_log: list[dict] | None = [] if trace else None
    completion: list[int] = []
    forwards = 0
    finish = "length"
    pending = list(prompt_ids)  # tokens to commit with the next forward
    anchor: np.ndarray | None = None  # logits row of the last committed token (shift_logits)

    while len(completion) < params.max_tokens:
        limit_len = min(B, params.max_tokens - len(completion))
        block = [mask_token_id] * B
        revealed = [False] * B
        block_start = len(prompt_ids) + len(completion)
        if params.commit == "separate" and pending:
            anchor = _to_numpy((yield (list(pending), [], [len(pending) - 1])))[0]
            forwards += 1
            pending = []
        step = 0
        while True:
            limit_eos = next((j for j in range(B) if revealed[j] and block[j] in eos), B)
            relevant = min(limit_len, limit_eos)
            candidates = [j for j in range(relevant) if not revealed[j]]
            if not candidates:
                break
            C = len(pending)
            window_rows = {j: C + j - 1 if shift_logits else C + j for j in candidates if not (shift_logits and j == 0)}
            rows = ([C - 1] if shift_logits and C else []) + sorted(set(window_rows.values()))
            logits = _to_numpy((yield (list(pending), list(block), rows)))
            row_of = {r: logits[i] for i, r in enumerate(rows)}
            if shift_logits and C:
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
            picked = reveal_set(confidences, priorities, params.threshold, k)
            for i in picked:
                block[candidates[i]], revealed[candidates[i]] = choices[i][0], True
            if steps_log is not None:
                steps_log.append({
                    "forward": forwards - 1,
                    "block_start": block_start,
                    "step": step,
                    "candidates": candidates,
                    "revealed": [[candidates[i], choices[i][0], confidences[i]] for i in picked],
                })
            step += 1

        completion += block[:relevant]
        if limit_eos < limit_len:
            finish = "stop"
            break
        pending = block
    return _result(completion, finish, prompt_ids, forwards, steps_log)


def _verify_steps(
    prompt_ids: Sequence[int],
    params: DecodeParams,
    *,
    mask_token_id: int,
    shift_logits: bool,
    trace: bool,
) -> Generator[tuple[list[int], list[int], list[int]], Any, DecodeResult]:
    """`remasking: verify` (docs/decoding.md, "Verify"). The window follows the confirmed tokens: the
    drafts of the last forward (at most B-1), then a block of B masks. Each forward reads the positions in
    order from the rows of confirmed or draft tokens (with a mask adapter: the base's exact reading), keeps
    every draft that reading chooses too, replaces the first one it does not with its own choice, and
    drops the drafts after it. When every draft held, the reading of the first masked position is kept as
    well, and the masked rows after it draft the next B-1 positions (greedy, while confidence > threshold).
    With `lookup_ngram`, the context's own continuation (lookup_branch) drafts instead where the masks made
    no drafts (after a mismatch) or guessed the same first token."""
    _check_confirming(params, shift_logits)
    B, eos = params.block_size, set(params.eos_token_ids)
    rng = SplitMix64(params.seed)
    steps_log: list[dict] | None = [] if trace else None
    completion: list[int] = []
    drafts: list[int] = []
    pending = list(prompt_ids)
    forwards = 0
    finish = "length"

    while len(completion) < params.max_tokens:
        left = params.max_tokens - len(completion)
        drafts = drafts[: left - 1]
        C, D = len(pending), len(drafts)
        wanted = min(D + B, left)  # window positions read: the chain 0..D, then the drafts D+1..wanted-1
        rows = [C - 1 + i for i in range(wanted)]
        logits = _to_numpy((yield (list(pending), drafts + [mask_token_id] * B, rows)))
        forwards += 1

        chain = [choose_token(logits[i], mask_token_id, params.temperature, params.top_p, rng) for i in range(D + 1)]
        confirmed: list[list] = []
        stop = False
        for i, (token, confidence) in enumerate(chain):
            if token in eos:
                stop = True
                break
            confirmed.append([i, token, confidence])
            if i == D or token != drafts[i]:
                break
        new_drafts: list[list] = []
        if not stop and len(confirmed) == D + 1:
            for i in range(len(confirmed), wanted):
                token, confidence = choose_token(logits[i], mask_token_id, 0.0, 1.0, rng)
                if confidence <= params.threshold:
                    break
                new_drafts.append([i - len(confirmed), token, confidence])
                if token in eos:
                    break
        if params.lookup_ngram and not stop:
            found = lookup_branch([*prompt_ids, *completion, *(t for _, t, _ in confirmed)], params.lookup_ngram, B - 1, eos)
            if found and (not new_drafts or found[0] == new_drafts[0][1]):
                new_drafts = [[i, token, 0.0] for i, token in enumerate(found)]
        if steps_log is not None:
            steps_log.append({
                "forward": forwards - 1,
                "block_start": len(prompt_ids) + len(completion),
                "step": 0,
                "candidates": list(range(wanted)),
                "revealed": confirmed,
                "drafts": new_drafts,
            })
        completion += [token for _, token, _ in confirmed]
        pending = [token for _, token, _ in confirmed]
        drafts = [token for _, token, _ in new_drafts]
        if stop:
            finish = "stop"
            break
    return _result(completion, finish, prompt_ids, forwards, steps_log)


def _check_confirming(params: DecodeParams, shift_logits: bool) -> None:
    """What verify and tree need: a token's row reads the next position, and commits ride the next window."""
    if not shift_logits:
        raise A2DError(f"remasking {params.remasking!r} needs a model with shift_logits (the row of a token predicts the next position)")
    if params.commit != "fused":
        raise A2DError(f"remasking {params.remasking!r} commits the confirmed tokens in the next window's forward; use commit 'fused'")


def top_tokens(row: np.ndarray, mask_token_id: int, k: int) -> list[tuple[int, float]]:
    """The k greedy choices of a logits row: (token, confidence) by confidence descending, ties to the lower
    id; the first is choose_token's at temperature 0, with the same confidence."""
    logits = np.array(row, dtype=np.float64)
    logits[mask_token_id] = -np.inf
    order = np.lexsort((np.arange(logits.size), -logits))[:k]
    top = logits[order[0]]
    total = np.cumsum(np.exp(logits - top))[-1]
    return [(int(t), float(np.exp(logits[t] - top) / total)) for t in order]


def tree_window_rows(block: int, width: int) -> int:
    """Rows of the largest tree window: width x (block-1) nodes, and a group of `block` masks for the root
    and for each node."""
    nodes = width * (block - 1)
    return nodes + block * (nodes + 1)


def tree_window(branches: Sequence[Sequence[int]], block: int, mask_token_id: int) -> tuple[list[int], WindowLayout, list[int], list[int]]:
    """The window of one tree forward (docs/decoding.md, "Tree"): (window ids, layout, each node's parent
    node or -1, each group's first window row). Nodes come branch after branch (a branch's prefix that an
    earlier branch holds is not repeated), then one group of `block` masks for the root and for every
    node, in that order."""
    ids: list[int] = []
    offsets: list[int] = []
    visible: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    for branch in branches:
        parent = -1
        for depth, token in enumerate(branch, start=1):
            shared = next((n for n in range(len(parents)) if parents[n] == parent and ids[n] == token), None)
            if shared is not None:  # a prefix another branch already holds: one node for both
                parent = shared
                continue
            row = len(ids)
            ids.append(token)
            offsets.append(depth - 1)
            visible.append((visible[parent] if parent >= 0 else 0) | (1 << row))
            parents.append(parent)
            depths.append(depth)
            parent = row
    group_rows: list[int] = []
    for owner in [-1, *range(len(parents))]:
        first = len(ids)
        group_rows.append(first)
        seen = (visible[owner] if owner >= 0 else 0) | (((1 << block) - 1) << first)
        start = depths[owner] if owner >= 0 else 0
        ids += [mask_token_id] * block
        offsets += range(start, start + block)
        visible += [seen] * block
    return ids, WindowLayout(tuple(offsets), tuple(visible)), parents, group_rows


def lookup_branch(context: Sequence[int], ngram: int, depth: int, eos: set[int]) -> list[int]:
    """A draft branch from the context itself (docs/decoding.md, "Tree"): for n = ngram down to 1, the
    latest earlier occurrence of the context's last n tokens that has a token after it; the (at most
    `depth`) tokens after it, cut after an EOS. Empty when no n matches."""
    size = len(context)
    for n in range(min(ngram, size - 1), 0, -1):
        key = list(context[size - n:])
        for start in range(size - n - 1, -1, -1):
            if list(context[start:start + n]) == key:
                found = list(context[start + n:start + n + depth])
                cut = next((i for i, t in enumerate(found) if t in eos), None)
                return found if cut is None else found[: cut + 1]
    return []


def _tree_steps(
    prompt_ids: Sequence[int],
    params: DecodeParams,
    *,
    mask_token_id: int,
    shift_logits: bool,
    trace: bool,
) -> Generator[tuple[list[int], list[int], list[int], WindowLayout], Any, DecodeResult]:
    """`remasking: tree` (docs/decoding.md, "Tree"): verify with `tree_width` guesses for the first
    position and a group of masks after every draft, so that every forward ends with drafts."""
    _check_confirming(params, shift_logits)
    B, W, eos = params.block_size, params.tree_width, set(params.eos_token_ids)
    rng = SplitMix64(params.seed)
    steps_log: list[dict] | None = [] if trace else None
    completion: list[int] = []
    branches: list[list[int]] = []
    pending = list(prompt_ids)
    forwards = 0
    finish = "length"

    while len(completion) < params.max_tokens:
        left = params.max_tokens - len(completion)
        branches = [b[: left - 1] for b in branches if left > 1 and b]
        window, layout, parents, group_rows = tree_window(branches, B, mask_token_id)
        C, N = len(pending), len(parents)
        reading_rows = [C - 1] + [C + n for n in range(N)]
        guess_rows = [C + first + j for first in group_rows for j in range(B - 1)]
        logits = _to_numpy((yield (list(pending), window, reading_rows + guess_rows, layout)))
        forwards += 1

        readings = [choose_token(logits[i], mask_token_id, params.temperature, params.top_p, rng) for i in range(N + 1)]
        confirmed: list[list] = []
        stop = False
        current = -1  # the root
        while True:
            token, confidence = readings[current + 1]
            if token in eos:
                stop = True
                break
            confirmed.append([len(confirmed), token, confidence])
            child = next((n for n in range(N) if parents[n] == current and window[n] == token), None)
            if child is None:
                break
            current = child
        new_branches: list[list[list]] = []
        if not stop:
            base = N + 1 + (current + 1) * (B - 1)  # the current node's group: its guesses' logits rows
            chain: list[list] = []
            for j in range(1, B - 1):
                token, confidence = choose_token(logits[base + j], mask_token_id, 0.0, 1.0, rng)
                if confidence <= params.threshold:
                    break
                chain.append([j + 1, token, confidence])
                if token in eos:
                    break
            firsts = [t for t in top_tokens(logits[base], mask_token_id, W) if t[1] > params.threshold] if B > 1 else []
            for b, (token, confidence) in enumerate(firsts):
                new_branches.append([[b, 1, token, confidence]] + ([] if token in eos else [[b, *c] for c in chain]))
            if params.lookup_ngram:
                found = lookup_branch([*prompt_ids, *completion, *(t for _, t, _ in confirmed)], params.lookup_ngram, B - 1, eos)
                if found:
                    new_branches.append([[len(new_branches), d, token, 0.0] for d, token in enumerate(found, start=1)])
        if steps_log is not None:
            steps_log.append({
                "forward": forwards - 1,
                "block_start": len(prompt_ids) + len(completion),
                "step": 0,
                "candidates": list(range(N + 1)),
                "revealed": confirmed,
                "drafts": [d for branch in new_branches for d in branch],
            })
        completion += [token for _, token, _ in confirmed]
        pending = [token for _, token, _ in confirmed]
        branches = [[token for _, _, token, _ in branch] for branch in new_branches]
        if stop:
            finish = "stop"
            break
    return _result(completion, finish, prompt_ids, forwards, steps_log)


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
    trace: bool = False,
) -> DecodeResult:
    """Generate a completion for `prompt_ids` (docs/decoding.md); `forward` starts with an empty cache."""
    started = time.perf_counter()
    result = _drive(decode_steps(prompt_ids, params, mask_token_id=mask_token_id, shift_logits=shift_logits, trace=trace), forward)
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
        decode_steps(ids, p, mask_token_id=mask_token_id, shift_logits=shift_logits, trace=trace) for ids, p in zip(prompts, params)
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
