"""The CUDA engine's FP8 (e4m3) weights on a GPU machine, in one run (bench/NOTES.md, "FP8 weights"):

    python3 bench/fp8_check.py --lib build/device/liba2d_cuda_bench.so --out $OUT

1. tiny random models of every switch with FP8 weights (quantize.py's per-row scales, computed there on the
   GPU) against the fp32 reference forward of the dequantized weights, under cuda_check.py's SCHEDULES (the
   default, the optional paths, the narrow and wide GEMM kernels), rel err <= 1e-2 as for bf16;
2. CUDA vs CPU backend on FP8 model folders written by `python -m a2d_convert quantize` (untied; tied, which
   quantize unties; a mask adapter): logits of one forward and greedy generations token for token;
3. the MiniCPM5-2B shape: random bf16 weights and their FP8 quantization, one engine each. The FP8 engine
   against the fp32 reference of its dequantized weights (no worse than PyTorch's own bf16 forward of them),
   the FP8 model's logits against the bf16 model's (random weights: the quantization, not a quality figure),
   then ms per forward of both engines at rows 1/4/8/16/32 at KV 1k and rows 4 at KV 32k, taken in turns
   (median of 3), and GEMM-only at rows 4, each against its weight-stream floor;
4. with --base-lib (the harness built from the commit before FP8, bench/stage-device.sh BASE_REF=...): the bf16
   engine's logits of fixed forwards (a tiny model, the 2B shape; 8 and 40 rows) from both builds, which must be
   bit-identical (the FP8 change must not move the bf16 path).
Exit status 1 when a check fails; a short table last; summary.json under --out.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "convert"))
import cuda_check as cc  # noqa: E402
from a2d_convert.quantize import quantize_folder, quantize_rows  # noqa: E402

QUANTIZED = ("q", "k", "v", "o", "gate", "up", "down")  # and lm_head when untied (quantize.py)
log = cc.log


def quantize_weights(W, cfg):
    """(engine weights: (e4m3, scale) for the projections and an untied lm_head, the rest as they are;
    reference weights: the same with those dequantized to fp32, q * scale)."""
    engine, reference = {}, {}
    for key, t in W.items():
        if key[0] in QUANTIZED or (key[0] == "lm_head" and not cfg["tied"]):
            q, scale = quantize_rows(t)
            engine[key] = (q, scale)
            reference[key] = q.float() * scale[:, None]
        else:
            engine[key] = reference[key] = t
    return engine, reference


def section_tiny(lib, summary):
    cases = [(0, 5, 4), (37, 4, 4), (200, 0, 8), (100, 60, 4), (1000, 4, 4), (3000, 1, 16), (5000, 8, 32)]
    rows = []
    for i, (name, cfg) in enumerate(cc.tiny_configs().items()):
        cfg.update(mask=cfg["vocab"] - 1, fp8=True)
        W = cc.make_weights(cfg, seed=100 + i, lm_scale=10.0)
        engine_w, reference_w = quantize_weights(W, cfg)
        engine = cc.Engine(lib, cfg)
        engine.upload(engine_w, on_host=name == "llama_gqa4_d32")  # the host staging path too
        for schedule, tuning in cc.SCHEDULES:
            engine.reconfigure(tuning)
            gen = torch.Generator().manual_seed(7 + i)
            for prefix, commit, window in cases:
                err, agree, conf_diff, self_agree, _ = cc.check_case(engine, reference_w, cfg, prefix, commit, window, gen)
                rows.append(dict(model=name, schedule=schedule, prefix=prefix, commit=commit, window=window, rel_err=err,
                                 argmax_agree=agree, device_argmax_vs_own_logits=self_agree))
                log(f"  tiny fp8 {name:24s} {schedule:7s} P={prefix:5d} C={commit:2d} W={window:2d}: rel_err {err:.2e}  "
                    f"argmax agree {agree:.2f}  conf diff {conf_diff:.1e}  device argmax vs own logits {self_agree:.2f}")
        engine.close()
    summary["tiny"] = rows
    worst = max(r["rel_err"] for r in rows)
    ok = worst <= cc.REL_TOL and all(r["device_argmax_vs_own_logits"] == 1.0 for r in rows)
    log(f"  tiny fp8 worst rel_err {worst:.2e} ({'PASS' if ok else 'FAIL'}: <= {cc.REL_TOL}, device argmax = own logits')")
    return ok


def section_backend(lib, workdir, summary):
    folders = {
        "llama_gqa4": dict(type="llama", layers=2, hidden=256, inter=512, heads=8, kv_heads=2, head_dim=32, vocab=600,
                           eps=1e-6, theta=10000.0, tied=False, qkv_bias=False, o_bias=False, qk_norm=False),
        "qwen3_qknorm_tied": dict(type="qwen3", layers=2, hidden=128, inter=384, heads=4, kv_heads=2, head_dim=64,
                                  vocab=500, eps=1e-6, theta=1e6, tied=True, qkv_bias=False, o_bias=False, qk_norm=True),
        "qwen2_bias": dict(type="qwen2", layers=2, hidden=128, inter=256, heads=4, kv_heads=2, head_dim=32, vocab=515,
                           eps=1e-6, theta=1e6, tied=False, qkv_bias=True, o_bias=False, qk_norm=False),
        "llama_adapter32": dict(type="llama", layers=2, hidden=256, inter=520, heads=8, kv_heads=2, head_dim=32,
                                vocab=600, eps=1e-6, theta=10000.0, tied=False, qkv_bias=False, o_bias=False,
                                qk_norm=False, mask_adapter=8),
    }
    results, ok = {}, True
    for i, (name, cfg) in enumerate(folders.items()):
        cfg["mask"] = cfg["vocab"] - 1
        W = cc.make_weights(cfg, seed=300 + i, lm_scale=25.0)
        bf16_path = os.path.join(workdir, name)
        cc.write_folder(bf16_path, cfg, W)
        path = str(quantize_folder(bf16_path, bf16_path + "-fp8", force=True))
        gen = torch.Generator().manual_seed(11 + i)
        commit = torch.randint(0, cfg["vocab"] - 2, (150,), generator=gen).tolist()
        window = [cfg["mask"], 5, cfg["mask"], cfg["mask"]]
        prompts = [torch.randint(0, cfg["vocab"] - 2, (int(torch.randint(3, 40, (1,), generator=gen)),),
                                 generator=gen).tolist() for _ in range(12)]
        r = cc.compare_backends(lib, path, commit, window, prompts, cfg["vocab"], 48, name + " fp8")
        results[name] = r
        # The generations are reported, not judged: these random tiny models' logits are near-tied, so their greedy
        # streams part after a few dozen tokens on bf16 folders too (bench/NOTES.md: identical 1/12, 11/12, 4/12).
        ok &= r["logits_rel_err"] <= cc.REL_TOL
    summary["backend"] = results
    log(f"  backend fp8 folders: {'PASS' if ok else 'FAIL'} (logits <= {cc.REL_TOL})")
    return ok


def fp8_stream_bytes(cfg):
    """The FP8 forward's weight bytes: one per projection and lm_head element, plus the fp32 row scales."""
    H, I, D = cfg["hidden"], cfg["inter"], cfg["head_dim"]
    rows = cfg["layers"] * ((cfg["heads"] + 2 * cfg["kv_heads"]) * D + 2 * H + 2 * I) + cfg["vocab"]
    return cc.stream_bytes(cfg) // 2 + 4 * rows


