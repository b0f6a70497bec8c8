"""`evaluate-probes`: the AR base vs the converted model on probes with checkable answers.

For choosing checkpoints and decoding thresholds without touching any benchmark (SPEC data rule): the
probes are self-written and generated from a seed (arithmetic, comparisons, sequences, copying,
letter counts, multiple choice on everyday facts), or a user's JSONL of training-split rows
(`{"family", "prompt", "answer", "check"}` with check one of number | choice | contains | exact | math).

The base answers greedily, token by token, with the reference Transformer under a plain causal mask;
the converted model answers with the reference block-diffusion decoder (docs/decoding.md) at every
threshold asked for, or with `--engine cpu` the C++ engine, which decodes the same rule bit for bit and
much faster: prompts are tokenized here, every threshold's requests go as token ids to one
`a2d generate-batch` process (the built CLI, dist/cli/main.js), and its token ids are decoded here.

Reported per family and overall, for every threshold: accuracy (with its 95 % interval), retention
(accuracy as a share of the base's), agreement with the base (same extracted answer), tokens per forward,
tokens per answer, `parallel_share` (the share of revealed tokens beyond one per step: what a one-token-
per-step decoder would not have revealed then) and `topup_share` (the share revealed by the per-step floor
rather than by passing the threshold); over the sweep, `aup` (d3LLM's accuracy under parallelism: one
number that rewards tokens per forward only where accuracy holds). `recommended` is the decoding with the
most tokens per forward among thresholds whose accuracy is within `--tolerance` of the best threshold's;
`export --probes` takes it, with the report's `decoding`, as the model's default and records this file's
sha256 in decoder_config.json. Thresholds and checkpoints are chosen on these probes only, never on a
benchmark.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from . import lineage as lin
from .config import read_json, write_json
from .decoding import ADVANCE, DECODING_PARAMETERS, REMASKING
from .errors import A2DError

CHECKS = ("number", "choice", "contains", "exact", "math")
ENGINES = ("reference", "cpu")
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Probe:
    family: str
    prompt: str
    answer: str
    check: str


# --------------------------------------------------------------------------------------------- the probe set

WORDS = "apple river stone cloud tiger paper green music window silver garden orange bridge candle rocket".split()
FACTS = [
    ("Which of these is a fruit?", ["car", "banana", "chair", "cloud"], "B"),
    ("Which animal says 'moo'?", ["cow", "cat", "duck", "snake"], "A"),
    ("Which of these is a colour?", ["table", "seven", "blue", "run"], "C"),
    ("Which of these can fly?", ["fish", "stone", "horse", "bird"], "D"),
    ("How many days are in a week?", ["five", "seven", "ten", "twelve"], "B"),
    ("Which of these is frozen water?", ["ice", "sand", "wood", "glass"], "A"),
    ("Which planet do we live on?", ["Mars", "Venus", "Earth", "Jupiter"], "C"),
    ("Which of these is used to write?", ["spoon", "shoe", "plate", "pencil"], "D"),
    ("What colour is the sky on a clear day?", ["blue", "green", "red", "black"], "A"),
    ("Which of these is a number?", ["dog", "nine", "tree", "sun"], "B"),
]


def generated_probes(per_family: int, seed: int) -> list[Probe]:
    rng = random.Random(seed)
    probes: list[Probe] = []
    for _ in range(per_family):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        probes.append(Probe("add", f"What is {a} + {b}? Answer with the number only.", str(a + b), "number"))
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        probes.append(Probe("multiply", f"What is {a} times {b}? Answer with the number only.", str(a * b), "number"))
        a, b = rng.sample(range(10, 500), 2)
        probes.append(Probe("compare", f"Which number is larger, {a} or {b}? Answer with the number only.", str(max(a, b)), "number"))
        start, step = rng.randint(1, 20), rng.randint(2, 9)
        seq = ", ".join(str(start + i * step) for i in range(4))
        probes.append(Probe("sequence", f"What number comes next: {seq}, ...? Answer with the number only.", str(start + 4 * step), "number"))
        words = " ".join(rng.sample(WORDS, 4))
        probes.append(Probe("copy", f"Repeat these words exactly: {words}", words, "contains"))
        word = rng.choice(WORDS)
        letter = rng.choice(sorted(set(word)))
        probes.append(
            Probe("letters", f"How many times does the letter '{letter}' appear in the word '{word}'? Answer with the number only.", str(word.count(letter)), "number")
        )
        question, options, answer = FACTS[len(probes) // 6 % len(FACTS)]
        lettered = " ".join(f"{chr(65 + i)}) {o}" for i, o in enumerate(options))
        probes.append(Probe("choice", f"{question} {lettered}. Answer with the letter only.", answer, "choice"))
    return probes


def read_probes(path: Path) -> list[Probe]:
    probes = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            probe = Probe(str(row.get("family", "custom")), row["prompt"], str(row["answer"]), row.get("check", "contains"))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise A2DError(f"{path}:{line_no}: a probe needs prompt and answer ({err})") from None
        if probe.check not in CHECKS:
            raise A2DError(f"{path}:{line_no}: check {probe.check!r} must be one of {CHECKS}")
        probes.append(probe)
    if not probes:
        raise A2DError(f"{path}: no probes")
    return probes


# --------------------------------------------------------------------------------------------- grading


def visible_text(text: str) -> str:
    """The answer part: a closed <think>...</think> section is reasoning, not the answer."""
    return text.split("</think>")[-1]


def extract_number(text: str) -> float | None:
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", visible_text(text))
    if not numbers:
        return None
    try:
        return float(numbers[-1].replace(",", ""))
    except ValueError:
        return None


def extract_choice(text: str) -> str | None:
    found = re.search(r"\b([A-J])\b", visible_text(text))
    return found.group(1) if found else None


def extracted(probe: Probe, text: str) -> Any:
    if probe.check == "number":
        return extract_number(text)
    if probe.check == "choice":
        return extract_choice(text)
    return visible_text(text).strip()


def is_correct(probe: Probe, text: str) -> bool:
    if probe.check == "number":
        got = extract_number(text)
        return got is not None and abs(got - float(probe.answer)) < 1e-9
    if probe.check == "choice":
        return extract_choice(text) == probe.answer
    if probe.check == "contains":
        return probe.answer.lower() in visible_text(text).lower()
    if probe.check == "exact":
        return visible_text(text).strip() == probe.answer.strip()
    from math_verify import parse, verify

    return bool(verify(parse(probe.answer), parse(visible_text(text))))


# --------------------------------------------------------------------------------------------- answering


def prompt_ids(codec, probe: Probe, enable_thinking: bool | None) -> list[int]:
    if codec.chat_template is not None:
        return codec.encode_chat([{"role": "user", "content": probe.prompt}], enable_thinking)
    return codec.encode_plain(probe.prompt)


def ar_steps(ids: list[int], max_tokens: int, eos: set[int]):
    """Greedy AR decoding as a generator of forward requests (decode.run_batch drives many at once):
    returns (tokens, forward passes)."""
    import numpy as np

    from .decode import _to_numpy

    out: list[int] = []
    logits = yield (list(ids), [], [len(ids) - 1])
    passes = 1
    while len(out) < max_tokens:
        token = int(np.argmax(_to_numpy(logits)[0]))  # first maximum, as torch.argmax
        if token in eos:
            break
        out.append(token)
        if len(out) == max_tokens:
            break
        logits = yield ([token], [], [0])
        passes += 1
    return out, passes


def ar_answer(model, ids: list[int], max_tokens: int, eos: set[int]) -> tuple[list[int], int]:
    """Greedy AR decoding with the reference model's KV cache: (tokens, forward passes)."""
    return ar_answers(model, [ids], max_tokens, eos, batch_size=1)[0]


