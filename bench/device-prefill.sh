#!/usr/bin/env bash
# The prefill path on one H200, in one call of a few minutes: parity of the many-row kernels (DeviceModel::prefill)
# with the decode forwards on random models of every switch and on the 2B shape (last-row logits and every
# layer's KV cache rows), the CUDA backend against the CPU backend on a tiny folder, then prompt tokens/s on the
# 2B shape for 1k, 4k and 16k-token prompts. Stage first, here: `bash bench/stage-device.sh`; then through the
# device tool, carrying build/device:
#   bash bench/device-prefill.sh            (the log under $OUT; a short table last. Every parity check with the
#                                            GEMMs' K split as the engine sets it, GemmTuning::prefill_split_blocks_per_sm,
#                                            and the 2B timings per chunk size with and without it)
#   bash bench/device-prefill.sh --split 0  (the same with the split off)
# The staged engine/bench/prefill_check.cu binary runs if it loads there; otherwise it is built there (about
# two minutes on 16 cores). Exit status 1 on any mismatch or error.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out="${OUT:-/tmp/a2d-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
bin="$PWD/build/device/a2d_prefill_check"
if ! "$bin" --probe 2>/dev/null; then
  echo "the staged prefill check does not load here: building it on this machine"
  t0=$(date +%s)
  objs=/tmp/a2d-prefill-objs
  mkdir -p "$objs"
  flags="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iengine/src -Iengine/cuda -Iengine/tests -Ibuild/device/include -DA2D_CUDA"
  # One nvcc per file, in parallel: the GEMM files take the longest.
  ls engine/cuda/*.cu engine/src/*.cpp engine/tests/test_util.cpp engine/bench/prefill_check.cu |
    xargs -P 16 -I{} sh -c 'nvcc '"$flags"' -Xcompiler -ffp-contract=fast -c {} -o '"$objs"'/$(echo {} | tr / _).o' || exit 1
  nvcc -gencode=arch=compute_90a,code=sm_90a "$objs"/*.o -o /tmp/a2d_prefill_check -lpthread || exit 1
  bin=/tmp/a2d_prefill_check
  echo "built in $(( $(date +%s) - t0 )) s"
fi
export A2D_TEST_TMP=/tmp/a2d-prefill-tmp
timeout "${PREFILL_S:-300}" "$bin" "$@" > "$out/prefill.log" 2>&1
status=$?
sed '/==== prefill summary ====/,$d' "$out/prefill.log"
echo "prefill check: exit $status"
sed -n '/==== prefill summary ====/,$p' "$out/prefill.log"
[ "$status" = 0 ] || { echo "PREFILL CHECK FAILED (exit $status)"; exit 1; }
