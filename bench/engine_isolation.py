"""Several DeviceModels of the 2B shape in one process (bench/NOTES.md, run 13): each engine's logits
against a reference computed once while the weights were untouched, and a checksum of the PyTorch
weights after every engine step, so that an engine writing outside its own buffers shows as a changed
checksum rather than as a wrong reference. Run on the GPU machine after `bash bench/stage-device.sh`:
    python3 bench/engine_isolation.py --lib build/device/liba2d_cuda_bench.so
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_check as cc  # noqa: E402


def checksum(W):
    return sum(float(t.float().sum()) for t in W.values())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", required=True)
    parser.add_argument("--prefix", type=int, default=1000)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    lib = cc.Lib(args.lib)
    cfg = dict(cc.MINICPM)
    W = cc.make_weights(cfg, seed=2026)
    torch.cuda.synchronize()
    host = {k: t.cpu() for k, t in W.items()}
    gen = torch.Generator().manual_seed(5)
    toks = torch.randint(0, cfg["vocab"], (args.prefix + 8,), generator=gen).tolist()
    for j in range(0, 4, 2):
        toks[args.prefix + 4 + j] = cfg["mask"]
    rows = list(range(8))
    want = cc.reference_logits(W, cfg, toks, args.prefix + 4, [args.prefix + r for r in rows])
    want_short = cc.reference_logits(W, cfg, toks[args.prefix:], 4, rows)  # the same block with no prefix
    clean = checksum(W)
    print(f"references computed; weights checksum {clean:.6e}", flush=True)

    def same(value):
        return "same" if value == clean else f"CHANGED {value:.6e}"

    def run(engine, label):
        # Without a prefix first (a fresh position 0, no KV prefill), then after the prefix.
        logits, _, _ = engine.forward(0, 4, toks[args.prefix:], rows)
        short = max(cc.rel_errors(logits.to(cc.DEV), want_short))
        engine.prefill(toks[:args.prefix])
        after_prefill = checksum(W)
        logits, _, _ = engine.forward(args.prefix, 4, toks[args.prefix:], rows)
        after_forward = checksum(W)
        err = max(cc.rel_errors(logits.to(cc.DEV), want))
        print(f"{label}: rel_err no prefix {short:.3e}, after {args.prefix} {err:.3e}; weights after prefill "
              f"{same(after_prefill)}, after forward {same(after_forward)}", flush=True)

    engines = []
    for label, fuse, source, reconfigure, graphs, settle in (
            ("first: fused, host upload", True, "host", False, True, False),
            ("second: plain, host upload", False, "host", False, True, False),
            ("third: fused, device upload, reconfigured", True, "device", True, True, False),
            ("fourth: plain, device upload, reconfigured", False, "device", True, True, False),
            ("fifth: fused, host upload, no graphs", True, "host", False, False, False),
            ("sixth: fused, host upload, device synchronized after creation", True, "host", False, True, True)):
        engine = cc.Engine(lib, cfg, graphs=graphs, fuse_rope=fuse)
        if settle:
            torch.cuda.synchronize()  # every stream of the device, the legacy default stream included
        engine.upload(host if source == "host" else W, on_host=source == "host")
        print(f"{label}: uploaded; weights {same(checksum(W))}", flush=True)
        if reconfigure:
            engine.reconfigure(cc.OPTIONS_TUNING)
        run(engine, label)
        engines.append(engine)
    run(engines[0], "first again, all five alive")
    for engine in engines:
        engine.close()


if __name__ == "__main__":
    main()