def _batches(n: int, batch_size: int):
    for start in range(0, n, max(batch_size, 1)):
        yield range(start, min(start + max(batch_size, 1), n))


def ar_answers(model, prompts: list[list[int]], max_tokens: int, eos: set[int], batch_size: int = 64, threads: int = 1) -> list[tuple[list[int], int]]:
    """ar_answer for every prompt, `batch_size` sequences per batched forward (the same tokens as one by
    one; batch_size 1 is exactly the one-by-one loop)."""
    import torch

    from .decode import run_batch
    from .model import BatchBlockForward, BlockForward

    answers: list[tuple[list[int], int]] = []
    with torch.inference_mode():
        for chunk in tqdm(list(_batches(len(prompts), batch_size)), desc="AR base", unit="batch", disable=len(prompts) <= 1):
            machines = [ar_steps(prompts[i], max_tokens, eos) for i in chunk]
            if len(chunk) == 1:
                forward = BlockForward(model)
                answers += run_batch(lambda requests: [forward(*requests[0])], machines)
            else:
                answers += run_batch(BatchBlockForward(model, len(chunk)), machines, threads)
    return answers


def reference_answers(model_dir: Path, device: str, a2d, prompts: list[list[int]], params: list, batch_size: int = 64, threads: int = 1) -> list[tuple[list[int], int]]:
    """The reference block-diffusion decoder: one `answer_of` dict per (prompt, params) pair, `batch_size`
    sequences decoded together (decode.decode_batch: the same decisions as one by one)."""
    import torch

    from .decode import decode, decode_batch
    from .model import BatchBlockForward, BlockForward, load_transformer

    model, _, _ = load_transformer(model_dir, device)
    answers = []
    with torch.inference_mode():
        for chunk in tqdm(list(_batches(len(prompts), batch_size)), desc="diffusion (reference)", unit="batch"):
            if len(chunk) == 1:
                (i,) = chunk
                results = [decode(BlockForward(model), prompts[i], params[i], mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits,
                                   anchor_in_window=a2d.anchor_in_window)]
            else:
                results = decode_batch(
                    BatchBlockForward(model, len(chunk)), [prompts[i] for i in chunk], [params[i] for i in chunk],
                    mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits, anchor_in_window=a2d.anchor_in_window,
                    threads=threads,
                )
            answers += [answer_of(r.token_ids, r.forward_passes, r.steps, r.revealed, r.topped_up) for r in results]
    return answers


