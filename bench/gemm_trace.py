"""Where a forward's GEMM time goes, block by block, on the MiniCPM5-2B shape (random weights).

Needs the trace build of the GPU harness (`TRACE=1 bash bench/stage-device.sh` puts it in
build/device/trace/): its decode GEMM kernels write one record per block (engine/cuda/trace.cuh: start, end
of the wait for the previous kernel, first weights multiplied, main loop done, warps reduced, end, on one
nanosecond clock for all SMs), and so does the warpgroup GEMM of forwards on the prefill GEMMs (`--rows 40
--tunings dp33`: ModelOptions::decode_prefill_gemm_rows; there "reduced" is the split published, or in the
tile's last block every split summed). For each traced forward this prints, per GEMM of a layer (median
over the 42 layers) and for the lm_head: the kernel's span from its first block's start to its last block's
end, its bytes over that span, the gap to the previous GEMM and the median block's phases; and saves every
record (records-*.npz).

    python3 bench/gemm_trace.py --lib build/device/trace/liba2d_cuda_bench.so --out $OUT
"""
import argparse
import ctypes
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_check import ALL_KERNELS, GEMM_KERNELS, MINICPM, Engine, Lib, log, make_weights, parse_tuning, tuning_label  # noqa: E402

RECORD = np.dtype([("start", "<u8"), ("waited", "<u8"), ("first_data", "<u8"), ("loop_done", "<u8"),
                   ("reduced", "<u8"), ("end", "<u8"), ("sm", "<i4"), ("site", "<i4"), ("tile", "<i4"),
                   ("split", "<i4")])
KINDS = ("qkv", "o", "gate_up", "down")


def site_bytes(cfg):
    H, I, D = cfg["hidden"], cfg["inter"], cfg["head_dim"]
    return {"qkv": (cfg["heads"] + 2 * cfg["kv_heads"]) * D * H * 2, "o": H * cfg["heads"] * D * 2,
            "gate_up": 2 * I * H * 2, "down": H * I * 2, "lm_head": cfg["vocab"] * H * 2}


def sites_of(kind_index, layers):
    """The forward's GEMM sites of one kind (model.cu: 4 * layer + kind; the lm_head is 4 * layers)."""
    return [4 * layers] if kind_index == len(KINDS) else [4 * l + kind_index for l in range(layers)]


def trace(engine, kernels, cached, rows, capacity=400_000):
    buf = np.zeros(capacity, dtype=RECORD)
    count = ctypes.c_int()
    engine.lib.call("a2d_bench_trace", engine.handle, ctypes.c_uint(kernels), cached, rows, capacity,
                    ctypes.c_void_p(buf.ctypes.data), ctypes.byref(count))
    if count.value > capacity:
        log(f"  {count.value} records, {capacity} kept")
    return buf[:min(count.value, capacity)]


