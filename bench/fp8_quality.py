"""FP8 weights against bf16 on one model folder, on the CPU (bench/NOTES.md, "FP8 weights: quality"):

    .venv/bin/python bench/fp8_quality.py --model .cache/demo/model --work /tmp/fp8-quality [--threads 2]

1. `quantize` writes the FP8 folder (per-row scales); the weight error of each projection family,
   ||W - deq(W)|| / ||W||, for those per-row scales and for per-128-column-block ones (the alternative the
   format did not take), and how many weights fall below e4m3's normal range;
2. logits of the fp32 reference on fixed prompts (the open prompts, convert/recipes/open-prompts.jsonl, as
   chats; one forward each: the prompt committed and a window of B masks): the FP8 model and the 128-block
   variant against the bf16 model, per row: relative error, KL(bf16 || fp8) with the mask token excluded,
   and whether the argmax agrees; prompt rows and mask rows apart;
3. `evaluate-probes --engine cpu` (the C++ engine) on both folders with the same decoding (--remasking:
   low_confidence by default, the rule every build keeps; `default` takes the model's own): accuracy and
   tokens per forward per threshold on the built-in probes, the share of answers whose text is identical,
   and tokens per forward on the open prompts (--no-open: skipped).
Prints markdown tables and writes WORK/quality-REMASKING.json. --probes-only: step 3 alone (on WORK/fp8 when it
is there).
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "convert"))
from a2d_convert.model import BlockForward, load_transformer  # noqa: E402
from a2d_convert.prompts import load_prompt_codec  # noqa: E402
from a2d_convert.quantize import E4M3_MAX, quantize_folder, quantize_rows  # noqa: E402
from a2d_convert.weights import quantized_names  # noqa: E402

OPEN_PROMPTS = REPO / "convert" / "recipes" / "open-prompts.jsonl"
FAMILIES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def block_dequantized(w, block=128):
    """w through e4m3 with one scale per row and 128-column block (max |w| / 448 of the block)."""
    rows, cols = w.shape
    pad = (-cols) % block
    blocks = torch.nn.functional.pad(w.float(), (0, pad)).view(rows, -1, block)
    amax = blocks.abs().amax(dim=2, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (blocks / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).view(rows, -1)[:, :cols]


def weight_errors(model):
    """Per family: relative error with per-row and with per-128-block scales, and the share of weights whose
    e4m3 code is subnormal or zero while the weight is not (below 2^-6 x the row's scale)."""
    cfg = model.config
    params = dict(model.named_parameters())
    if cfg.tie_word_embeddings:
        params["lm_head.weight"] = params["model.embed_tokens.weight"]
    sums = {f: [0.0, 0.0, 0.0, 0, 0] for f in FAMILIES}
    for name in quantized_names(cfg) + (["lm_head.weight"] if cfg.tie_word_embeddings else []):
        family = next(f for f in FAMILIES if f in name)
        w = params[name].detach().float()
        q, scale = quantize_rows(w)
        row = q.float() * scale[:, None]
        s = sums[family]
        s[0] += float((w - row).pow(2).sum())
        s[1] += float((w - block_dequantized(w)).pow(2).sum())
        s[2] += float(w.pow(2).sum())
        s[3] += int(((q.float().abs() < 2**-6) & (w != 0)).sum())
        s[4] += w.numel()
    return {f: dict(per_row=(s[0] / s[2]) ** 0.5, per_block128=(s[1] / s[2]) ** 0.5, below_normal=s[3] / s[4])
            for f, s in sums.items() if s[4]}


def logits_rows(model, codec, a2d, prompts):
    """fp32 logits [rows, vocab] of one forward per prompt: the chat prompt committed, then B masks; and the
    index of the first mask row of each prompt's block."""
    out, mask_rows, start = [], [], 0
    for text in prompts:
        ids = codec.encode_chat([{"role": "user", "content": text}])
        window = [a2d.mask_token_id] * a2d.block_size
        rows = list(range(len(ids) + len(window)))
        out.append(BlockForward(model)(ids, window, rows))
        mask_rows += list(range(start + len(ids), start + len(rows)))
        start += len(rows)
    return torch.cat(out), mask_rows


def compare_logits(want, got, mask_token):
    want, got = want.double().clone(), got.double().clone()
    rel = (got - want).norm(dim=-1) / want.norm(dim=-1)
    want[:, mask_token] = got[:, mask_token] = float("-inf")
    p, log_q = want.softmax(-1), got.log_softmax(-1)
    kl = (p * (want.log_softmax(-1) - log_q)).nan_to_num(0.0).sum(-1)
    return rel, kl, want.argmax(-1) == got.argmax(-1)


def summarise(rel, kl, agree):
    return dict(rows=len(rel), rel_err_median=float(rel.median()), rel_err_max=float(rel.max()), kl_mean=float(kl.mean()),
                kl_max=float(kl.max()), argmax_agree=float(agree.double().mean()))


def run_probes(model_dir, out, details, args, probes=None, max_tokens=None):
    cmd = [sys.executable, "-m", "a2d_convert", "evaluate-probes", "--model", str(model_dir), "--engine", "cpu",
           "--threads", str(args.threads), "--thresholds", args.thresholds, "--max-tokens", str(max_tokens or args.max_tokens),
           "--out", str(out), "--details", str(details)]
    if args.remasking != "default":
        cmd += ["--remasking", args.remasking]
    cmd += ["--probes", str(probes)] if probes else ["--per-family", str(args.per_family)]
    started = time.time()
    subprocess.run(cmd, check=True, cwd=REPO, capture_output=True, text=True)
    return json.loads(out.read_text()), time.time() - started


def same_texts(a, b):
    """Per threshold: the share of probes whose answer text is identical in two --details files."""
    rows = {}
    for path, key in ((a, 0), (b, 1)):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            rows.setdefault((r["kind"], r["prompt"]), [None, None])[key] = r["text"]
    by_kind = {}
    for (kind, _), (x, y) in rows.items():
        by_kind.setdefault(kind, []).append(x == y)
    return {kind.split("@")[1]: sum(v) / len(v) for kind, v in by_kind.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True, help="a bf16 a2d model folder")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-family", type=int, default=32)
    parser.add_argument("--thresholds", default="0.9,0.7")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--remasking", default="low_confidence", help="evaluate-probes --remasking, or `default`: the model's own")
    parser.add_argument("--no-open", action="store_true", help="skip the open prompts' tokens/forward")
    parser.add_argument("--skip-probes", action="store_true")
    parser.add_argument("--probes-only", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    fp8_dir = args.work / "fp8"
    started = time.time()
    if not (args.probes_only and (fp8_dir / "lineage.json").is_file()):
        quantize_folder(args.model, fp8_dir, force=True)
    result = {"model": str(args.model), "quantize_s": time.time() - started, "remasking": args.remasking}
    prompts = [json.loads(line)["prompt"] for line in OPEN_PROMPTS.read_text().splitlines() if line.strip()]
    if not args.probes_only:
        weights_and_logits(args, fp8_dir, prompts, result)
    if not args.skip_probes:
        probes(args, fp8_dir, prompts, result)
    out = args.work / f"quality-{args.remasking}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{out} ({time.time() - started:.0f} s)")


def weights_and_logits(args, fp8_dir, prompts, result):
    bf16, cfg, a2d = load_transformer(args.model)
    result["weights"] = weight_errors(bf16)
    print("| family | per-row scales | per-128-block scales | weights below e4m3's normal range (per row) |")
    print("|---|---|---|---|")
    for family, e in result["weights"].items():
        print(f"| {family} | {e['per_row']:.4f} | {e['per_block128']:.4f} | {e['below_normal']:.2e} |")

    codec = load_prompt_codec(args.model)
    want, mask_rows = logits_rows(bf16, codec, a2d, prompts)
    fp8, _, _ = load_transformer(fp8_dir)
    got, _ = logits_rows(fp8, codec, a2d, prompts)
    del fp8
    with torch.no_grad():  # the 128-block variant, in memory
        params = dict(bf16.named_parameters())
        for name in quantized_names(cfg):
            params[name].copy_(block_dequantized(params[name]))
        if cfg.tie_word_embeddings:  # as quantize does: the head alone, the embedding kept
            bf16.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            bf16.lm_head.weight = torch.nn.Parameter(block_dequantized(params["model.embed_tokens.weight"]))
    block, _ = logits_rows(bf16, codec, a2d, prompts)
    prompt_rows = [r for r in range(len(want)) if r not in set(mask_rows)]
    result["logits"] = {}
    for label, other in (("fp8 per-row (the format)", got), ("fp8 per-128-block", block)):
        rel, kl, agree = compare_logits(want, other, a2d.mask_token_id)
        result["logits"][label] = {part: summarise(rel[rows], kl[rows], agree[rows])
                                   for part, rows in (("prompt rows", prompt_rows), ("mask rows", mask_rows))}
    print(f"\nlogits against the bf16 model's (fp32 reference, {len(prompts)} open prompts as chats, block {a2d.block_size}):\n")
    print("| weights | rows | n | rel err median / max | KL(bf16 \\|\\| fp8) mean / max | argmax agrees |")
    print("|---|---|---|---|---|---|")
    for label, parts in result["logits"].items():
        for part, s in parts.items():
            print(f"| {label} | {part} | {s['rows']} | {s['rel_err_median']:.4f} / {s['rel_err_max']:.4f} | "
                  f"{s['kl_mean']:.2e} / {s['kl_max']:.2e} | {s['argmax_agree']:.4f} |")



def probes(args, fp8_dir, prompts, result):
    tag = args.remasking
    result["probes"], result["open_prompts"] = {}, {}
    for label, folder in (("bf16", args.model), ("fp8", fp8_dir)):
        report, seconds = run_probes(folder, args.work / f"probes-{tag}-{label}.json", args.work / f"details-{tag}-{label}.jsonl", args)
        result["probes"][label] = dict(seconds=seconds, **{t: dict(accuracy=r["accuracy"], tokens_per_forward=r["tokens_per_forward"])
                                                            for t, r in report["model"].items()})
        if args.no_open:
            continue
        report, seconds = run_probes(folder, args.work / f"open-{tag}-{label}.json", args.work / f"open-details-{tag}-{label}.jsonl", args,
                                     OPEN_PROMPTS, 128)
        result["open_prompts"][label] = dict(seconds=seconds, **{t: dict(tokens_per_forward=r["tokens_per_forward"])
                                                                  for t, r in report["model"].items()})
    result["identical_answers"] = same_texts(args.work / f"details-{tag}-bf16.jsonl", args.work / f"details-{tag}-fp8.jsonl")
    if not args.no_open:
        result["identical_open_answers"] = same_texts(args.work / f"open-details-{tag}-bf16.jsonl", args.work / f"open-details-{tag}-fp8.jsonl")
    n = 7 * args.per_family
    print(f"\nevaluate-probes --engine cpu, remasking {args.remasking}, {n} built-in probes ({args.max_tokens} tokens)"
          + ("" if args.no_open else f", {len(prompts)} open prompts (128 tokens)") + ":\n")
    print("| threshold | accuracy bf16 / fp8 | tokens/forward bf16 / fp8 | identical answers | open prompts: tokens/forward bf16 / fp8 | identical |")
    print("|---|---|---|---|---|---|")
    for t in args.thresholds.split(","):
        key = str(float(t))
        b, f = result["probes"]["bf16"][key], result["probes"]["fp8"][key]
        open_cells = "- | -"
        if not args.no_open:
            ob, of = result["open_prompts"]["bf16"][key], result["open_prompts"]["fp8"][key]
            open_cells = f"{ob['tokens_per_forward']:.3f} / {of['tokens_per_forward']:.3f} | {result['identical_open_answers'][key]:.3f}"
        print(f"| {key} | {b['accuracy']:.4f} / {f['accuracy']:.4f} | {b['tokens_per_forward']:.3f} / {f['tokens_per_forward']:.3f} | "
              f"{result['identical_answers'][key]:.3f} | {open_cells} |")


if __name__ == "__main__":
    main()