def answer_of(tokens: list[int], forward_passes: int, steps: int, revealed: int, topped_up: int) -> dict[str, Any]:
    """What a decoder reports of one answer, whichever decoder it is."""
    return {"tokens": tokens, "forward_passes": forward_passes, "steps": steps, "revealed": revealed, "topped_up": topped_up}


def engine_params(params) -> dict[str, Any]:
    """Every DecodeParams field, named as engine/types.ts names it: nothing is left to the engine's defaults."""
    return {re.sub(r"_(\w)", lambda m: m.group(1).upper(), k): v for k, v in dataclasses.asdict(params).items()}


def engine_answers(model_dir: Path, threads: int, prompts: list[list[int]], params: list, cli: Path = REPO / "dist" / "cli" / "main.js") -> list[dict[str, Any]]:
    """The C++ CPU engine through one `a2d generate-batch` process: one `answer_of` dict per pair."""
    node = shutil.which("node")
    if node is None:
        raise A2DError("--engine cpu needs Node.js (`node` on PATH) and the built engine (`npm run build`)")
    if not cli.is_file():
        raise A2DError(f"--engine cpu: {cli} is missing; build the CLI and the engine with `npm run build` in {REPO}")
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8") as requests:
        for ids, p in zip(prompts, params):
            requests.write(json.dumps({"prompt_ids": ids, "params": engine_params(p)}) + "\n")
        requests.flush()
        command = [node, str(cli), "generate-batch", "--model", str(model_dir), "--threads", str(threads), "--input", requests.name]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            results = [json.loads(line) for line in tqdm(proc.stdout, total=len(prompts), desc="diffusion (C++ cpu)", unit="probe")]
            stderr = proc.stderr.read().strip()
    if proc.returncode != 0 or len(results) != len(prompts):
        raise A2DError(
            f"--engine cpu: `a2d generate-batch` failed (exit {proc.returncode}): {stderr or 'no message'}; "
            f"if dist/ or the engine addon is missing or stale, rebuild with `npm run build` in {REPO}"
        )
    return [answer_of(r["token_ids"], r["forward_passes"], r["steps"], r["revealed"], r["topped_up"]) for r in results]


