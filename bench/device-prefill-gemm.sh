#!/usr/bin/env bash
# The prefill GEMM's block shapes side by side on the GPU machine (engine/bench/gemm_prefill_bench.cu, built by
# bench/stage-device.sh as build/device/gemm_prefill_bench; carry build/device): every shape's checks, one table of
# microseconds a GEMM of the MiniCPM5-2B layer at 32-2,048 rows, split and unsplit, then a layer's four GEMMs in
# the engine's 128-token shape against the shape picked by rows (GemmTuning::prefill_shape_by_rows). About a
# minute. Exit status 1 if any check fails (the times are then not to be read).
set -u
out="${OUT:-/tmp/a2d-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout "${BENCH_S:-300}" build/device/gemm_prefill_bench > "$out/gemm_prefill_bench.log" 2>&1
status=$?
grep -E "FAIL|^failures" "$out/gemm_prefill_bench.log"
sed -n '/^| shape/,$p' "$out/gemm_prefill_bench.log"
exit $status
