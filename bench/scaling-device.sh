#!/usr/bin/env bash
# GPU-machine side of the 1-GPU vs N-GPU conversion comparison (bench/NOTES.md, "Scaling"): the same
# training config for SCALE_STEPS steps on one process and on NGPU processes (torchrun, FSDP2), on the
# demo base. The base GGUF arrives in two carried halves, as for bench/demo-conversion-device.sh:
#   call 1 (carry .device/a):            mkdir -p /root/stash && cp .device/a/part00 /root/stash/
#   call 2 (carry .device/b .device/whl): NGPU=2 SCALE_STEPS=200 bash bench/scaling-device.sh
# LIMIT_S (default 540) bounds the recipe so the logs reach $OUT inside the call's limit even when a run
# is slow or stuck.
set -uo pipefail
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
cat /root/stash/part00 .device/b/part01 > /root/base.gguf
echo "$GGUF_SHA256  /root/base.gguf" | sha256sum -c || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl || exit 1
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
