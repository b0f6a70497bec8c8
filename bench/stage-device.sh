#!/usr/bin/env bash
# Builds the CUDA harness here (no GPU needed) and stages what a GPU run needs into build/device/, the
# ignored folder the device tool carries: the harness library, the prefill check (bench/device-prefill.sh) and
# the PyTorch peer scripts.
# Then, on the GPU machine: python3 bench/cuda_check.py --lib build/device/liba2d_cuda_bench.so --out $OUT --peers build/device
# TRACE=1 also builds the trace build (per-block GEMM records, engine/cuda/trace.cuh) into build/device/trace/
# for bench/gemm_trace.py; TRACE=only builds that alone.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
peers="${A2D_PEERS_DIR:-$root/../shared/peers}"
# sm_90a alone (the H100/H200 code): half the compile time and half the library that travels with each call.
gencode="-DA2D_CUDA_GENCODE=-gencode=arch=compute_90a,code=sm_90a"
mkdir -p "$root/build/device"
if [ -n "${TRACE:-}" ] && [ "${TRACE}" != 0 ]; then
  cmake -S "$root/engine" -B "$root/build/cuda-trace" -DCMAKE_BUILD_TYPE=Release -DA2D_CUDA=ON -DA2D_TESTS=OFF \
    -DCMAKE_CUDA_FLAGS=-DA2D_GEMM_TRACE "$gencode" >/dev/null
  cmake --build "$root/build/cuda-trace" -j "${A2D_BUILD_JOBS:-2}" --target a2d_cuda_bench
  mkdir -p "$root/build/device/trace"
  cp "$root/build/cuda-trace/liba2d_cuda_bench.so" "$root/build/device/trace/"
  [ "$TRACE" = only ] && { du -sh "$root/build/device"; exit 0; }
fi
cmake -S "$root/engine" -B "$root/build/cuda-bench" -DCMAKE_BUILD_TYPE=Release -DA2D_CUDA=ON -DA2D_TESTS=OFF \
  "$gencode" >/dev/null
cmake --build "$root/build/cuda-bench" -j "${A2D_BUILD_JOBS:-2}" --target a2d_cuda_bench a2d_prefill_check
cp "$root/build/cuda-bench/liba2d_cuda_bench.so" "$root/build/cuda-bench/a2d_prefill_check" "$root/build/device/"
# For a build on the GPU machine when the staged binaries do not load there (device-cuda.sh, device-prefill.sh):
# nlohmann/json and the generated headers (the decoding table, the supported-config list).
mkdir -p "$root/build/device/include" && cp -r /usr/include/nlohmann "$root/build/device/include/"
cp "$root/build/cuda-bench/generated/"*.inc "$root/build/device/include/"
cp "$peers/graph_baseline.py" "$root/build/device/" 2>/dev/null || echo "no peer scripts in $peers: the peers section will be skipped"
du -sh "$root/build/device"