def analyse(rec, cfg):
    """Per GEMM kind: median over layers of span, bandwidth over span, gap after the previous GEMM, and the
    median block's phase durations (us)."""
    layers = cfg["layers"]
    nbytes = site_bytes(cfg)
    t0 = rec["start"].min()
    sites = {}
    for s in np.unique(rec["site"]):
        r = rec[rec["site"] == s]
        sites[int(s)] = r
    ends = {s: int(r["end"].max()) for s, r in sites.items()}
    rows = {}
    for kind_index, kind in enumerate(list(KINDS) + ["lm_head"]):
        site_list = sites_of(kind_index, layers)
        stats = []
        for s in site_list:
            if s not in sites:
                continue
            r = sites[s]
            span = (int(r["end"].max()) - int(r["start"].min())) / 1e3
            busy = (int(r["end"].max()) - int(r["waited"].min())) / 1e3
            prev = ends.get(s - 1)
            gap = (int(r["waited"].min()) - prev) / 1e3 if prev is not None else float("nan")
            first_data = (int(r["first_data"].min()) - prev) / 1e3 if prev is not None else float("nan")
            # The tail: from the time 90 % of the blocks have ended to the last end.
            tail = (int(r["end"].max()) - float(np.percentile(r["end"].astype(np.float64), 90))) / 1e3
            per_sm_last = np.array([r["end"][r["sm"] == sm].max() for sm in np.unique(r["sm"])], dtype=np.float64)
            stats.append(dict(
                blocks=len(r), span=span, busy=busy, gap=gap, first_data_after_prev=first_data, tail90=tail,
                sm_end_spread=(per_sm_last.max() - np.median(per_sm_last)) / 1e3,
                wait=np.median((r["waited"] - r["start"]).astype(np.int64)) / 1e3,
                to_data=np.median((r["first_data"].astype(np.int64) - r["waited"].astype(np.int64))) / 1e3,
                loop=np.median((r["loop_done"].astype(np.int64) - r["first_data"].astype(np.int64))) / 1e3,
                reduce=np.median((r["reduced"].astype(np.int64) - r["loop_done"].astype(np.int64))) / 1e3,
                finish=np.median((r["end"].astype(np.int64) - r["reduced"].astype(np.int64))) / 1e3,
                block=np.median((r["end"].astype(np.int64) - r["start"].astype(np.int64))) / 1e3,
                blocks_per_sm_max=int(np.bincount(r["sm"]).max()),
            ))
        if not stats:
            continue
        med = {k: float(np.nanmedian([x[k] for x in stats])) for k in stats[0]}
        med["TBps_over_span"] = nbytes[kind] / (med["span"] * 1e-6) / 1e12
        rows[kind] = med
    total = (int(rec["end"].max()) - int(t0)) / 1e3
    return rows, total


def print_table(label, rows, total, lines):
    head = (f"{label}: first GEMM block start to last GEMM block end {total:.1f} us; per GEMM (median over layers), us:")
    lines.append(head)
    cols = ["blocks", "span", "TBps_over_span", "gap", "first_data_after_prev", "tail90", "sm_end_spread",
                    "block", "wait", "to_data", "loop", "reduce", "finish", "blocks_per_sm_max"]
    lines.append("  kind     " + " ".join(f"{c[:12]:>12s}" for c in cols))
    for kind, med in rows.items():
        lines.append(f"  {kind:8s} " + " ".join(f"{med[c]:12.2f}" for c in cols))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--kv", type=int, default=1024)
    parser.add_argument("--tunings", default="default;s8",
                        help="tunings as cuda_check.py labels them (tuning_label: 's8 b2 wf0'), ';' between them")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cfg = dict(MINICPM)
    lib = Lib(args.lib)
    W = make_weights(cfg, seed=2026)
    engine = Engine(lib, cfg)
    engine.upload(W)
    del W
    torch.cuda.empty_cache()
    engine.fill_kv()
    lines, summary = [], {}
    for text in args.tunings.split(";"):
        tuning = parse_tuning(text)
        for kernels, what in ((GEMM_KERNELS, "gemm-only"), (ALL_KERNELS, "whole forward")):
            engine.reconfigure(tuning)
            engine.run_only(kernels)
            ms, _ = engine.time(args.kv, 0, args.rows, args.rows, iterations=20)
            rec = trace(engine, kernels, args.kv, args.rows)
            ms_after, _ = engine.time(args.kv, 0, args.rows, args.rows, iterations=20)
            name = f"{what} {tuning_label(tuning)} rows {args.rows} kv {args.kv}"
            tag = f"{what}-{tuning_label(tuning)}".replace(" ", "-")
            np.savez_compressed(os.path.join(args.out, f"records-{tag}.npz"), records=rec)
            rows, total = analyse(rec, cfg)
            lines.append(f"{name}: {ms:.3f} ms per forward (the trace build, trace off), {ms_after:.3f} after "
                         f"tracing; {len(rec)} block records")
            print_table(name, rows, total, lines)
            summary[name] = dict(ms=ms, records=len(rec), span_us=total, per_kind=rows)
            log("\n".join(lines[-(len(rows) + 3):]))
    engine.close()
    with open(os.path.join(args.out, "trace-summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    with open(os.path.join(args.out, "trace.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
