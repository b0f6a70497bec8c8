#!/usr/bin/env bash
# One GPU call for the CUDA engine's batching and its fused adapter, the most important first, so that a call cut
# short still brings back what ran: the op table's adapter and attention cases (bench/device-ops.sh), the tiny
# models' forwards against the PyTorch reference and the CPU backend (bench/device-cuda.sh, small sections), then
# continuous batching on the packed 2B folder (bench/device-batch.sh: parity alone vs batched, `a2d bench-serve` at
# LEVELS), then what an adapter costs the forward (bench/device-adapter-cost.sh). Stage first, here:
# `bash bench/stage-device.sh` (build/device) and `A2D_STAGE_BUILD=0 bash bench/stage-gpu-run.sh` (.device/kit) after
# `npm run build:cuda`; carry both. At most 8 files come back: $OUT/log.txt (every step's summary), ops-adapter.log,
# ops-attention.log, parity.json, bench-serve.json, adapter-cost.json, serve.log, prefill.log. Last, the prefill GEMMs'
# K split (bench/device-prefill.sh --split 1).
# Knobs: CHECK_S (70; 0 skips that step), LEVELS (1,2,4,8,16,32), BATCH_S (200), COST_S (150), ADAPTERS ("mask:64
# window:64"), PREFILL_S (150; 0 skips it).
set -u
out="${OUT:-/tmp/a2d-out}"
work=/tmp/a2d-batching
mkdir -p "$out" "$work"
log="$out/log.txt"
section() { echo "== $1 ($(date +%T))" | tee -a "$log"; }

for filter in adapter attention; do
  section "op table: $filter cases"
  OUT="$work/ops-$filter" OPS_S=60 bash bench/device-ops.sh --filter "$filter" > "$work/ops-$filter.txt" 2>&1
  echo "exit $?: $(grep -cE ' PASS$' "$work/ops-$filter/ops.log") passed, $(grep -cE ' FAIL$' "$work/ops-$filter/ops.log") failed" | tee -a "$log"
  grep -E ' FAIL$' "$work/ops-$filter/ops.log" | tee -a "$log"
  cp "$work/ops-$filter/ops.log" "$out/ops-$filter.log"
done

if [ "${CHECK_S:-70}" != 0 ]; then
  section "CUDA forwards against the PyTorch reference and the CPU backend (tiny models, adapters included)"
  OUT="$work/check" SMALL_S="${CHECK_S:-70}" SANITIZE=0 ISOLATION=0 BIG_S=1 bash bench/device-cuda.sh > "$work/check.txt" 2>&1
  grep -E "small sections|failures|worst|FAIL" "$work/check.txt" | head -n 12 | tee -a "$log"
fi

section "continuous batching: parity and bench-serve ${LEVELS:-1,2,4,8,16,32}"
OUT="$work/batch" TOTAL_S="${BATCH_S:-200}" LEVELS="${LEVELS:-1,2,4,8,16,32}" PARITY_S=60 HTTP_S=150 \
  bash bench/device-batch.sh > "$work/batch.txt" 2>&1
echo "exit $?" | tee -a "$log"
cat "$work/batch/summary.txt" >> "$log" 2>/dev/null
for f in parity.json bench-serve.json serve.log; do cp "$work/batch/$f" "$out/" 2>/dev/null; done

section "adapter cost"
OUT="$work/cost" TOTAL_S="${COST_S:-150}" SHAPES="minicpm5-2b smollm2-135m" ADAPTERS="${ADAPTERS:-mask:64 window:64}" \
  bash bench/device-adapter-cost.sh > "$work/cost.txt" 2>&1
echo "exit $?" | tee -a "$log"
cat "$work/cost/summary.txt" >> "$log" 2>/dev/null
cp "$work/cost/adapter-cost.json" "$out/" 2>/dev/null

if [ "${PREFILL_S:-150}" != 0 ]; then
  section "prefill GEMMs with their K split on: parity, and the 2B per chunk size with and without it"
  OUT="$work/prefill" PREFILL_S="${PREFILL_S:-150}" bash bench/device-prefill.sh --split 1 > "$work/prefill.txt" 2>&1
  echo "exit $?" | tee -a "$log"
  sed -n '/==== prefill summary ====/,$p' "$work/prefill/prefill.log" >> "$log" 2>/dev/null
  cp "$work/prefill/prefill.log" "$out/" 2>/dev/null
fi
tail -n 60 "$log"
