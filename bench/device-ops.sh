#!/usr/bin/env bash
# The CUDA op table on one H200 (engine/tests/cuda_ops_test.cu): every kernel of engine/cuda/ through its launch
# function against the CPU backend's op on random inputs of the MiniCPM5-2B shapes and odd ones, one line per
# case (op, variant, shape, max_abs_err, max_rel_err, tolerance, PASS|FAIL) and a count of failures last. Stage
# first, here: `bash bench/stage-device.sh`; then through the device tool, carrying build/device:
#   bash bench/device-ops.sh                  (the log is $OUT/ops.log)
#   bash bench/device-ops.sh --filter attention
# The staged binary runs if it loads there; otherwise it is built there (about two minutes on 16 cores).
# Exit status 1 on any failed case or error.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out="${OUT:-/tmp/a2d-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
bin="$PWD/build/device/a2d_cuda_ops_test"
if ! "$bin" --probe 2>/dev/null; then
  echo "the staged op table does not load here: building it on this machine"
  t0=$(date +%s)
  objs=/tmp/a2d-ops-objs
  mkdir -p "$objs"
  flags="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iengine/src -Iengine/cuda -Ibuild/device/include -DA2D_CUDA"
  # One nvcc per file, in parallel: the GEMM files take the longest.
  ls engine/cuda/*.cu engine/src/*.cpp engine/tests/cuda_ops_test.cu |
    xargs -P 16 -I{} sh -c 'nvcc '"$flags"' -Xcompiler -ffp-contract=fast -c {} -o '"$objs"'/$(echo {} | tr / _).o' || exit 1
  nvcc -gencode=arch=compute_90a,code=sm_90a "$objs"/*.o -o /tmp/a2d_cuda_ops_test -lpthread || exit 1
  bin=/tmp/a2d_cuda_ops_test
  echo "built in $(( $(date +%s) - t0 )) s"
fi
timeout "${OPS_S:-480}" "$bin" "$@" > "$out/ops.log" 2>&1
status=$?
cat "$out/ops.log"
echo "op table: exit $status"
if [ "$status" != 0 ]; then
  echo "failed cases:"
  grep -E -A1 ' FAIL$' "$out/ops.log"
  echo "CUDA OP TABLE FAILED (exit $status)"
  exit 1
fi
