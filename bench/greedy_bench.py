"""Throughput of self-distillation's greedy generator (a2d_convert.distill.greedy_static) on a GPU.

    python3 bench/greedy_bench.py [--rows 1024] [--new-tokens 256] [--check-rows 64]

A random-weight model of SmolLM2-135M's exact shape (LlamaForCausalLM: 30 layers, hidden 576, intermediate
1536, 9 heads over 3 KV heads of 64, vocab 49152, rope_theta 100000, tied embeddings) is built directly as
the reference Transformer in bf16 on the GPU, so no model files are needed; prompts are random, 20-60
tokens. It prints the prefill time, then for the CUDA-graph decode and for the same steps run eagerly
(graph=False): total seconds, generated tokens/s and decode ms per step ((total - prefill) / (new tokens - 1),
no EOS so every row runs to the end). Then whether both paths give identical tokens on a smaller batch, with
and without an EOS cut, and with the graphed batch compacted at every check (GreedySteps.keep), the decode step with cuDNN attention in place of the memory-efficient kernel
(model.DECODE_ATTENTION), peak memory, and a one-line summary. With --profile-tokens N, the eager path's first N
tokens at --rows under torch.profiler: the GPU kernels' time by name (a CUDA graph replays the same kernels).
Needs torch and numpy only; convert/ is put on sys.path from this file's place. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convert"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from a2d_convert import distill  # noqa: E402
from a2d_convert import model as reference  # noqa: E402
from a2d_convert.config import ModelConfig  # noqa: E402

SMOLLM2_135M = ModelConfig(
    architecture="LlamaForCausalLM", model_type="llama", hidden_size=576, intermediate_size=1536, num_layers=30,
    num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=49152, rms_norm_eps=1e-5, rope_theta=100000.0,
    max_position_embeddings=8192, tie_word_embeddings=True, qkv_bias=False, o_bias=False, qk_norm=False,
)
SMOLLM2_135M_PARAMETERS = 134_515_008
TARGET_TOKENS_PER_S = 100_000


def random_model(cfg: ModelConfig, device: str, dtype: torch.dtype, seed: int) -> reference.Transformer:
    """The reference Transformer with normal(0, 0.02) weights and unit norms."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = reference.Transformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model.to(dtype).eval()


def random_prompts(rows: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(1, vocab, size=int(n))] for n in rng.integers(20, 61, size=rows)]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def best_time(device: str, repeats: int, fn):
    """(result of the last call, fastest wall time of `repeats` calls), synchronized around each."""
    best, out = float("inf"), None
    for _ in range(max(1, repeats)):
        sync(device)
        started = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - started)
    return out, best


def check_shapes(responses, rows: int, length: int, vocab: int, label: str) -> list[str]:
    problems = []
    if len(responses) != rows:
        problems.append(f"{label}: {len(responses)} responses for {rows} prompts")
    lengths = {len(r) for r in responses}
    if lengths != {length}:
        problems.append(f"{label}: response lengths {sorted(lengths)[:5]}, expected all {length} (no EOS)")
    if any(t < 0 or t >= vocab for r in responses for t in r):
        problems.append(f"{label}: a token outside [0, {vocab})")
    return problems


