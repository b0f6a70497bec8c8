"""cuBLAS(Lt) through torch on the decode GEMMs of the MiniCPM5-2B shape at many rows: what a library GEMM
streams for qkv, o, gate_up, down and the lm_head at 5-320 rows, beside the weight-stream floor.

Each shape's weights come in enough copies to exceed the L2 cache (42 layers' worth where it fits in memory), so
every call reads its weights from HBM as a forward does; the time of one call is the mean over a CUDA graph of
many calls. Prints a table (microseconds a call, TB/s of weights, share of the copy rate).
    python3 bench/cublas_skinny.py [--rows 5,40,64,160,320]
"""
import argparse

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="5,40,64,160,320")
    parser.add_argument("--calls", type=int, default=84)
    args = parser.parse_args()
    hidden, inter, q_kv, vocab = 2048, 6144, (16 + 2 * 2) * 128, 130560
    shapes = {"qkv": (q_kv, hidden), "o": (hidden, 16 * 128), "gate_up": (2 * inter, hidden), "down": (hidden, inter),
              "lm_head": (vocab, hidden)}
    dev = torch.device("cuda")
    # The copy rate, as the floor's bandwidth.
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    copy_tbps = 2 * src.numel() * 10 / (start.elapsed_time(end) / 1e3) / 1e12
    del src, dst
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, copy {copy_tbps:.2f} TB/s")
    print("| GEMM | n x k | " + " | ".join(f"{r} rows" for r in args.rows.split(",")) + " |")
    print("|---|---|" + "---|" * len(args.rows.split(",")))
    for name, (n, k) in shapes.items():
        copies = 2 if name == "lm_head" else 42
        weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        cells = []
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            outs = [torch.empty(rows, n, device=dev, dtype=torch.bfloat16) for _ in range(2)]
            calls = args.calls if name != "lm_head" else 8
            for i in range(3):
                torch.mm(x, weights[i % copies].t(), out=outs[i % 2])
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(calls):
                    torch.mm(x, weights[i % copies].t(), out=outs[i % 2])
            graph.replay()
            torch.cuda.synchronize()
            start.record()
            for _ in range(5):
                graph.replay()
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1e3 / (5 * calls)
            tbps = n * k * 2 / (us / 1e6) / 1e12
            cells.append(f"{us:.1f} us, {tbps:.2f} TB/s ({tbps / copy_tbps:.0%})")
        print(f"| {name} | {n} x {k} | " + " | ".join(cells) + " |")
        del weights


if __name__ == "__main__":
    main()
