"""Eager forwards of a few layers of the MiniCPM5-2B shape (random weights), for a kernel profiler.

Launches every kernel on its own (no graph, no PDL), so a profiler such as Nsight Compute sees each one
whole; one forward of L layers launches 6 L + 3 kernels (embed, per layer qkv / attention / combine / o /
gate_up / down, the lm_head and the reveal step), after 3 warm-up forwards. The 6 L + 1 of them that match
"attention|combine|gemm" (25 at L = 4) of the first timed forward:

    ncu --clock-control none --kernel-name regex:"attention|combine|gemm" --launch-skip 75 --launch-count 25 \\
        --section SpeedOfLight --section WarpStateStats python3 bench/ncu_forward.py --lib build/device/liba2d_cuda_bench.so
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_check import MINICPM, Engine, Lib, make_weights, parse_tuning  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--kv", type=int, default=1024)
    parser.add_argument("--forwards", type=int, default=2, help="timed forwards after the 3 warm-up ones")
    parser.add_argument("--tuning", default="default", help="a tuning as cuda_check.py labels them (tuning_label: "
                        "'s8 b2 wf0'); the default keeps the engine's")
    args = parser.parse_args()
    cfg = dict(MINICPM, layers=args.layers)
    engine = Engine(Lib(args.lib), cfg, graphs=False, pdl=False)
    engine.upload(make_weights(cfg, seed=2026))
    engine.fill_kv()
    engine.reconfigure(parse_tuning(args.tuning), graphs=False, pdl=False)
    device_ms, _ = engine.time(args.kv, 0, args.rows, args.rows, iterations=args.forwards)
    print(f"{args.layers} layers, rows {args.rows}, kv {args.kv}: {device_ms:.3f} ms per eager forward")
    engine.close()


if __name__ == "__main__":
    main()
