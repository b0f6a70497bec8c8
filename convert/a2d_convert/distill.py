"""Self-distillation's generation: the AR base answers prompts, greedily with a2d's own reference
Transformer over a static KV cache, its decode steps replayed from CUDA graphs (`greedy_static`), sampled
with transformers' `generate`, in one process or in one process per GPU (`data --source ...,kind=distill,workers=N`).

Batches are planned once, before any work is shared out: prompts sorted by token length (stable) and
cut into `batch_size` rows (and, with `batch_slots`, no more KV cache slots than that), once for the main
response of every prompt (greedy at temperature 0, or transformers' sampling seeded per batch as before)
and once more for each of `samples` sampled responses. A batch's rows, and so its results, do not depend
on how many processes run: each process takes every N-th batch of a seeded shuffle of the plan (the shuffle makes a time-limited run answer a
random subset of batches, not the shortest prompts) and writes its answers per batch; the parent
merges them by prompt index, so the output is in prompt order whatever the split.

Sampled responses draw their randomness per response, not per batch: response k of prompt i reads the
SplitMix64 stream seeded with `sample_seed(seed, i, k)`, one uniform per generated token, and picks
that token by inverse CDF over the top-p nucleus of softmax(logits / sample_temperature) (`SeededSampler`,
a logits processor that leaves one finite score, so `generate` runs greedy). A response is therefore the
same whatever batch, process or GPU count produced it, up to the logits' own floating-point noise.

With A2D_DISTILL_GRAPHS=0 in the environment the greedy decode steps are launched one by one instead of replayed
from CUDA graphs (the recipe's retry after a failed distillation).

`time_limit_s` bounds a run: a process starts no batch that it expects (from its slowest batch so far)
to end past the limit, counted from when the distillation began; what was not answered is left out and
counted in the data manifest.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter
from typing import Any, Iterator, Sequence

from .errors import A2DError
from .rng import MASK64, SplitMix64, uniforms

SEEDING = (
    "sampled response k of prompt i: SplitMix64 seeded with sample_seed(seed, i, k), one uniform per new token; "
    "token by inverse CDF over the top-p nucleus of softmax(logits / sample_temperature) (a2d_convert.distill)"
)


def sample_seed(seed: int, index: int, sample: int) -> int:
    """The SplitMix64 seed of prompt `index`'s sampled response `sample` (1-based)."""
    mixed = ((seed & MASK64) * 0x100000001B3) & MASK64
    return SplitMix64(mixed ^ ((index & ((1 << 44) - 1)) << 20) ^ (sample & 0xFFFFF)).next_u64()


@dataclass
class Batch:
    id: int
    sample: int  # 0: the main response; k >= 1: sampled response k
    indices: list[int]  # prompt indices, in the length-sorted order
    start: int  # offset in the length-sorted order (seeds the main pass's sampling, as before)


def plan_batches(lengths: Sequence[int], batch_size: int, samples: int, batch_slots: int = 0, max_new_tokens: int = 0) -> list[Batch]:
    """Prompts sorted by length, cut into batches of at most `batch_size` rows and, with `batch_slots` > 0, of at most
    that many KV cache slots: rows x (the batch's longest prompt + max_new_tokens), the cache greedy_static allocates.
    Short prompts then run in wide batches and long ones in narrower batches that fit the same memory."""
    if batch_size < 1:
        raise A2DError(f"distill: batch_size {batch_size} must be at least 1")
    if batch_slots < 0:
        raise A2DError(f"distill: batch_slots {batch_slots} must be 0 (no bound) or more")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])  # similar lengths batch well
    cuts, start = [], 0
    while start < len(order):
        end = start + 1  # one row at least, whatever its slots
        while end < len(order) and end - start < batch_size and (
            batch_slots == 0 or (end - start + 1) * (lengths[order[end]] + max_new_tokens) <= batch_slots
        ):
            end += 1
        cuts.append((start, end))
        start = end
    batches: list[Batch] = []
    for k in range(samples + 1):
        for start, end in cuts:
            batches.append(Batch(len(batches), k, order[start:end], start))
    return batches


def processing_order(batches: list[Batch], seed: int) -> list[int]:
    ids = [b.id for b in batches]
    random.Random(seed).shuffle(ids)
    return ids