def earlier_base_answers(details: Path, probes: list[Probe], max_tokens: int) -> list[dict[str, Any]]:
    """The base's answers from an earlier run's --details file, checked to be of exactly these probes at
    this max_tokens, in order."""
    rows = [json.loads(line) for line in Path(details).read_text(encoding="utf-8").splitlines() if line.strip()]
    base = [r for r in rows if r.get("kind") == "base"]
    if [r["prompt"] for r in base] != [p.prompt for p in probes] or any(r.get("max_tokens") != max_tokens or "token_ids" not in r for r in base):
        raise A2DError(f"{details}: its base answers are not of these {len(probes)} probes at --max-tokens {max_tokens}; "
                       "run with --base instead (or give the details file of a run with the same probes and max tokens)")
    return [{"tokens": r["token_ids"], "forward_passes": r["forward_passes"]} for r in base]


def wilson_interval(correct: int, n: int, z: float = 1.96) -> list[float]:
    """95 % Wilson score interval of an accuracy: how far a probe set of this size pins it down."""
    if n == 0:
        return [0.0, 1.0]
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def sign_test(only_a: int, only_b: int) -> float:
    """Exact two-sided sign (McNemar) test on the probes only one side got right: the chance of a split at
    least this uneven if neither side were better."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


def summarise(probes: list[Probe], answers: list[dict], base_answers: list[dict] | None) -> dict[str, Any]:
    families: dict[str, dict[str, float]] = {}
    for i, (probe, answer) in enumerate(zip(probes, answers)):
        fam = families.setdefault(probe.family, {"n": 0, "correct": 0, "agree": 0})
        fam["n"] += 1
        fam["correct"] += answer["correct"]
        if base_answers is not None:
            fam["agree"] += answer["extracted"] == base_answers[i]["extracted"]
    correct = sum(a["correct"] for a in answers)
    result: dict[str, Any] = {
        "accuracy": correct / len(answers),
        "accuracy_ci95": wilson_interval(correct, len(answers)),
        "families": {k: {"n": v["n"], "accuracy": v["correct"] / v["n"], **({"agreement": v["agree"] / v["n"]} if base_answers else {})} for k, v in sorted(families.items())},
    }
    if base_answers is not None:
        result["agreement"] = sum(a["extracted"] == b["extracted"] for a, b in zip(answers, base_answers)) / len(answers)
        base_correct = sum(b["correct"] for b in base_answers)
        result["accuracy_vs_base"] = (correct / base_correct) if base_correct else None
        only_model = sum(a["correct"] and not b["correct"] for a, b in zip(answers, base_answers))
        only_base = sum(b["correct"] and not a["correct"] for a, b in zip(answers, base_answers))
        result["vs_base"] = {"only_model_right": only_model, "only_base_right": only_base, "sign_test_p": sign_test(only_model, only_base)}
    tokens = sum(a["tokens"] for a in answers)
    passes = sum(a["forward_passes"] for a in answers)
    result["tokens_per_forward"] = tokens / passes if passes else 0.0
    # Short answers bound tokens/forward: the EOS, which is not counted, must be revealed too.
    result["tokens_per_answer"] = tokens / len(answers) if answers else 0.0
    if all("revealed" in a for a in answers):  # the model's answers (the base's are one token a forward)
        revealed = sum(a["revealed"] for a in answers)
        result["parallel_share"] = (revealed - sum(a["steps"] for a in answers)) / revealed if revealed else 0.0
        result["topup_share"] = sum(a["topped_up"] for a in answers) / revealed if revealed else 0.0
    return result


AUP_ALPHA = 3.0  # d3LLM's penalty for accuracy below the reference


def accuracy_under_parallelism(points: list[tuple[float, float]], reference: float) -> float:
    """The area under accuracy (as a share of `reference`, weighted down where it falls short of it) over
    tokens per forward, from 0 to the most parallel setting: AUP as d3LLM defines it (Qian et al. 2025,
    "d3LLM"), with the weight W(y) = min(exp(-alpha (1 - y / reference)), 1) and the accuracy of the least
    parallel point held from 0 tokens/forward to it. One number for a threshold sweep that rewards speed only
    where accuracy holds: a setting at half the reference's accuracy adds about a quarter of its width."""
    if not points or reference <= 0:
        return 0.0
    weighted = sorted((tpf, min(acc / reference, 1.0) * min(math.exp(-AUP_ALPHA * (1 - acc / reference)), 1.0)) for tpf, acc in points)
    area = weighted[0][0] * weighted[0][1]
    for (x0, y0), (x1, y1) in zip(weighted, weighted[1:]):
        area += (x1 - x0) * (y0 + y1) / 2
    return area


