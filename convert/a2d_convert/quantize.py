"""`quantize`: an a2d model folder -> the same model with FP8 (e4m3) weights (docs/model-format.md, "FP8").

Weight-only and static: every projection (q, k, v, o, gate, up, down) and the lm_head becomes e4m3
with one fp32 scale per output row, computed from the bf16 weights alone (no calibration data). The
scale is the one of max|w| / 448 x 2^(i/16), i = 0..15, that gives the row the least squared error: the
row's largest weight lands in (224, 448] (448 is e4m3's largest finite value), never clipped, and the
others keep e4m3's 3-bit mantissa over its whole range (subnormals start 2^15 below the largest). e4m3
is a floating-point format, so the scale does not change the precision of most weights, only where
they fall between its steps; trying the phases keeps the largest weights on exact or near steps:
on the bundled model 7 % less weight error than max / 448 alone (bench/NOTES.md, "FP8 weights:
quality"). A row of zeros gets scale 1. The matrix a backend multiplies is e4m3(w / scale) * scale in
fp32 (weights.dequantize), the same in the reference, the CPU backend and the CUDA backend's epilogue.

Why per output row and not per 128-column block: a per-row scale costs the GEMM nothing (the epilogue
multiplies each finished dot product), where block scales would have to scale partial sums inside the
K loop and add 1.6-3 % to the bytes streamed. bench/NOTES.md has both measured on the bundled model.

Everything else is kept as it is: the embedding (its rows are gathered, not streamed), norms, biases
and a mask adapter's factors. A model with tied embeddings is untied: the lm_head becomes an FP8 copy
of the embedding and `tie_word_embeddings` turns false, so the lm_head streams half the bytes too.
The output is written beside --out and renamed into place, with a `quantize` stage appended to the
lineage (its inputs the source files, chained to the stages that wrote them).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from . import lineage as lin
from .config import PRECISIONS, load_config, read_json, write_json
from .errors import A2DError
from .tiny import staged_out_dir
from .weights import INDEX_FILE, SCALE_SUFFIX, WEIGHTS_FILE, check_tensors, quantized_names, read_tensors

FORMAT = "fp8-e4m3"
E4M3_MAX = 448.0
SCALE_STEPS = 16  # candidate scales per row: max|w| / 448 x 2^(i / SCALE_STEPS)


def quantize_rows(weight):
    """(e4m3 weight, fp32 scale [rows]) of a 2-D weight: per row, the candidate scale with the least squared
    error (the first on ties; 1 for a zero row)."""
    import torch

    w = weight.to(torch.float32)
    amax = w.abs().amax(dim=1)
    base = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    best_codes = best_scale = best_error = None
    for i in range(SCALE_STEPS):
        scale = base * 2.0 ** (i / SCALE_STEPS)
        q = (w / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        error = (q.to(torch.float32) * scale[:, None] - w).pow(2).sum(dim=1)
        codes = q.view(torch.uint8)  # torch.where has no float8 kernel on every device
        if best_error is None:
            best_codes, best_scale, best_error = codes, scale, error
        else:
            better = error < best_error
            best_codes = torch.where(better[:, None], codes, best_codes)
            best_scale = torch.where(better, scale, best_scale)
            best_error = torch.where(better, error, best_error)
    return best_codes.view(torch.float8_e4m3fn), best_scale


def quantize_tensors(tensors: dict, cfg) -> tuple[dict, bool]:
    """The FP8 folder's tensors from a float folder's, and whether the lm_head was untied from the embedding."""
    out = dict(tensors)
    untie = cfg.tie_word_embeddings
    if untie:
        out["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    names = quantized_names(cfg) + (["lm_head.weight"] if untie else [])
    for name in names:
        out[name], out[name + SCALE_SUFFIX] = quantize_rows(out[name])
    return out, untie


def chained_inputs(source: Path, chain: dict) -> dict:
    """The source folder's files as this stage's inputs, each linked to the stage that wrote it: the previous
    stage (`from_previous`), or an earlier one no later stage rewrote (`from_stage`, its index)."""
    stages = chain.get("stages", [])
    inputs = {}
    for name, rec in lin.hash_folder(source).items():
        writer = next((i for i in range(len(stages) - 1, -1, -1) if name in stages[i].get("outputs", {})), None)
        if writer is None:
            inputs[name] = rec
        elif writer == len(stages) - 1:
            inputs[name] = {**rec, "from_previous": True}
        else:
            inputs[name] = {**rec, "from_stage": writer}
    return inputs


def check_shipped(source: Path, chain: dict) -> None:
    """A folder with a lineage must hold the files it records, or the new chain would describe other weights."""
    for name, rec in chain.get("shipped", {}).get("files", {}).items():
        path = source / name
        if not path.is_file() or lin.sha256_file(path) != rec["sha256"]:
            raise A2DError(f"{path}: not the file {source / lin.LINEAGE_FILE} records; run `verify {source}` and restore it first")


def quantize_folder(model: Path, out: Path, fmt: str = FORMAT, force: bool = False) -> Path:
    model, out = Path(model), Path(out)
    if fmt != FORMAT:
        raise A2DError(f"--format {fmt!r}: quantize writes {FORMAT} (the other precision, {PRECISIONS[0]}, is what it reads)")
    cfg, a2d, raw = load_config(model)
    if a2d is None:
        raise A2DError(f"{model}: no a2d section in config.json; quantize takes an a2d model folder (make one with `init`)")
    if a2d.precision != PRECISIONS[0]:
        raise A2DError(f"{model}: already {a2d.precision}; quantize takes a bf16 model folder")
    if out.resolve() == model.resolve() or out.resolve().is_relative_to(model.resolve()):
        raise A2DError(f"--out {out} is the model folder or inside it; choose an output folder outside {model}")
    chain = lin.read_lineage_or_root(model)
    check_shipped(model, chain)
    tensors = read_tensors(model)
    check_tensors(tensors, cfg, model, a2d)
    with staged_out_dir(out, force) as work:
        quantized, untied = quantize_tensors(tensors, cfg)
        lin.save_tensors(work / WEIGHTS_FILE, quantized, {"format": "pt"})
        config = json.loads(json.dumps(raw))
        config["a2d"]["precision"] = fmt
        if untied:
            config["tie_word_embeddings"] = False
        write_json(work / "config.json", config)
        weight_files = {WEIGHTS_FILE, INDEX_FILE, *(p.name for p in model.glob("*.safetensors"))}
        for path in sorted(model.iterdir()):
            if path.name in weight_files or path.name in ("config.json", lin.LINEAGE_FILE):
                continue
            if path.is_dir():
                shutil.copytree(path, work / path.name)
            else:
                shutil.copyfile(path, work / path.name)
        cfg_out, a2d_out, _ = load_config(work)  # the folder must read back as a valid FP8 model
        check_tensors(read_tensors(work), cfg_out, work, a2d_out)
        stage = lin.make_stage(
            "quantize",
            config={
                "source": str(model.resolve()),
                "format": fmt,
                "scale": f"per output row, fp32: of max|w| / 448 x 2^(i/{SCALE_STEPS}), i < {SCALE_STEPS}, the least squared error",
                "tensors": len(quantized_names(cfg_out)),
                "untied_lm_head": untied,
            },
            inputs=chained_inputs(model, chain),
            outputs=lin.hash_folder(work),
        )
        lineage = lin.append_stage(chain, stage)
        lineage["shipped"] = {"files": lin.hash_folder(work), "weights_sha256": lin.sha256_file(work / WEIGHTS_FILE)}
        lin.write_lineage(work, lineage)
    return out


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "quantize",
        help="write an FP8 (e4m3, per-row scales) copy of an a2d model folder, recorded in its lineage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", type=Path, required=True, help="the bf16 a2d model folder")
    p.add_argument("--out", type=Path, required=True, help="the FP8 model folder to write")
    p.add_argument("--format", default=FORMAT, choices=[FORMAT], help="the weight format to write")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    p.set_defaults(run=run)


def run(args) -> int:
    out = quantize_folder(args.model, args.out, args.format, args.force)
    shipped = read_json(out / lin.LINEAGE_FILE)["shipped"]
    print(json.dumps({"out": str(out), "format": args.format, "weights_sha256": shipped["weights_sha256"]}))
    return 0
