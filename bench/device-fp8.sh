#!/usr/bin/env bash
# One GPU call (under 8 minutes on one H200) of the FP8 weight path (bench/NOTES.md, "FP8 weights"). Stage
# first, here: `bash bench/stage-device.sh`; then through the device tool, carrying build/device:
#   bash bench/device-fp8.sh            (logs under $OUT; exit status 1 on any mismatch)
# 1. the staged binaries, or where they do not run here, built here in parallel (the harness library, and the
#    FP8 GEMM harness with the engine's e4m3 conversion and with the other one);
# 2. engine/bench/fp8_gemm_bench.cu, both builds: every e4m3 code, every FP8 GEMM shape of the 2B model at 1-64
#    rows against an fp64 CPU reference (outputs poisoned first), and us per GEMM for bf16 and FP8;
# 3. bench/fp8_check.py: the bf16 path bit for bit against the build before FP8 (when staged with BASE_REF),
#    tiny FP8 models against the fp32 reference, CUDA vs CPU backend on FP8 folders made by `quantize`, and the
#    2B-shape forward bf16 vs FP8 (parity, then ms per forward at KV 1k and 32k).
# GEMM_S / CHECK_S bound steps 2 and 3.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out="${OUT:-/tmp/a2d-out}"
build=/tmp/a2d-fp8-build
mkdir -p "$out" "$build/obj"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
flags=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iengine/cuda)

lib="$PWD/build/device/liba2d_cuda_bench.so"
if ! python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$lib" 2>/dev/null; then
  echo "the staged harness library does not load here: building it on this machine"
  lib="$build/liba2d_cuda_bench.so"
  for f in engine/cuda/*.cu engine/bench/forward_bench.cu; do
    nvcc "${flags[@]}" -Xcompiler -fPIC -Iengine/src -Ibuild/device/include -DA2D_CUDA -c "$f" -o "$build/obj/$(basename "$f").o" &
  done
  for f in engine/src/*.cpp; do
    g++ -O3 -std=c++17 -fPIC -Iengine/src -Ibuild/device/include -DA2D_CUDA -c "$f" -o "$build/obj/$(basename "$f").o" &
  done
  wait
  nvcc -shared -o "$lib" "$build"/obj/*.o -lpthread || { echo "FAIL: the harness library did not build"; exit 1; }
fi
declare -A bench
for convert in cvt shift; do
  bench[$convert]="$PWD/build/device/fp8_gemm_bench_$convert"
  if ! "${bench[$convert]}" --probe >/dev/null 2>&1; then
    echo "the staged fp8_gemm_bench_$convert does not run here: building it on this machine"
    bench[$convert]="$build/fp8_gemm_bench_$convert"
    nvcc "${flags[@]}" -DA2D_FP8_CONVERT=$convert -o "${bench[$convert]}" engine/bench/fp8_gemm_bench.cu engine/cuda/gemm.cu &
  fi
done
wait
echo "binaries ready in $(( $(date +%s) - t0 )) s"

status=0
timeout "${GEMM_S:-150}" "${bench[cvt]}" > "$out/gemm_cvt.log" 2>&1
rc=$?; [ $rc = 0 ] || status=1
echo "fp8_gemm_bench, the engine's conversion (cvt): exit $rc"
grep -E "^(device|CODES)|FAIL|error" "$out/gemm_cvt.log" | head -n 30
timeout "${GEMM_S:-150}" "${bench[shift]}" > "$out/gemm_shift.log" 2>&1
echo "fp8_gemm_bench, the shift conversion: exit $? (reported only: the engine builds cvt)"
grep -E "^CODES|FAIL|error" "$out/gemm_shift.log" | head -n 10
base=()
[ -f build/device/base/liba2d_cuda_bench.so ] && base=(--base-lib build/device/base/liba2d_cuda_bench.so)
timeout "${CHECK_S:-300}" python3 bench/fp8_check.py --lib "$lib" --out "$out/check" "${base[@]}" > "$out/check.log" 2>&1
rc=$?; [ $rc = 0 ] || status=1
echo "fp8_check.py: exit $rc"
grep -n -m 20 -E "Error|error|Traceback|FAIL" "$out/check.log"

echo
echo "==== FP8 GEMMs, the engine's conversion (cvt) ===="
sed -n '/^us per GEMM/,/^fp8_gemm_bench:/p' "$out/gemm_cvt.log"
echo "==== FP8 GEMMs, the shift conversion ===="
sed -n '/^us per GEMM/,/^fp8_gemm_bench:/p' "$out/gemm_shift.log"
sed -n '/==== fp8 summary ====/,$p' "$out/check.log"
echo "device-fp8: $([ $status = 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - t0 )) s"
exit $status