def evaluate_probes(
    model_dir: Path,
    base_dir: Path | None,
    probes: list[Probe],
    thresholds: list[float],
    max_tokens: int,
    tolerance: float,
    device: str = "cpu",
    enable_thinking: bool | None = None,
    details: Path | None = None,
    engine: str = "reference",
    threads: int = 1,
    batch_size: int = 64,
    block_size: int | None = None,
    overrides: dict[str, Any] | None = None,
    base_answers_from: Path | None = None,
) -> dict[str, Any]:
    """The report of `evaluate-probes` (module docstring). `overrides`: decoding parameters (by DecodeParams
    field name) that replace the model's defaults in every threshold's run."""
    from .config import load_config
    from .decoding import DecodeParams
    from .model import load_transformer
    from .prompts import load_prompt_codec

    if engine not in ENGINES:
        raise A2DError(f"engine {engine!r} must be one of {ENGINES}")
    _, a2d, _ = load_config(model_dir)
    if a2d is None:
        raise A2DError(f"{model_dir}/config.json: not an a2d model (no a2d section); pass the converted model as --model")
    own_block = block_size is None or block_size == a2d.block_size
    block_size = a2d.block_size if block_size is None else block_size
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    codec = load_prompt_codec(model_dir)
    eos = set(a2d.eos_token_ids)
    prompts = [prompt_ids(codec, p, enable_thinking) for p in probes]
    records: list[dict[str, Any]] = []

    def record(kind: str, probe: Probe, answer: dict[str, Any]) -> dict[str, Any]:
        text = codec.decode(answer["tokens"])
        row = {"kind": kind, "family": probe.family, "prompt": probe.prompt, "text": text, "correct": is_correct(probe, text),
               "extracted": extracted(probe, text), **answer, "token_ids": list(answer["tokens"]), "tokens": len(answer["tokens"]),
               "max_tokens": max_tokens}
        records.append(row)
        return row

    base_answers = None
    report: dict[str, Any] = {}
    if base_answers_from is not None:
        base_answers = [record("base", probe, answer) for probe, answer in zip(probes, earlier_base_answers(base_answers_from, probes, max_tokens))]
        report["base"] = summarise(probes, base_answers, None)
        report["base_answers_from"] = {"path": str(base_answers_from), **lin.file_record(base_answers_from)}
    elif base_dir is not None:
        base_model, _, _ = load_transformer(base_dir, device)
        base_codec = load_prompt_codec(base_dir)
        for probe in probes:
            if base_codec.tokenizer.encode(probe.prompt).ids != codec.tokenizer.encode(probe.prompt).ids:
                raise A2DError(f"{base_dir}: its tokenizer differs from {model_dir}'s; pass the base the model was converted from")
        answered = ar_answers(base_model, prompts, max_tokens, eos, batch_size, threads)
        base_answers = [record("base", probe, {"tokens": tokens, "forward_passes": passes}) for probe, (tokens, passes) in zip(probes, answered)]
        report["base"] = summarise(probes, base_answers, None)
        del base_model
    # Every (threshold, probe) pair in one list, so the C++ engine loads once for all of them.
    per_threshold = [
        DecodeParams.from_defaults(a2d.decoding, block_size=block_size, max_tokens=max_tokens, eos_token_ids=a2d.eos_token_ids,
                                   **{**overrides, "threshold": t, "temperature": 0.0}).validate("--thresholds and the decoding flags")
        for t in thresholds
    ]
    all_prompts = [ids for _ in thresholds for ids in prompts]
    all_params = [p for p in per_threshold for _ in prompts]
    if engine == "cpu":
        decoded = engine_answers(model_dir, threads, all_prompts, all_params)
    else:
        decoded = reference_answers(model_dir, device, a2d, all_prompts, all_params, batch_size, threads)
    report["model"] = {}
    for i, threshold in enumerate(thresholds):
        rows = decoded[i * len(probes):(i + 1) * len(probes)]
        answers = [record(f"model@{threshold}", probe, answer) for probe, answer in zip(probes, rows)]
        report["model"][str(threshold)] = summarise(probes, answers, base_answers)
    report["block_size"] = block_size
    from .decoding import DecodingDefaults, written_decoding

    decoding = written_decoding({k: getattr(per_threshold[0], k) for k in DecodingDefaults.__dataclass_fields__ if k != "threshold"})
    report["decoding"] = decoding  # what every threshold's run shared: export --probes ships exactly this
    reference = report["base"]["accuracy"] if "base" in report else max(r["accuracy"] for r in report["model"].values())
    report["aup"] = {
        "value": accuracy_under_parallelism([(r["tokens_per_forward"], r["accuracy"]) for r in report["model"].values()], reference),
        "reference_accuracy": reference,
        "rule": f"d3LLM's accuracy under parallelism, alpha {AUP_ALPHA}, accuracy as a share of the {'base' if 'base' in report else 'best threshold'}'s",
    }
    if own_block:
        best = max(r["accuracy"] for r in report["model"].values())
        eligible = [(float(t), r) for t, r in report["model"].items() if r["accuracy"] >= best - tolerance]
        threshold, _ = max(eligible, key=lambda item: (item[1]["tokens_per_forward"], item[0]))
        report["recommended"] = {"threshold": threshold}
        report["rule"] = f"most tokens/forward among thresholds within {tolerance} accuracy of the best ({best:.4f})"
    else:
        # A diagnostic: a decoding the model cannot ship with (its block size is the model's).
        report["diagnostic"] = f"decoded with block size {block_size}, not the model's {a2d.block_size}"
    if details is not None:
        details.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return report


