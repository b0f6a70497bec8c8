#!/usr/bin/env bash
# GPU-machine side of the 1-GPU vs N-GPU conversion comparison (bench/NOTES.md, "Scaling"): the same
# training config for SCALE_STEPS steps on one process and on NGPU processes (torchrun, FSDP2), on the
# demo base. The base GGUF arrives in parts as for bench/demo-conversion-device.sh (bash
# bench/stage-demo-conversion.sh makes them here): each call carries the next part and runs
#   NGPU=2 SCALE_STEPS=200 bash bench/scaling-device.sh
# (the calls with a part only stash it; the last one, carrying .device/whl too, runs the comparison).
# LIMIT_S (default 540) bounds the recipe so the logs reach $OUT inside the call's limit even when a run
# is slow or stuck.
set -uo pipefail
bash bench/device-base-gguf.sh; status=$?
[ "$status" = 10 ] && exit 0
[ "$status" = 0 ] || exit "$status"
export PYTHONPATH=$PWD/convert:/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
SOURCE=/root/base.gguf WORK=/root/w SCALE_ONLY=1 NGPU="${NGPU:-2}" SCALE_STEPS="${SCALE_STEPS:-200}" \
  timeout -k 10 "${LIMIT_S:-540}" bash convert/recipes/demo-conversion.sh > "$OUT/log.txt" 2>&1
status=$?
echo "recipe exit $status"
cd /root/w || exit 1
for f in scale-*.log; do [ -f "$f" ] && tr '\r' '\n' < "$f" | grep -E '"step"|"event"|Error|error' > "$OUT/$f"; done
tar czf "$OUT/results.tar.gz" --ignore-failed-read scale-*/train_log.jsonl data/data_manifest.json 2>/dev/null
tail -n 3 "$OUT"/scale-*.log
exit $status