def first_difference(a: list[list[int]], b: list[list[int]]) -> str:
    for row, (x, y) in enumerate(zip(a, b)):
        if x != y:
            col = next((k for k, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
            return f"row {row} column {col} (lengths {len(x)}/{len(y)})"
    return "none" if len(a) == len(b) else f"{len(a)} vs {len(b)} rows"


def cut_after_eos(answer: list[int], eos: set[int]) -> list[int]:
    end = next((k for k, t in enumerate(answer) if t in eos), None)
    return answer if end is None else answer[: end + 1]


def decode_report(label: str, rows: int, new: int, total: float, prefill: float) -> tuple[float, float]:
    """Prints and returns (generated tokens/s, decode ms per step)."""
    tokens_per_s = rows * new / total
    step_ms = 1000 * (total - prefill) / max(new - 1, 1)
    decode_tokens_per_s = rows * (new - 1) / max(total - prefill, 1e-9)
    print(f"{label:<28} {total:8.3f} s  {tokens_per_s:>12,.0f} tok/s  {step_ms:8.3f} ms/step  "
          f"(decode alone {decode_tokens_per_s:,.0f} tok/s)", flush=True)
    return tokens_per_s, step_ms


def profile_decode(device: str, run, rows: int, tokens: int) -> None:
    """The kernels of `run` (an eager greedy run of `tokens` new tokens) by GPU time, the prefill included."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        run()
        sync(device)
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.self_device_time_total for e in kernels)
    print(f"profile: {rows} rows x {tokens} new tokens (eager, prefill included): GPU kernels {total_us / 1e3:.1f} ms, "
          f"{total_us / 1e3 / max(tokens - 1, 1):.3f} ms per decode step", flush=True)
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:20]:
        share = e.self_device_time_total / total_us if total_us else 0.0
        print(f"  {share:6.1%} {e.self_device_time_total / 1e3:9.2f} ms {e.count:7d} calls  {e.key[:110]}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1024, help="prompts per batch")
    parser.add_argument("--new-tokens", type=int, default=256, help="max_new_tokens")
    parser.add_argument("--check-rows", type=int, default=64, help="rows of the graph == eager check")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of the graph path and prefill (best kept)")
    parser.add_argument("--no-eager", action="store_true", help="skip timing the eager path at --rows")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to try the script itself (no graphs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile-tokens", type=int, default=0, help="profile the eager path's first N tokens at --rows (0: no profile)")
    args = parser.parse_args()
    if args.rows < 1 or args.new_tokens < 2 or args.check_rows < 1 or args.profile_tokens == 1 or args.profile_tokens < 0:
        parser.error("needs --rows >= 1, --new-tokens >= 2, --check-rows >= 1, --profile-tokens 0 or >= 2")
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("greedy_bench: needs a CUDA device (torch.cuda.is_available() is False); --device cpu only tries the script")
        return 1
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cfg = SMOLLM2_135M
    rows, new = args.rows, args.new_tokens
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    cudnn = torch.backends.cudnn.version() if device == "cuda" else None
    print(f"device {where}, torch {torch.__version__}, cuDNN {cudnn}, {str(dtype).removeprefix('torch.')}", flush=True)

    problems: list[str] = []
    model = random_model(cfg, device, dtype, args.seed)
    parameters = sum(p.numel() for p in model.parameters())
    if parameters != SMOLLM2_135M_PARAMETERS:
        problems.append(f"model: {parameters:,} parameters, SmolLM2-135M has {SMOLLM2_135M_PARAMETERS:,}")
    if any(p.dtype != dtype or p.device.type != device for p in model.parameters()):
        problems.append(f"model: a parameter not {dtype} on {device}")
    prompts = random_prompts(rows, cfg.vocab_size, args.seed)
    widths = [len(p) for p in prompts]
    print(f"model {parameters:,} parameters; {rows} prompts of {min(widths)}-{max(widths)} tokens; max_new_tokens {new}",
          flush=True)

    def greedy(batch, tokens, graph=True, eos=frozenset(), compact_at=distill.COMPACT_AT, confidence=False):
        # As distillation runs it: each token's probability recorded beside it (the answers alone are compared).
        out = distill.greedy_static(model, batch, tokens, set(eos), pad_id=0, graph=graph, with_confidence=True,
                                    compact_at=compact_at)
        return out if confidence else out[0]

    # Lazy initialisation (CUDA context, cuBLAS, kernels, a first capture) outside every timing.
    greedy(prompts, 8)
    greedy(prompts, 8, graph=False)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    first, prefill = best_time(device, args.repeats, lambda: greedy(prompts, 1))
    problems += check_shapes(first, rows, 1, cfg.vocab_size, "prefill")
    print(f"{'prefill (max_new_tokens 1)':<28} {prefill:8.3f} s", flush=True)
    graphed, total = best_time(device, args.repeats, lambda: greedy(prompts, new))
    problems += check_shapes(graphed, rows, new, cfg.vocab_size, "graph")
    graph_rate, graph_ms = decode_report("graph (CUDA graphs)", rows, new, total, prefill)
    eager_rate = eager_ms = None
    if not args.no_eager:
        eager, total = best_time(device, 1, lambda: greedy(prompts, new, graph=False))
        problems += check_shapes(eager, rows, new, cfg.vocab_size, "eager")
        eager_rate, eager_ms = decode_report("eager (graph=False)", rows, new, total, prefill)
        if eager != graphed:
            problems.append(f"graph != eager at {rows} rows: first difference {first_difference(graphed, eager)}")
        print(f"graph == eager at {rows} rows: {eager == graphed}", flush=True)

    small = prompts[: args.check_rows]
    by_graph, by_eager = greedy(small, new), greedy(small, new, graph=False)
    same = sum(x == y for x, y in zip(by_graph, by_eager))
    eos = {by_eager[0][new // 2]}  # a token one answer emits half-way: EOS cuts, perhaps an early stop
    cut_graph, cut_eager = greedy(small, new, eos=eos), greedy(small, new, graph=False, eos=eos)
    cut_same = sum(x == y for x, y in zip(cut_graph, cut_eager))
    lengths = [len(r) for r in cut_eager]
    print(f"check {len(small)} rows: graph == eager {same}/{len(small)} rows; with EOS {sorted(eos)} "
          f"{cut_same}/{len(small)} rows (answer lengths {min(lengths)}-{max(lengths)})", flush=True)
    if same != len(small) or cut_same != len(small) or len(by_graph) != len(small) or len(cut_graph) != len(small):
        problems.append(f"graph != eager on {len(small)} rows: first difference {first_difference(by_graph, by_eager)}, "
                        f"with EOS {first_difference(cut_graph, cut_eager)}")
    if cut_eager != [cut_after_eos(e, eos) for e in by_eager]:
        problems.append("EOS cut: an answer is not the uncut answer up to its first EOS")
    # The batch compacted at every check (compact_at 1: GreedySteps.keep, graphs captured again each time): the graph
    # against the same compactions run eagerly (the same shapes every step, so the same kernels: equal), and against
    # the batch that never compacts. The last is reported, not required: a batch of fewer rows runs other GEMM
    # kernels, whose bf16 sums can break a near tie of this random model the other way (its probabilities up to
    # each row's first difference show how close they are).
    compacted, compacted_p = greedy(small, new, eos=eos, compact_at=1.0, confidence=True)
    compacted_eager = greedy(small, new, graph=False, eos=eos, compact_at=1.0)
    plain, plain_p = greedy(small, new, graph=False, eos=eos, compact_at=0.0, confidence=True)
    print(f"check {len(small)} rows, compacted every {distill.EOS_CHECK_EVERY} steps: graph == eager "
          f"{sum(x == y for x, y in zip(compacted, compacted_eager))}/{len(small)} rows", flush=True)
    if compacted != compacted_eager:
        problems.append(f"graph != eager with compaction: first difference {first_difference(compacted, compacted_eager)}")
    agree = [next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) for a, b in zip(compacted, plain)]
    drift = max((abs(x - y) for a, b, n in zip(compacted_p, plain_p, agree) for x, y in zip(a[:n], b[:n])), default=0.0)
    print(f"check {len(small)} rows, compacted == never compacted: {sum(x == y for x, y in zip(compacted, plain))}/"
          f"{len(small)} rows, {sum(agree)}/{sum(len(r) for r in plain)} tokens before the first difference, "
          f"max probability difference before it {drift:.2e}", flush=True)

    if device == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    if args.profile_tokens:
        profile_decode(device, lambda: greedy(prompts, args.profile_tokens, graph=False), rows, args.profile_tokens)
    if device == "cuda":
        kept = reference.DECODE_ATTENTION
        try:  # last: a failed capture can leave the device unusable
            reference.DECODE_ATTENTION = (torch.nn.attention.SDPBackend.CUDNN_ATTENTION,)
            _, total = best_time(device, 1, lambda: greedy(prompts, new))
            decode_report("graph, cuDNN attention", rows, new, total, prefill)
        except Exception as error:  # noqa: BLE001 (a variant that cannot run is reported, not fatal)
            print(f"graph, cuDNN attention: failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        finally:
            reference.DECODE_ATTENTION = kept

    for problem in problems:
        print(f"CHECK FAILED: {problem}")
    eager_part = "eager skipped" if eager_rate is None else (
        f"eager {eager_rate:,.0f} tok/s ({eager_ms:.2f} ms/step), graph {graph_rate / eager_rate:.1f}x")
    print(f"greedy_bench: {rows} rows x {new} new tokens, SmolLM2-135M shape {str(dtype).removeprefix('torch.')} on {where}: "
          f"graph {graph_rate:,.0f} tok/s ({graph_ms:.2f} ms/step), {eager_part}; "
          f"graph == eager: {'yes' if not any('graph != eager' in p for p in problems) else 'NO'}; "
          f"target >= {TARGET_TOKENS_PER_S:,} tok/s: {'met' if graph_rate >= TARGET_TOKENS_PER_S else 'missed'}; "
          f"checks: {'ok' if not problems else f'{len(problems)} failed'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
