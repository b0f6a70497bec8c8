#!/usr/bin/env bash
# Builds the CUDA harness here (no GPU needed) and stages what a GPU run needs into build/device/, the
# ignored folder the device tool carries: the harness library and the PyTorch peer scripts.
# Then, on the GPU machine: python3 bench/cuda_check.py --lib build/device/liba2d_cuda_bench.so --out $OUT --peers build/device
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
peers="${A2D_PEERS_DIR:-$root/../shared/peers}"
# sm_90a alone (the H100/H200 code): half the compile time and half the library that travels with each call.
cmake -S "$root/engine" -B "$root/build/cuda-bench" -DCMAKE_BUILD_TYPE=Release -DA2D_CUDA=ON -DA2D_TESTS=OFF \
  "-DA2D_CUDA_GENCODE=-gencode=arch=compute_90a,code=sm_90a" >/dev/null
cmake --build "$root/build/cuda-bench" -j "${A2D_BUILD_JOBS:-2}" --target a2d_cuda_bench
mkdir -p "$root/build/device"
cp "$root/build/cuda-bench/liba2d_cuda_bench.so" "$root/build/device/"
cp "$peers/graph_baseline.py" "$root/build/device/" 2>/dev/null || echo "no peer scripts in $peers: the peers section will be skipped"
du -sh "$root/build/device"