@dataclass
class Settings:
    max_new_tokens: int
    temperature: float  # the main response: 0 = greedy
    top_p: float
    seed: int
    sample_temperature: float
    sample_top_p: float
    eos_ids: list[int]
    pad_id: int


def make_sampler(uniform_rows, temperature: float, top_p: float, prompt_width: int):
    """A logits processor that samples each row's next token from its own uniforms and leaves only that
    token's score finite, so greedy `generate` emits it."""
    import torch
    from transformers import LogitsProcessor

    class SeededSampler(LogitsProcessor):
        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            step = input_ids.shape[1] - prompt_width
            probs = torch.softmax(scores.float() / temperature, dim=-1)
            sorted_p, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
            before = sorted_p.cumsum(-1) - sorted_p
            kept = before < top_p  # the smallest prefix reaching top_p (the first token always)
            sorted_p = sorted_p * kept
            cum = sorted_p.cumsum(-1)
            draw = uniform_rows[:, step : step + 1].to(cum.dtype) * cum[:, -1:]
            pos = torch.searchsorted(cum, draw, right=True)
            pos = torch.minimum(pos, kept.sum(-1, keepdim=True) - 1)
            token = ids.gather(1, pos)
            out = torch.full_like(scores, float("-inf"))
            return out.scatter_(1, token, 0.0)

    return SeededSampler()


FIRST_SPAN = 128  # the fewest cache slots a decode step attends over; each larger span doubles it, up to the capacity
WARMUP_STEPS = 2  # eager steps of a span before its CUDA graph is captured
EOS_CHECK_EVERY = 16  # decode steps between host reads of "how many rows have not emitted EOS yet"
# A batch whose running rows have fallen to this share of its rows goes on with those rows alone (GreedySteps.keep):
# a finished row's steps are otherwise computed and thrown away until the batch's longest answer ends. (The demo's
# distillation: answers of 170 tokens on average under a 256-token cap, 54 % of them at the cap, so a batch keeps at
# least half its rows to the end and a share of 0.5 would never compact it.)
COMPACT_AT = 0.8


def decode_spans(width: int, capacity: int) -> list[int]:
    """The cache spans decode steps attend over, smallest first: FIRST_SPAN, twice that, ... (those past the
    prompts' `width`, which the first step already needs), then the whole capacity. A step reads the smallest
    span past its slot, so early steps read a fraction of the cache; each span is one CUDA graph."""
    spans, span = [], FIRST_SPAN
    while span < capacity:
        if span > width:
            spans.append(span)
        span *= 2
    return spans + [capacity]