def section_2b(lib, summary):
    cfg = dict(cc.MINICPM)
    W = cc.make_weights(cfg, seed=2026)
    fp8_cfg = dict(cfg, fp8=True)
    engine_w, reference_w = quantize_weights(W, fp8_cfg)
    torch.cuda.synchronize()
    engines = {"bf16": cc.Engine(lib, cfg), "fp8": cc.Engine(lib, fp8_cfg)}
    uploads = {"bf16": engines["bf16"].upload(W), "fp8": engines["fp8"].upload(engine_w)}
    summary["weight_bytes"] = {k: u["weight_bytes"] for k, u in uploads.items()}
    log(f"  engine weight bytes: bf16 {uploads['bf16']['weight_bytes'] / 1e9:.3f} GB, fp8 {uploads['fp8']['weight_bytes'] / 1e9:.3f} GB")

    checks, ok = {}, True
    for label, weights, engine in (("bf16", W, engines["bf16"]), ("fp8", reference_w, engines["fp8"])):
        gen, yard = torch.Generator().manual_seed(5), []
        err, agree, conf_diff, self_agree, _ = cc.check_case(engine, weights, cfg, 1000, 4, 4, gen, yard)
        checks[label] = dict(rel_err=err, torch_bf16_rel_err=yard[0], argmax_agree=agree, device_argmax_vs_own_logits=self_agree)
        ok &= err <= yard[0] and self_agree == 1.0
        log(f"  2B {label} engine P=1000 C=4 W=4: rel_err {err:.2e} against the fp32 reference of its weights "
            f"(PyTorch bf16 forward: {yard[0]:.2e}), argmax agree {agree:.2f}, conf diff {conf_diff:.1e}")
    # What the quantization changes on these random weights: the fp32 references of both models, same tokens.
    gen = torch.Generator().manual_seed(5)
    toks = torch.randint(0, cfg["vocab"], (1008,), generator=gen).tolist()
    rows = [1000 + r for r in range(8)]
    want = cc.reference_logits(W, cfg, toks, 1004, rows)
    got = cc.reference_logits(reference_w, cfg, toks, 1004, rows)
    checks["fp8_model_vs_bf16_model"] = max(cc.rel_errors(got, want))
    log(f"  2B fp8 model vs bf16 model (fp32 references, random weights): logits rel err {checks['fp8_model_vs_bf16_model']:.2e}")
    summary["check_2b"] = checks
    del reference_w, want, got
    torch.cuda.empty_cache()

    bandwidth = summary["copy_TBps"]
    floors = {"bf16": cc.stream_bytes(cfg) / (bandwidth * 1e12) * 1e3, "fp8": fp8_stream_bytes(cfg) / (bandwidth * 1e12) * 1e3}
    summary["floor_ms"] = floors
    for engine in engines.values():
        engine.fill_kv()
    points = [(1, 1024), (4, 1024), (8, 1024), (16, 1024), (32, 1024), (4, 32768)]
    times = {}
    for _ in range(3):  # in turns, so the machine's drift hits both alike
        for label, engine in engines.items():
            for rows_, kv in points:
                device_ms, _ = engine.time(kv, 0, rows_, rows_, iterations=20)
                times.setdefault((label, rows_, kv), []).append(device_ms)
    for label, engine in engines.items():
        engine.run_only(cc.GEMM_KERNELS)
        device_ms, _ = engine.time(1024, 0, 4, 4, iterations=20)
        times[(label + " gemm-only", 4, 1024)] = [device_ms]
        engine.reconfigure()
    summary["timings_2b"] = [dict(variant=k[0], rows=k[1], kv=k[2], ms=v, median_ms=sorted(v)[len(v) // 2])
                             for k, v in times.items()]
    for k, v in times.items():
        log(f"  {k[0]:15s} rows {k[1]:2d} kv {k[2]:5d}: median {sorted(v)[len(v) // 2]:.3f} ms of " + " ".join(f"{x:.3f}" for x in v))
    for engine in engines.values():
        engine.close()
    return ok


def bf16_logits(lib):
    """Logits of fixed bf16 forwards, 8 rows then 40 (the wide GEMM kernel on the 2B shape), after 300 cached."""
    out = {}
    for name, cfg in (("tiny", dict(cc.tiny_configs()["minicpm_like_d128"])), ("2b", dict(cc.MINICPM))):
        cfg["mask"] = cfg["vocab"] - 1
        engine = cc.Engine(lib, cfg)
        engine.upload(cc.make_weights(cfg, seed=77))
        gen = torch.Generator().manual_seed(3)
        toks = torch.randint(0, cfg["vocab"], (344,), generator=gen).tolist()
        engine.prefill(toks[:300])
        out[name + "_8"] = engine.forward(300, 4, toks[300:308], list(range(8)))[0]
        out[name + "_40"] = engine.forward(300, 36, toks[300:340], list(range(40)))[0]
        engine.close()
    return out


def section_bf16_identity(lib, base_lib, summary):
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "base.pt")
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--lib", base_lib, "--out", tmp, "--dump-bf16", dump],
                              capture_output=True, text=True, timeout=240)
        if proc.returncode != 0:
            raise RuntimeError(f"the base build's forwards failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        base = torch.load(dump)
    ours = bf16_logits(lib)
    results = {k: dict(identical=bool(torch.equal(ours[k], base[k])), max_abs_diff=float((ours[k] - base[k]).abs().max()))
               for k in ours}
    summary["bf16_identity"] = results
    for k, r in results.items():
        log(f"  bf16 {k:8s}: {'bit-identical' if r['identical'] else 'DIFFERENT'} to the base build (max |diff| {r['max_abs_diff']:.2e})")
    return all(r["identical"] for r in results.values())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", default="/tmp/a2d-fp8-check")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: tiny,backend,2b")
    parser.add_argument("--base-lib", help="the harness library built before the FP8 change: bf16 logits must match it bit for bit")
    parser.add_argument("--dump-bf16", help=argparse.SUPPRESS)  # the base build's side of --base-lib
    args = parser.parse_args()
    if args.dump_bf16:
        torch.save(bf16_logits(cc.Lib(args.lib)), args.dump_bf16)
        return
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.workdir, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    torch.backends.cuda.matmul.allow_tf32 = False
    lib = cc.Lib(args.lib)
    summary = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_TBps": cc.copy_bandwidth()}
    log(f"copy bandwidth: {summary['copy_TBps']:.2f} TB/s")
    failures = []
    sections = [("tiny", section_tiny, ()), ("backend", section_backend, (args.workdir,)), ("2b", section_2b, ())]
    if args.base_lib:
        sections.insert(0, ("bf16_identity", section_bf16_identity, (args.base_lib,)))
    for name, fn, extra in sections:
        if name in skip:
            continue
        log(f"== fp8 {name} ({time.time() - cc.STARTED:.0f} s)")
        try:
            if not fn(lib, *extra, summary):
                failures.append(name)
        except Exception:
            failures.append(name)
            log(traceback.format_exc())
    summary["failures"] = failures
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)

    log("\n==== fp8 summary ====")
    log(f"gpu {summary['gpu']}, copy {summary['copy_TBps']:.2f} TB/s, failures: {failures or 'none'}")
    for k, r in (summary.get("bf16_identity") or {}).items():
        log(f"bf16 {k}: {'bit-identical to' if r['identical'] else 'DIFFERS from'} the build before FP8")
    if summary.get("tiny"):
        log(f"tiny fp8 forwards: worst rel err {max(r['rel_err'] for r in summary['tiny']):.2e} (tolerance {cc.REL_TOL})")
    for name, r in (summary.get("backend") or {}).items():
        log(f"backend {name} fp8: cuda vs cpu logits {r['logits_rel_err']:.2e}, identical {r['identical_generations']}, "
            f"agree {r['tokens_before_first_divergence']}")
    if "check_2b" in summary:
        c = summary["check_2b"]
        for label in ("bf16", "fp8"):
            log(f"2B {label} engine: rel err {c[label]['rel_err']:.2e} vs the fp32 reference of its weights "
                f"(PyTorch bf16 {c[label]['torch_bf16_rel_err']:.2e})")
        log(f"2B fp8 model vs bf16 model, random weights: {c['fp8_model_vs_bf16_model']:.2e}")
    if "timings_2b" in summary:
        f = summary["floor_ms"]
        log(f"floors at {summary['copy_TBps']:.2f} TB/s: bf16 {f['bf16']:.3f} ms, fp8 {f['fp8']:.3f} ms")
        by = {(t["variant"], t["rows"], t["kv"]): t["median_ms"] for t in summary["timings_2b"]}
        log("rows    kv   bf16 ms   fp8 ms   bf16/fp8   fp8 x its floor")
        for (variant, rows_, kv), ms in by.items():
            if variant != "fp8":
                continue
            b = by[("bf16", rows_, kv)]
            log(f"{rows_:4d} {kv:5d}   {b:7.3f}  {ms:7.3f}   {b / ms:6.2f}x   {ms / f['fp8']:.2f}x")
        log(f"gemm-only rows 4 kv 1024: bf16 {by[('bf16 gemm-only', 4, 1024)]:.3f} ms, fp8 {by[('fp8 gemm-only', 4, 1024)]:.3f} ms")
    log(f"total {time.time() - cc.STARTED:.0f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
