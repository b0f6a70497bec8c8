#!/usr/bin/env bash
# Builds the CUDA harness here (no GPU needed) and stages what a GPU run needs into build/device/, the
# ignored folder the device tool carries: the harness library, the prefill check (bench/device-prefill.sh), the
# CUDA op table (bench/device-ops.sh), the FP8 GEMM harness (bench/device-fp8.sh) and the PyTorch peer scripts.
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
cmake --build "$root/build/cuda-bench" -j "${A2D_BUILD_JOBS:-2}" --target a2d_cuda_bench a2d_prefill_check a2d_cuda_ops_test
cp "$root/build/cuda-bench/liba2d_cuda_bench.so" "$root/build/cuda-bench/a2d_prefill_check" \
  "$root/build/cuda-bench/a2d_cuda_ops_test" "$root/build/device/"
# The FP8 GEMM harness (engine/bench/fp8_gemm_bench.cu), with the engine's e4m3 conversion and with the other
# one (fp8.cuh), for bench/device-fp8.sh.
for convert in cvt shift; do
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xfatbin -compress-all -Xcompiler -static-libstdc++,-static-libgcc \
    -DA2D_FP8_CONVERT=$convert -I"$root/engine/cuda" -I"$root/engine/bench" -o "$root/build/device/fp8_gemm_bench_$convert" \
    "$root/engine/bench/fp8_gemm_bench.cu" "$root/engine/cuda/gemm.cu" &
done
wait
# The prefill GEMM harness (engine/bench/gemm_prefill_bench.cu: every block shape of kPrefillShapes and the
# warpgroup kernel's), for bench/device-prefill-gemm.sh.
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xfatbin -compress-all -Xcompiler -static-libstdc++,-static-libgcc \
  -I"$root/engine/cuda" -I"$root/engine/bench" -o "$root/build/device/gemm_prefill_bench" \
  "$root/engine/bench/gemm_prefill_bench.cu" "$root/engine/cuda/gemm_prefill.cu" "$root/engine/cuda/gemm_wgmma.cu"
# Whether the driver runs the sm_90a code of a fat binary that also carries sm_90 code, as the addon does
# (engine/bench/wgmma_probe.cu).
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=sm_90 -Xfatbin -compress-all \
  -Xcompiler -static-libstdc++,-static-libgcc -I"$root/engine/cuda" -o "$root/build/device/wgmma_probe" \
  "$root/engine/bench/wgmma_probe.cu" "$root/engine/cuda/gemm_wgmma.cu" "$root/engine/cuda/gemm_prefill.cu"
# BASE_REF=COMMIT also builds the harness library of that commit into build/device/base/ (bench/fp8_check.py
# --base-lib: the bf16 path's logits must not change).
if [ -n "${BASE_REF:-}" ]; then
  base_src="$root/build/base-src"
  rm -rf "$base_src" && mkdir -p "$base_src"
  git -C "$root" archive "$BASE_REF" engine | tar -x -C "$base_src"
  ln -sfn "$root/node_modules" "$base_src/node_modules"
  cmake -S "$base_src/engine" -B "$root/build/cuda-bench-base" -DCMAKE_BUILD_TYPE=Release -DA2D_CUDA=ON -DA2D_TESTS=OFF \
    "$gencode" >/dev/null
  cmake --build "$root/build/cuda-bench-base" -j "${A2D_BUILD_JOBS:-2}" --target a2d_cuda_bench
  mkdir -p "$root/build/device/base"
  cp "$root/build/cuda-bench-base/liba2d_cuda_bench.so" "$root/build/device/base/"
fi
# For a build on the GPU machine when the staged binaries do not load there (device-cuda.sh, device-prefill.sh,
# device-ops.sh):
# nlohmann/json and the generated headers (the decoding table, the supported-config list).
mkdir -p "$root/build/device/include" && cp -r /usr/include/nlohmann "$root/build/device/include/"
cp "$root/build/cuda-bench/generated/"*.inc "$root/build/device/include/"
cp "$peers/graph_baseline.py" "$root/build/device/" 2>/dev/null || echo "no peer scripts in $peers: the peers section will be skipped"
du -sh "$root/build/device"