class GreedySteps:
    """greedy_static's decode step over fixed buffers: every input and output of a step is a device tensor that
    keeps its address from one step to the next, so the same step function runs eagerly or is captured once per
    span in a CUDA graph (StepGraphs) and replayed.

    `slot` [1] is the cache slot the latest token's keys and values went to; a step advances it, writes the
    current `token` of every row there (StaticKV at write_slots), attends over the first `span` slots with the
    validity mask computed from it (a row's own slots from its first prompt token up to `slot`), and writes the
    argmax into `out` at its column and into `token` for the next step. Slot s holds position s - pad of a row.
    """

    def __init__(self, model, cache, pads, width: int, max_new_tokens: int, eos: set[int], with_confidence: bool = False) -> None:
        import torch

        device = pads.device
        rows, capacity = pads.shape[0], cache.layers[0].k.shape[2]
        self.model, self.cache, self.pads, self.width = model, cache, pads, width
        self.slot_ids = torch.arange(capacity, device=device)
        self.slot = torch.full((1,), width - 1, dtype=torch.long, device=device)  # the prefill's last slot
        self.token = torch.zeros(rows, dtype=torch.long, device=device)
        self.out = torch.zeros((rows, max_new_tokens), dtype=torch.long, device=device)
        self.confidence = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device) if with_confidence else None
        self.finished = torch.zeros(rows, dtype=torch.bool, device=device)
        self.eos_ids = torch.tensor(sorted(eos) or [-1], dtype=torch.long, device=device)  # -1: no token ends a row
        cache.write_slots = self.slot

    def keep(self, rows) -> "GreedySteps":
        """The same decoding continued with only `rows` (ascending device indices) of this batch: the cache compacted
        in place into its first len(rows) rows (views of the same buffers, one layer's rows copied at a time), the
        rows' tokens, answers so far and slot carried over. This object's buffers, and graphs captured on them, are
        not to be used after."""
        n = rows.numel()
        for layer in self.cache.layers:
            layer.k[:n] = layer.k.index_select(0, rows)
            layer.v[:n] = layer.v.index_select(0, rows)
            layer.k, layer.v = layer.k[:n], layer.v[:n]
        kept = GreedySteps(self.model, self.cache, self.pads.index_select(0, rows), self.width, self.out.shape[1], set(),
                           self.confidence is not None)
        kept.eos_ids = self.eos_ids
        kept.slot.copy_(self.slot)
        kept.token.copy_(self.token.index_select(0, rows))
        kept.out.copy_(self.out.index_select(0, rows))
        if kept.confidence is not None:
            kept.confidence.copy_(self.confidence.index_select(0, rows))
        kept.finished.copy_(self.finished.index_select(0, rows))
        return kept

    def emit(self, hidden) -> None:
        """The next token of every row from its last hidden state, at column slot - (width - 1) of `out`, and with
        `confidence` its probability (the softmax of the logits in fp32: exp(max - logsumexp)) at the same column."""
        logits = self.model.logits(hidden[:, -1])
        token = logits.argmax(-1)  # (argmax of bf16 logits: the fp32 copy's, exactly)
        column = self.slot - (self.width - 1)
        self.out.index_copy_(1, column, token[:, None])
        if self.confidence is not None:
            wide = logits.float()
            self.confidence.index_copy_(1, column, (wide.amax(-1) - wide.logsumexp(-1)).exp()[:, None])
        self.finished |= (token[:, None] == self.eos_ids).any(-1)
        self.token.copy_(token)

    def step(self, span: int) -> None:
        self.slot += 1
        slots = self.slot_ids[:span]
        valid = (slots >= self.pads[:, None]) & (slots <= self.slot)  # [rows, span]
        self.cache.span = span
        hidden, _ = self.model(self.token[:, None], self.slot - self.pads[:, None], valid[:, None], self.cache)
        self.emit(hidden)


class StepGraphs:
    """GreedySteps.step replayed from one CUDA graph per span, as PyTorch's CUDA graph notes describe: a span's
    first WARMUP_STEPS steps run eagerly on a side stream (kernels chosen and workspaces allocated before
    capture; they are real steps, the graph is not yet needed), the next one captures the graph and every later
    step of that span replays it. Capture records kernels without running them, so a step is replayed right
    after its capture. The graphs share one memory pool: they run one after another in the order they were
    captured, and the state a step leaves lives in GreedySteps' buffers, outside the pool."""

    def __init__(self, steps: GreedySteps) -> None:
        import torch

        self.steps = steps
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.eager: dict[int, int] = {}  # span -> warm-up steps run
        self.pool = torch.cuda.graph_pool_handle()
        self.side = torch.cuda.Stream()

    def __call__(self, span: int) -> None:
        import torch

        graph = self.graphs.get(span)
        if graph is None and self.eager.get(span, 0) < WARMUP_STEPS:
            self.eager[span] = self.eager.get(span, 0) + 1
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                self.steps.step(span)
            torch.cuda.current_stream().wait_stream(self.side)
            return
        if graph is None:
            graph = self.graphs[span] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.steps.step(span)
        graph.replay()


