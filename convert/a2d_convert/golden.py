"""`golden`: the reference's debug state for the other backends (docs/golden-format.md).

For each case, a tiny random base (tiny.py) becomes an a2d model (init_model.py); the reference then
records the fp32 logits of two fixed forwards, tokenization checks for the TypeScript side, and a set
of decode runs with full traces. Runs are only written when their decisions are robust: the same run
with every logits row perturbed (uniform noise of PERTURBATION x the row's largest |logit|, a few
draws) must make exactly the same decisions, so a backend within the stated tolerance cannot flip a
token by rounding. A case whose runs are degenerate (one repeated token, or no step that reveals
several tokens by threshold) fails loudly instead of writing a weak test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import A2DError
from .rng import SplitMix64

FORMAT_VERSION = 1
TOLERANCE = {"logits_max_rel": 1e-4, "confidence_abs": 1e-4}
PERTURBATION = 3e-4  # three times the CPU backend's logits tolerance
PERTURBATION_DRAWS = 2
RNG_SEEDS = (0, 1234, (1 << 64) - 1)

# User messages tried in order until every run of a case is robust.
PROMPTS = (
    "What is the capital of France?",
    "Could you help me with my homework, please?",
    "Once upon a time there was a cat.",
    "Write a function that adds two numbers.",
    "Why does the sun rise in the east?",
    "Count from 1 to 12.",
)


@dataclass(frozen=True)
class Case:
    arch: str
    heads: int
    kv_heads: int
    block_size: int
    shift_logits: bool = True
    head_dim: int = 0
    tie_embeddings: bool = False
    vocab_multiple: int = 64
    layers: int = 2
    hidden: int = 64
    logit_scale: float = 8.0  # std of the random logits: high enough that thresholds are crossed
    adapter: str = ""  # "mask" or "window": a random row adapter of that rule on every projection (tiny.add_random_adapter)
    adapter_rank: int = 4
    window_rule: bool = False  # a2d.window_rule: the window adapter's window and attention rule, no factors
    precision: str = "bf16"  # "fp8-e4m3": the model quantized (quantize.py) after init


CASES = {
    "llama_gqa1": Case("llama", heads=4, kv_heads=4, block_size=4),
    "llama_gqa4_tied": Case("llama", heads=8, kv_heads=2, block_size=4, head_dim=12, tie_embeddings=True, logit_scale=10),
    "qwen2_gqa2": Case("qwen2", heads=4, kv_heads=2, block_size=8),
    "qwen3_qknorm": Case("qwen3", heads=4, kv_heads=2, block_size=4, shift_logits=False, layers=3),
    "llama_appended_mask": Case("llama", heads=4, kv_heads=2, block_size=2, vocab_multiple=1),
    "llama_mask_adapter": Case("llama", heads=4, kv_heads=2, block_size=4, adapter="mask"),
    "llama_fp8": Case("llama", heads=4, kv_heads=2, block_size=4, precision="fp8-e4m3"),
    "llama_window_adapter": Case("llama", heads=4, kv_heads=2, block_size=4, adapter="window"),
    "llama_window_rule": Case("llama", heads=4, kv_heads=2, block_size=4, window_rule=True),
}


def decode_runs(block_size: int, eos: list[int]) -> list[tuple[str, dict]]:
    """(name, parameters) of every run but `eos_stop`, which needs the greedy run's tokens."""
    base = dict(
        max_tokens=6 * block_size,
        block_size=block_size,
        threshold=0.9,
        min_per_step=1,
        steps=0,
        temperature=0.0,
        top_p=1.0,
        remasking="low_confidence",
        advance="block",
        commit="fused",
        reveal_order="any",
        seed=0,
        eos_token_ids=eos,
    )
    runs = [
        ("greedy_fused", {}),
        ("greedy_separate", {"commit": "separate"}),
        ("min_per_step_2", {"min_per_step": min(2, block_size)}),
        ("steps_schedule", {"threshold": 1.0, "steps": min(2, block_size)}),
        ("max_tokens_odd", {"max_tokens": 2 * block_size + 1}),
        ("sample_top_p", {"temperature": 0.8, "top_p": 0.9, "seed": 1234}),
        ("sample_full", {"temperature": 1.0, "seed": 99, "commit": "separate"}),
        ("remask_random", {"remasking": "random", "seed": 7}),
        ("remask_leftmost", {"remasking": "leftmost", "threshold": 0.6}),
        ("threshold_low", {"threshold": 0.3}),
        ("reveal_prefix", {"reveal_order": "prefix", "threshold": 0.5}),
    ]
    for b in (2, 4, 8):
        runs.append((f"block_{b}", {"block_size": b, "max_tokens": max(6 * b, 12)}))
    runs += [
        ("slide", {"advance": "slide"}),
        ("slide_mid", {"advance": "slide", "threshold": 0.6, "max_tokens": 6 * block_size + 1}),
        ("slide_leftmost", {"advance": "slide", "remasking": "leftmost", "threshold": 0.6, "commit": "separate"}),
        ("slide_sample", {"advance": "slide", "temperature": 0.9, "top_p": 0.95, "seed": 5, "min_per_step": min(2, block_size)}),
    ]
    return [(name, {**base, **change}) for name, change in runs]


