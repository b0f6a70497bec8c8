"""Where a forward's GEMM time goes, block by block, on the MiniCPM5-2B shape (random weights).

Needs the trace build of the GPU harness (`TRACE=1 bash bench/stage-device.sh` puts it in
build/device/trace/): its decode GEMM kernels write one record per block, the wide kernel (forwards of 32 rows and
more) one per warp, so its `blocks` count warps (engine/cuda/trace.cuh: start, end
of the wait for the previous kernel, first weights multiplied, main loop done, warps reduced, end, on one
nanosecond clock for all SMs), and so does the warpgroup GEMM of forwards on the prefill GEMMs (`--rows 40
--tunings dp33`: ModelOptions::decode_prefill_gemm_rows; there "reduced" is the split published, or in the
tile's last block every split summed). For each traced forward this prints, per GEMM of a layer (median
over the 42 layers) and for the lm_head: the kernel's span from its first block's start to its last block's
end, its bytes over that span, the gap to the previous GEMM and the median block's phases; and saves every
record (records-*.npz). `--adapter window:64` gives every projection a random row adapter of that rule and rank
(its tiles fused into the GEMMs, recorded with tile -1 - i): each GEMM then also shows when its last adapter tile
ended (from the GEMM's first block start) and the weight tiles' epilogue blocks' finish (their split merge, the wait
for t, B t and the epilogue), which beside a run without the adapter say where the adapter's time goes.

    python3 bench/gemm_trace.py --lib build/device/trace/liba2d_cuda_bench.so --out $OUT
    python3 bench/gemm_trace.py --lib build/device/trace/liba2d_cuda_bench.so --out $OUT --tunings default --adapter window:64

`--prefill ROWS` traces one prompt's prefill call of that many rows after `--kv` cached instead (the warpgroup GEMM's
blocks, one record each; TFLOP/s over each GEMM's span beside the phases): where a long prompt's GEMMs lose their
time, at the ring's fill, in the K loop or in the epilogue.

    python3 bench/gemm_trace.py --lib build/device/trace/liba2d_cuda_bench.so --out $OUT --prefill 1023 --kv 0 --tunings default
"""
import argparse
import ctypes
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_check import (ADAPTER_TARGETS, ALL_KERNELS, GEMM_KERNELS, MINICPM, Engine, Lib, log, make_weights,  # noqa: E402
                        parse_tuning, random_adapter, tuning_label)

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


def adapter_factors(cfg, rank, seed=77):
    """Random row adapter factors for every projection of every layer: (target, layer) -> (a [rank, in], b [out,
    rank]) (cuda_check.random_adapter)."""
    H, I, D = cfg["hidden"], cfg["inter"], cfg["head_dim"]
    nq, nkv = cfg["heads"] * D, cfg["kv_heads"] * D
    dims = {"q": (nq, H), "k": (nkv, H), "v": (nkv, H), "o": (H, nq), "gate": (I, H), "up": (I, H), "down": (H, I)}
    g = torch.Generator().manual_seed(seed)
    return {(target, layer): random_adapter(rank, *dims[target], g)
            for layer in range(cfg["layers"]) for target in ADAPTER_TARGETS}


def parse_adapter(text):
    """'window:64' -> ('window', 64); '' -> None."""
    if not text:
        return None
    rule, _, rank = text.partition(":")
    if rule not in ("window", "mask") or not rank.isdigit() or int(rank) < 1:
        raise SystemExit(f"--adapter {text!r}: RULE:RANK, RULE window or mask, RANK a positive number (window:64)")
    return rule, int(rank)


def trace(engine, kernels, cached, rows, capacity=400_000):
    buf = np.zeros(capacity, dtype=RECORD)
    count = ctypes.c_int()
    engine.lib.call("a2d_bench_trace", engine.handle, ctypes.c_uint(kernels), cached, rows, capacity,
                    ctypes.c_void_p(buf.ctypes.data), ctypes.byref(count))
    if count.value > capacity:
        log(f"  {count.value} records, {capacity} kept")
    return buf[:min(count.value, capacity)]