# --------------------------------------------------------------------------------------------- command


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "evaluate-probes",
        help="AR base vs converted model on checkable probes: accuracy, agreement, tokens/forward per threshold",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", type=Path, required=True, help="the converted a2d model folder")
    p.add_argument("--base", type=Path, help="the AR base folder it was converted from (omit to skip the base)")
    p.add_argument("--base-answers", type=Path, help="reuse the base's answers from this --details file of an earlier run on the same probes and --max-tokens (instead of --base)")
    p.add_argument("--probes", type=Path, help="JSONL of probes; default: the built-in generated set")
    p.add_argument("--per-family", type=int, default=8, help="built-in set: probes per family")
    p.add_argument("--seed", type=int, default=0, help="built-in set: generation seed")
    p.add_argument("--thresholds", default="0.9,0.7,0.5", help="comma-separated decoding thresholds to compare")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--tolerance", type=float, default=0.02, help="accuracy slack when recommending a threshold")
    p.add_argument("--engine", choices=ENGINES, default="reference",
                   help="the converted model's decoder: the PyTorch reference, or the C++ CPU engine (same tokens, much faster; needs `npm run build`)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the AR base, and the model with --engine reference)")
    p.add_argument("--threads", type=int, default=1, help="torch (and C++ engine) CPU threads, and threads for the decoders' per-sequence work (default 1: tiny models run fastest on one)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="sequences decoded together by the PyTorch reference (AR base and --engine reference); the same answers as one by one (1), far fewer forwards (default: %(default)s)")
    p.add_argument("--no-think", action="store_true", help="render chats with enable_thinking=false")
    p.add_argument("--block-size", type=int,
                   help="decode with this block size instead of the model's (a diagnostic: the report then recommends no decoding)")
    p.add_argument("--remasking", choices=REMASKING, help="decode with this remasking instead of the model's default (docs/decoding.md)")
    p.add_argument("--advance", choices=ADVANCE, help="decode with this window policy instead of the model's default (docs/decoding.md)")
    p.add_argument("--min-per-step", type=int, help="decode with this floor of reveals per step instead of the model's default")
    p.add_argument("--reveal-order", choices=DECODING_PARAMETERS["reveal_order"]["choices"],
                   help="decode with this reveal order instead of the model's default (docs/decoding.md)")
    p.add_argument("--out", type=Path, required=True, help="JSON report to write")
    p.add_argument("--details", type=Path, help="also write every answer as JSONL")
    p.set_defaults(run=run)
    add_rank_parser(subparsers)


def run(args) -> int:
    import torch

    if args.threads < 1:
        raise A2DError(f"--threads {args.threads} must be at least 1")
    if args.batch_size < 1:
        raise A2DError(f"--batch-size {args.batch_size} must be at least 1")
    torch.set_num_threads(args.threads)
    probes = read_probes(args.probes) if args.probes else generated_probes(args.per_family, args.seed)
    try:
        thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
    except ValueError:
        raise A2DError(f"--thresholds {args.thresholds!r}: give numbers like 0.9,0.7") from None
    if not thresholds:
        raise A2DError("--thresholds: give at least one threshold")
    report = evaluate_probes(
        args.model, args.base, probes, thresholds, args.max_tokens, args.tolerance, args.device,
        False if args.no_think else None, args.details, args.engine, args.threads, args.batch_size, args.block_size,
        {"remasking": args.remasking, "advance": args.advance, "min_per_step": args.min_per_step,
         "reveal_order": args.reveal_order}, args.base_answers,
    )
    report["probes"] = {
        "source": str(args.probes) if args.probes else f"built-in, seed {args.seed}, {args.per_family} per family",
        **(lin.file_record(args.probes) if args.probes else {}),
        "count": len(probes),
        "families": sorted({p.family for p in probes}),
    }
    report["model_dir"] = str(args.model)
    report["base_dir"] = str(args.base) if args.base else None
    write_json(args.out, report)
    summary = {t: {k: r.get(k) for k in ("accuracy", "accuracy_vs_base", "agreement", "tokens_per_forward", "tokens_per_answer", "parallel_share", "topup_share")}
               for t, r in report["model"].items()}
    print(json.dumps({"base_accuracy": report.get("base", {}).get("accuracy"), "model": summary, "aup": report["aup"]["value"],
                      "recommended": report.get("recommended"), **({"diagnostic": report["diagnostic"]} if "diagnostic" in report else {})}, indent=2))
    return 0


# ---------------------------------------------------------------------------------- ranking of reports

# What a converted model must reach at its recommended threshold (the demo model's goal).
GOAL_VS_BASE = 0.9
GOAL_TOKENS_PER_FORWARD = 2.0


def rank_reports(paths: list[Path]) -> list[dict[str, Any]]:
    """Probe reports of candidate models (training variants, checkpoints of one run), best first: those that
    meet the goal at their recommended threshold, then accuracy there, then tokens per forward."""
    ranked = []
    for path in paths:
        report = read_json(path)
        if "recommended" not in report:
            raise A2DError(f"{path}: a report without a recommended threshold (a diagnostic?) cannot be ranked")
        threshold = report["recommended"]["threshold"]
        row = report["model"][str(threshold)]  # the report's keys are str() of the same floats
        entry = {
            "path": str(path),
            "threshold": threshold,
            "accuracy": row["accuracy"],
            "accuracy_vs_base": row.get("accuracy_vs_base"),
            "tokens_per_forward": row["tokens_per_forward"],
            "aup": report.get("aup", {}).get("value"),
        }
        entry["meets_goal"] = (entry["accuracy_vs_base"] or 0) >= GOAL_VS_BASE and entry["tokens_per_forward"] >= GOAL_TOKENS_PER_FORWARD
        ranked.append(entry)
    ranked.sort(key=lambda e: (e["meets_goal"], round(e["accuracy"], 4), e["tokens_per_forward"]), reverse=True)
    return ranked


def add_rank_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "rank-probes",
        help="rank evaluate-probes reports of candidate models; prints the best report's path",
        description=rank_reports.__doc__,
    )
    p.add_argument("reports", type=Path, nargs="+", help="evaluate-probes reports (JSON)")
    p.add_argument("--out", type=Path, help="also write the ranking as JSON")
    p.set_defaults(run=run_rank)


def run_rank(args) -> int:
    ranked = rank_reports(args.reports)
    for e in ranked:
        vs = f" ({e['accuracy_vs_base']:.2f} of the base)" if e["accuracy_vs_base"] is not None else ""
        aup = f", AUP {e['aup']:.3f}" if e["aup"] is not None else ""
        print(f"{e['path']}: threshold {e['threshold']}, accuracy {e['accuracy']:.3f}{vs}, "
              f"{e['tokens_per_forward']:.2f} tokens/forward{aup}{', meets the goal' if e['meets_goal'] else ''}", file=sys.stderr)
    if args.out is not None:
        write_json(args.out, ranked)
    print(ranked[0]["path"])
    return 0