class Perturbed:
    """A ForwardFn adding reproducible uniform noise, scaled per row, to another ForwardFn's logits."""

    def __init__(self, forward, seed: int):
        self.forward, self.rng = forward, np.random.default_rng(seed)

    def __call__(self, commit, window, rows):
        logits = np.asarray(self.forward(commit, window, rows), dtype=np.float32)
        if logits.size == 0:
            return logits
        scale = PERTURBATION * np.abs(logits).max(axis=1, keepdims=True)
        noise = self.rng.uniform(-1.0, 1.0, size=logits.shape).astype(np.float32)
        return logits + scale * noise


def decisions(result) -> tuple:
    """Everything a golden test compares exactly."""
    steps = tuple(
        (s["forward"], s["block_start"], s["step"], tuple(s["candidates"]), tuple((j, t) for j, t, _ in s["revealed"]))
        for s in result.trace
    )
    return tuple(result.token_ids), result.finish_reason, result.forward_passes, steps


def run_decode(model, a2d, prompt_ids: list[int], params: dict, perturb_seed: int | None = None):
    from .decode import decode
    from .decoding import DecodeParams
    from .model import BlockForward

    forward = BlockForward(model)
    if perturb_seed is not None:
        forward = Perturbed(forward, perturb_seed)
    p = DecodeParams(**{**params, "eos_token_ids": tuple(params["eos_token_ids"])})
    return decode(forward, prompt_ids, p, mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits,
                  anchor_in_window=a2d.anchor_in_window, trace=True)


def robust_run(model, a2d, prompts: list[list[int]], params: dict, name: str, case: str):
    """The first prompt whose run survives every perturbation, with its result."""
    for prompt_ids in prompts:
        result = run_decode(model, a2d, prompt_ids, params)
        want = decisions(result)
        if all(decisions(run_decode(model, a2d, prompt_ids, params, seed)) == want for seed in range(PERTURBATION_DRAWS)):
            return prompt_ids, result
    raise A2DError(f"golden case {case}, run {name}: every prompt gives a decision within rounding of a tie; change PROMPTS")


def run_record(name: str, prompt_ids: list[int], params: dict, result) -> dict:
    return {
        "name": name,
        "prompt_ids": list(prompt_ids),
        "params": params,
        "token_ids": result.token_ids,
        "finish_reason": result.finish_reason,
        "forward_passes": result.forward_passes,
        "tokens_per_forward": result.tokens_per_forward,
        "trace": [
            {**s, "candidates": list(s["candidates"]), "revealed": [[j, t, float(c)] for j, t, c in s["revealed"]]}
            for s in result.trace
        ],
    }