def greedy_static(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos: set[int], pad_id: int,
                  graph: bool = True, with_confidence: bool = False, compact_at: float = COMPACT_AT):
    """Greedy answers of the reference Transformer `model` to `prompts`, one token per row per forward with
    a preallocated KV cache (model.StaticCache): the prompts left-padded into one prefill, pads masked out and
    positions counted from each prompt's first token. Each response is cut after its first EOS token; every
    EOS_CHECK_EVERY steps the rows that have not emitted one are counted: the decoding stops when none is left, and
    goes on with them alone (GreedySteps.keep) once they are at most `compact_at` of the batch (0: never).

    After the eager prefill, every step is GreedySteps.step: fixed shapes, its state in device buffers, so on a
    CUDA device it is replayed from CUDA graphs (StepGraphs; graph=False runs the same steps eagerly, for
    comparison) and costs no Python or kernel-launch time per layer. A CPU model runs them eagerly.

    with_confidence: returns (responses, confidences), each response's tokens with the probability the model gave
    each of them (what `train --mask-pattern teacher` orders its masks by)."""
    import torch

    from .model import StaticCache

    if max_new_tokens < 1 or not prompts or not all(prompts):
        raise A2DError("greedy_static: needs max_new_tokens >= 1 and non-empty prompts")
    device = next(model.parameters()).device
    B, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    pads = torch.tensor([width - len(p) for p in prompts])
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(list(p))
    ids, pads = ids.to(device), pads.to(device)
    # The last step writes slot width + max_new_tokens - 2; a multiple of 16 keeps every span's mask aligned
    # for the fused attention kernels.
    capacity = -(-(width + max_new_tokens) // 16) * 16
    slot = torch.arange(width, device=device)
    positions = (slot[None, :] - pads[:, None]).clamp(min=0)
    mask = (slot[None, :, None] >= slot[None, None, :]) & (slot[None, None, :] >= pads[:, None, None])
    mask |= torch.eye(width, dtype=torch.bool, device=device)[None]  # a pad row attends to itself: finite, unread
    dtype = next(model.parameters()).dtype
    cache = StaticCache(model.config, B, capacity, device, dtype)
    spans = decode_spans(width, capacity)
    # bf16 weights on a GPU: RoPE's fp32 angles would leave q in fp32 beside the bf16 cache; autocast
    # runs attention in the cache's dtype, as training does. (No weight is cast, so no cast is cached.)
    low = dtype != torch.float32
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=low, cache_enabled=False):
        hidden, new = model(ids, positions, mask, cache)
        cache.append(new, width)
        steps = GreedySteps(model, cache, pads, width, max_new_tokens, eos, with_confidence)
        steps.emit(hidden)
        del hidden, new  # the prefill's activations, freed before any capture
        graphed = graph and device.type == "cuda"
        run = StepGraphs(steps) if graphed else steps.step
        rows = torch.arange(B, device=device)  # the prompt of each row of the running batch
        out = torch.zeros((B, max_new_tokens), dtype=torch.long, device=device)
        confidence = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device) if with_confidence else None

        def collect() -> None:  # the running batch's answers so far, into the whole batch's
            out.index_copy_(0, rows, steps.out)
            if confidence is not None:
                confidence.index_copy_(0, rows, steps.confidence)

        done = 1  # columns of steps.out written
        while done < max_new_tokens:
            if done % EOS_CHECK_EVERY == 0:
                running = (~steps.finished).nonzero().squeeze(1)  # the one host sync of these steps
                if running.numel() == 0:
                    break
                # (Not for the last few steps: a compacted batch captures its graphs again.)
                if running.numel() <= compact_at * rows.numel() and max_new_tokens - done >= 2 * EOS_CHECK_EVERY:
                    collect()
                    run = None  # the graphs captured on the old buffers go first
                    steps, rows = steps.keep(running), rows.index_select(0, running)
                    run = StepGraphs(steps) if graphed else steps.step
            run(next(span for span in spans if span > width - 1 + done))  # the step writes slot width - 1 + done
            done += 1
        collect()
    # Each response cut after its first EOS: the lengths found on the device, so the host only slices lists.
    is_eos = torch.isin(out[:, :done], torch.tensor(sorted(eos), dtype=out.dtype, device=out.device))
    lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, done)
    responses = [row[:n] for row, n in zip(out[:, :done].tolist(), lengths.tolist())]
    if not with_confidence:
        return responses
    return responses, [p[: len(r)] for r, p in zip(responses, confidence[:, :done].tolist())]


