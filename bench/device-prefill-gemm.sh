#!/usr/bin/env bash
# The prefill GEMM's block shapes side by side on the GPU machine (engine/bench/gemm_prefill_bench.cu, built by
# bench/stage-device.sh as build/device/gemm_prefill_bench_<variant>; carry build/device): every variant's checks,
# then one table of microseconds a GEMM of the MiniCPM5-2B layer at 32-2,048 rows, split and unsplit. About a
# minute. Exit status 1 if any variant's check fails (its times are then not to be read).
set -u
out="${OUT:-/tmp/a2d-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
status=0
for bin in build/device/gemm_prefill_bench_*; do
  timeout "${VARIANT_S:-120}" "$bin" > "$out/$(basename "$bin").log" 2>&1 || { status=1; echo "$(basename "$bin"): FAILED"; }
  grep -E "^CHECK .*FAIL|^FAIL|^failures" "$out/$(basename "$bin").log"
done
grep -h "^| variant" "$out"/gemm_prefill_bench_t128s4b1.log | head -n 1
echo "|---|---|---|---|---|---|---|"
grep -h "^| tokens" "$out"/gemm_prefill_bench_*.log | sort -t'|' -k3,3 -k4,4n -s
exit $status