def trace_prefill(engine, cached, rows, capacity=400_000):
    """The records of one prefill call of `rows` prompt tokens after `cached` (a2d_bench_trace_prefill)."""
    buf = np.zeros(capacity, dtype=RECORD)
    count = ctypes.c_int()
    engine.lib.call("a2d_bench_trace_prefill", engine.handle, cached, rows, capacity, ctypes.c_void_p(buf.ctypes.data),
                    ctypes.byref(count))
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
            adapter, weight = r[r["tile"] < 0], r[r["tile"] >= 0]
            epilogues = weight[weight["split"] >= 1000] if weight["split"].max() >= 1000 else weight
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
                adapter_end=(int(adapter["end"].max()) - int(r["start"].min())) / 1e3 if len(adapter) else float("nan"),
                epi_finish=np.median((epilogues["end"].astype(np.int64) - epilogues["reduced"].astype(np.int64))) / 1e3,
            ))
        if not stats:
            continue
        med = {k: nan_median([x[k] for x in stats]) for k in stats[0]}
        med["TBps_over_span"] = nbytes[kind] / (med["span"] * 1e-6) / 1e12
        rows[kind] = med
    total = (int(rec["end"].max()) - int(t0)) / 1e3
    return rows, total


def nan_median(values):
    """The median of the values that are numbers; NaN when none is (adapter_end without an adapter)."""
    values = [v for v in values if not np.isnan(v)]
    return float(np.median(values)) if values else float("nan")


def print_table(label, rows, total, lines):
    head = (f"{label}: first GEMM block start to last GEMM block end {total:.1f} us; per GEMM (median over layers), us:")
    lines.append(head)
    cols = ["blocks", "span", "TBps_over_span", "gap", "first_data_after_prev", "tail90", "sm_end_spread",
                    "block", "wait", "to_data", "loop", "reduce", "finish", "blocks_per_sm_max", "adapter_end", "epi_finish"]
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
    parser.add_argument("--adapter", default="", help="RULE:RANK: a random row adapter on every projection (window:64)")
    parser.add_argument("--prefill", type=int, default=0,
                        help="trace one prompt's prefill call of this many rows (after --kv cached) instead of forwards")
    args = parser.parse_args()
    adapter = parse_adapter(args.adapter)
    os.makedirs(args.out, exist_ok=True)
    cfg = dict(MINICPM)
    lib = Lib(args.lib)
    W = make_weights(cfg, seed=2026)
    engine = Engine(lib, cfg, adapter=adapter)
    engine.upload(W, adapters=adapter_factors(cfg, adapter[1]) if adapter else None)
    del W
    torch.cuda.empty_cache()
    engine.fill_kv()
    lines, summary = [], {}
    for text in args.tunings.split(";"):
        tuning = parse_tuning(text)
        if args.prefill:
            engine.reconfigure(tuning)
            rec = trace_prefill(engine, args.kv, args.prefill)
            name = f"prefill call {tuning_label(tuning)} rows {args.prefill} after {args.kv}"
            np.savez_compressed(os.path.join(args.out, f"records-prefill-{tuning_label(tuning)}.npz".replace(" ", "-")),
                                records=rec)
            rows, total = analyse(rec, cfg)
            lines.append(f"{name}: {len(rec)} block records; TFLOP/s over each GEMM's span: " +
                         ", ".join(f"{kind} {med['TBps_over_span'] * args.prefill:.0f}" for kind, med in rows.items()))
            print_table(name, rows, total, lines)
            summary[name] = dict(records=len(rec), span_us=total, per_kind=rows)
            log("\n".join(lines[-(len(rows) + 3):]))
            continue
        for kernels, what in ((GEMM_KERNELS, "gemm-only"), (ALL_KERNELS, "whole forward")):
            engine.reconfigure(tuning)
            engine.run_only(kernels)
            ms, _ = engine.time(args.kv, 0, args.rows, args.rows, iterations=20)
            rec = trace(engine, kernels, args.kv, args.rows)
            ms_after, _ = engine.time(args.kv, 0, args.rows, args.rows, iterations=20)
            with_adapter = f" {adapter[0]}{adapter[1]}" if adapter else ""
            name = f"{what} {tuning_label(tuning)}{with_adapter} rows {args.rows} kv {args.kv}"
            tag = f"{what}-{tuning_label(tuning)}{with_adapter}".replace(" ", "-")
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