def generate_batches(
    base: Path, prompts: Sequence[Sequence[int]], batches: list[Batch], settings: Settings, deadline: float | None, label: str
) -> Iterator[tuple[Batch, list[list[int]], list[list[float]] | None]]:
    """Answer `batches` in order with the base on this process's device; yields (batch, responses, confidences),
    each response cut after its first EOS token. Stops early (silently) when the next batch would overrun.
    Greedy main responses come from greedy_static on the reference Transformer, with the base's probability of each
    token; sampled ones from transformers' `generate` with the seeded sampler (confidences None)."""
    import torch
    from transformers import AutoModelForCausalLM, LogitsProcessorList

    from .model import load_transformer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = None  # transformers' model, loaded only when a batch samples
    loading = perf_counter()  # not the deadline's clock: the time limit's reads stay what they were
    reference, _, _ = load_transformer(base, device)
    reference = reference.to(dtype)
    print(json.dumps({"distill": label, "model_loaded_s": round(perf_counter() - loading, 2), "device": device}), file=sys.stderr, flush=True)
    eos = set(settings.eos_ids)
    slowest = 0.0
    for n, batch in enumerate(batches):
        if deadline is not None and time.time() + slowest > deadline:
            print(json.dumps({"distill": label, "stopped": "time_limit_s", "batches_done": n, "batches_assigned": len(batches)}), file=sys.stderr, flush=True)
            return
        started = time.time()
        if batch.sample == 0 and settings.temperature == 0:
            responses, confidences = greedy_static(reference, [prompts[i] for i in batch.indices], settings.max_new_tokens, eos,
                                                   settings.pad_id, graph=os.environ.get("A2D_DISTILL_GRAPHS", "1") != "0",
                                                   with_confidence=True)
            elapsed = time.time() - started
            slowest = max(slowest, elapsed)
            print(json.dumps({"distill": label, "batch": n + 1, "of": len(batches), "sample": 0, "rows": len(batch.indices),
                              "new_tokens": max(len(r) for r in responses), "s": round(elapsed, 2)}), file=sys.stderr, flush=True)
            yield batch, responses, confidences
            continue
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype).to(device).eval()
        width = max(len(prompts[i]) for i in batch.indices)
        ids = torch.full((len(batch.indices), width), settings.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch.indices), width), dtype=torch.long)
        for row, i in enumerate(batch.indices):  # left padding: generation continues right after each prompt
            ids[row, width - len(prompts[i]) :] = torch.tensor(list(prompts[i]))
            mask[row, width - len(prompts[i]) :] = 1
        options: dict[str, Any] = {}
        if batch.sample == 0:
            torch.manual_seed(settings.seed + batch.start)
            sampled = settings.temperature > 0
            options = dict(
                do_sample=sampled,
                temperature=settings.temperature if sampled else None,
                top_p=settings.top_p if sampled else None,
            )
        else:
            rows = uniforms([sample_seed(settings.seed, i, batch.sample) for i in batch.indices], settings.max_new_tokens)
            sampler = make_sampler(torch.from_numpy(rows).to(device), settings.sample_temperature, settings.sample_top_p, width)
            options = dict(do_sample=False, temperature=None, top_p=None, logits_processor=LogitsProcessorList([sampler]))
        with torch.no_grad():
            generated = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=settings.max_new_tokens,
                top_k=None,
                eos_token_id=settings.eos_ids,
                pad_token_id=settings.pad_id,
                **options,
            )
        responses = []
        for row in range(len(batch.indices)):
            response = generated[row, width:].tolist()
            end = next((k for k, t in enumerate(response) if t in eos), None)
            responses.append(response if end is None else response[: end + 1])
        elapsed = time.time() - started
        slowest = max(slowest, elapsed)
        print(json.dumps({"distill": label, "batch": n + 1, "of": len(batches), "sample": batch.sample, "rows": len(batch.indices),
                          "new_tokens": int(generated.shape[1] - width), "s": round(elapsed, 2)}), file=sys.stderr, flush=True)
        yield batch, responses, None


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (empty without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip():
        return [d.strip() for d in listed.split(",") if d.strip()][: torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def run(
    base: Path,
    prompts: Sequence[Sequence[int]],
    settings: Settings,
    samples: int,
    batch_size: int,
    workers: int,
    time_limit_s: float,
    work_dir: Path,
    label: str,
    batch_slots: int = 0,
) -> tuple[dict[tuple[int, int], list[int]], dict[tuple[int, int], list[float]], dict[str, Any]]:
    """Answer every (prompt, sample) task; returns {(prompt index, sample): response}, {(prompt index, sample): the
    base's probability of each token} for the greedy responses, and a record of how.
    workers: processes (0: one per visible GPU, 1 on a machine without one), spread over the GPUs in turn;
    batch_slots: the KV cache slots a batch may hold (plan_batches; 0: rows alone bound it)."""
    started = time.time()
    gpus = visible_gpus()
    if workers < 0:
        raise A2DError(f"distill: workers {workers} must be 0 (one per GPU) or more")
    workers = workers or max(len(gpus), 1)
    batches = plan_batches([len(p) for p in prompts], batch_size, samples, batch_slots, settings.max_new_tokens)
    order = processing_order(batches, settings.seed)
    deadline = started + time_limit_s if time_limit_s > 0 else None
    results: dict[tuple[int, int], list[int]] = {}
    confidences: dict[tuple[int, int], list[float]] = {}

    def take(batch: Batch, responses: list[list[int]], probabilities: list[list[float]] | None) -> None:
        for row, (i, response) in enumerate(zip(batch.indices, responses)):
            results[(i, batch.sample)] = response
            if probabilities is not None:
                confidences[(i, batch.sample)] = probabilities[row]

    if workers == 1:
        for batch, responses, probabilities in generate_batches(base, prompts, [batches[b] for b in order], settings, deadline, label):
            take(batch, responses, probabilities)
    else:
        work_dir.mkdir(parents=True, exist_ok=True)
        job = work_dir / "job.json"
        job.write_text(json.dumps({
            "base": str(base), "prompts": [list(p) for p in prompts], "batches": [asdict(b) for b in batches], "order": order,
            "settings": asdict(settings), "deadline": deadline, "label": label,
        }))
        package_root = str(Path(__file__).resolve().parents[1])
        procs = []
        for w in range(workers):
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = gpus[w % len(gpus)]
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
            out = work_dir / f"worker-{w}.jsonl"
            procs.append((subprocess.Popen([sys.executable, "-m", "a2d_convert.distill", str(job), str(w), str(workers), str(out)], env=env), out))
        failed = None
        while any(p.poll() is None for p, _ in procs) and failed is None:
            failed = next((w for w, (p, _) in enumerate(procs) if p.poll() not in (None, 0)), None)
            time.sleep(0.2)
        failed = failed if failed is not None else next((w for w, (p, _) in enumerate(procs) if p.returncode != 0), None)
        if failed is not None:
            for p, _ in procs:
                if p.poll() is None:
                    p.terminate()
            for p, _ in procs:
                p.wait()
            raise A2DError(f"distill: worker {failed} of {workers} failed (exit {procs[failed][0].returncode}); its error is printed above")
        by_id = {b.id: b for b in batches}
        for _, out in procs:
            for line in out.read_text().splitlines():
                row = json.loads(line)
                take(by_id[row["batch"]], row["responses"], row.get("confidences"))
        shutil.rmtree(work_dir, ignore_errors=True)
    record = {
        "greedy": "the reference Transformer (a2d_convert.model) with a static KV cache, bf16 on CUDA, decode steps replayed from CUDA graphs (distill.greedy_static)",
        "workers": workers,
        "gpus": gpus,
        "batch_size": batch_size,
        "batch_slots": batch_slots,
        "batches": len(batches),
        "batches_answered": sum(1 for b in batches if all((i, b.sample) in results for i in b.indices)),
        "time_limit_s": time_limit_s,
        "seconds": round(time.time() - started, 1),
    }
    return results, confidences, record


def worker_main(argv: list[str]) -> int:
    job_path, w, workers, out_path = Path(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3])
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    job = json.loads(job_path.read_text())
    batches = {b["id"]: Batch(**b) for b in job["batches"]}
    mine = [batches[b] for b in job["order"][w::workers]]
    settings = Settings(**job["settings"])
    with open(out_path, "w", encoding="utf-8") as f:
        for batch, responses, probabilities in generate_batches(Path(job["base"]), job["prompts"], mine, settings, job["deadline"],
                                                                f"{job['label']}#{w}"):
            f.write(json.dumps({"batch": batch.id, "responses": responses, "confidences": probabilities}) + "\n")
            f.flush()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