def check_not_degenerate(case: str, records: list[dict]) -> None:
    greedy = next(r for r in records if r["name"] == "greedy_fused")
    if len(set(greedy["token_ids"])) < 3:
        raise A2DError(f"golden case {case}: the greedy run repeats too few tokens ({greedy['token_ids']}); retune the case")
    by_threshold = by_topup = False
    for record in records:
        threshold = record["params"]["threshold"]
        for step in record["trace"]:
            above = sum(1 for _, _, c in step["revealed"] if c > threshold)
            by_threshold |= above >= 2
            by_topup |= above < len(step["revealed"])
    if not (by_threshold and by_topup):
        raise A2DError(
            f"golden case {case}: no step reveals {'several tokens by threshold' if not by_threshold else 'a token by the minimum'}; "
            "retune the case's logit scale"
        )


def write_case(out: Path, name: str, case: Case, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    from .config import read_json, write_json
    from .init_model import init_model
    from .model import BlockForward, load_transformer
    from .prompts import load_prompt_codec
    from .quantize import quantize_folder
    from .tiny import TinySpec, add_random_adapter, make_tiny_base

    spec = TinySpec(
        arch=case.arch,
        layers=case.layers,
        hidden=case.hidden,
        intermediate=2 * case.hidden,
        heads=case.heads,
        kv_heads=case.kv_heads,
        head_dim=case.head_dim,
        tie_embeddings=case.tie_embeddings,
        vocab_multiple=case.vocab_multiple,
        logit_scale=case.logit_scale,
        init_std=0.1,
        seed=seed * 1000 + list(CASES).index(name),
    )
    with tempfile.TemporaryDirectory() as tmp:
        base = make_tiny_base(Path(tmp) / "base", spec)
        float_dir = out / "model" if case.precision == "bf16" else Path(tmp) / "float"
        model_dir = init_model(base, float_dir, block_size=case.block_size, shift_logits=case.shift_logits)
        if case.adapter:
            add_random_adapter(model_dir, case.adapter, case.adapter_rank, spec.seed)
        if case.window_rule:
            config = read_json(model_dir / "config.json")
            config["a2d"]["window_rule"] = True
            write_json(model_dir / "config.json", config)
        if case.precision != "bf16":
            model_dir = quantize_folder(model_dir, out / "model", case.precision, force=True)
    model, cfg, a2d = load_transformer(model_dir)
    codec = load_prompt_codec(model_dir)
    mask, B = a2d.mask_token_id, a2d.block_size

    chats = [codec.encode_chat([{"role": "user", "content": text}]) for text in PROMPTS]
    prompt = chats[0]
    words = codec.encode_plain(" the answer is four, and then Paris")
    commit = words[:3]
    window = [words[3 + j] if j % 2 == 0 else mask for j in range(B)]
    forwards = [
        {"name": "prefill", "cached_ids": [], "commit_ids": prompt, "window_ids": [mask] * B},
        {"name": "cached", "cached_ids": prompt, "commit_ids": commit, "window_ids": window},
    ]
    if a2d.anchor_in_window:  # the window opens with its anchor, the last token before it (docs/decoding.md)
        for f in forwards:
            f["commit_ids"], f["window_ids"] = f["commit_ids"][:-1], f["commit_ids"][-1:] + f["window_ids"]
    tensors = {"prompt_ids": torch.tensor(prompt, dtype=torch.int32)}
    for f in forwards:
        step = BlockForward(model)
        if f["cached_ids"]:
            step(f["cached_ids"], [], [])
        rows = list(range(len(f["commit_ids"]) + len(f["window_ids"])))
        tensors[f"logits_{f['name']}"] = step(f["commit_ids"], f["window_ids"], rows).float().contiguous()

    records = []
    for run_name, params in decode_runs(B, list(a2d.eos_token_ids)):
        prompt_ids, result = robust_run(model, a2d, chats, params, run_name, name)
        records.append(run_record(run_name, prompt_ids, params, result))
    greedy = records[0]
    # Stop on a token the greedy run first produces after its first block and not at a block's start,
    # so the run commits blocks before it ends mid-block with "stop".
    tokens = greedy["token_ids"]
    firsts = [i for i, t in enumerate(tokens) if t not in tokens[:i] and i >= B]
    eos_token = tokens[next((i for i in firsts if i % B), firsts[0] if firsts else len(tokens) - 1)]
    params = {**greedy["params"], "eos_token_ids": [eos_token]}
    prompt_ids, result = robust_run(model, a2d, [greedy["prompt_ids"]], params, "eos_stop", name)
    if result.finish_reason != "stop":
        raise A2DError(f"golden case {name}: the eos_stop run did not stop; this is a bug in the generator")
    records.insert(5, run_record("eos_stop", prompt_ids, params, result))
    check_not_degenerate(name, records)

    messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is two plus two?"}]
    sample_ids = greedy["token_ids"][:8] + [a2d.eos_token_ids[-1]] + codec.encode_plain(" Paris")
    tokenization = [
        {"kind": "plain", "text": "The cat sat on the mat.", "ids": codec.encode_plain("The cat sat on the mat.")},
        *(
            {
                "kind": "chat",
                "messages": messages,
                "enable_thinking": thinking,
                "rendered": codec.render_chat(messages, thinking),
                "ids": codec.encode_chat(messages, thinking),
            }
            for thinking in (True, False)
        ),
        {"kind": "decode", "ids": sample_ids, "text": codec.decode(sample_ids)},
    ]
    save_file(tensors, str(out / "golden.safetensors"), metadata={"format": "pt"})
    (out / "golden.safetensors").chmod(0o644)
    golden = {
        "format_version": FORMAT_VERSION,
        "case": name,
        "model": "model",
        "tolerance": TOLERANCE,
        "forwards": forwards,
        "tokenization": tokenization,
        "decodes": records,
    }
    (out / "golden.json").write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")


def rng_vectors() -> dict:
    vectors = []
    for seed in RNG_SEEDS:
        rng = SplitMix64(seed)
        u64 = [rng.next_u64() for _ in range(10)]
        vectors.append({
            "seed": str(seed),
            "u64": [f"{x:#018x}" for x in u64],
            "uniform": [(x >> 11) * 2.0**-53 for x in u64],
        })
    return {"splitmix64": vectors}


def write_golden(out: Path, seed: int = 0, force: bool = False, cases: list[str] | None = None) -> list[str]:
    import torch

    names = list(CASES) if not cases else cases
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise A2DError(f"--case {unknown[0]!r} is not a golden case; choose from {', '.join(CASES)}")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise A2DError(f"{out}: folder is not empty; choose an empty --out or pass --force to overwrite it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest and gives the same sums every run
    try:
        (out / "rng.json").write_text(json.dumps(rng_vectors(), indent=1) + "\n", encoding="utf-8")
        for name in names:
            (out / name).mkdir()
            write_case(out / name, name, CASES[name], seed)
        index = {"format_version": FORMAT_VERSION, "seed": seed, "cases": names}
        (out / "index.json").write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
    finally:
        torch.set_num_threads(threads)
    return names


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("golden", help="write golden files (logits, traces, tokens) for the engine's tests")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0, help="seed of the random tiny models")
    p.add_argument("--case", action="append", dest="cases", help=f"only these cases (repeatable): {', '.join(CASES)}")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.seed < 0:
        raise A2DError(f"--seed {args.seed} must be >= 0")
    names = write_golden(args.out, args.seed, args.force, args.cases)
    print(f"{args.out}: {len(names)} golden cases ({', '.join(names)})")
    return 0
