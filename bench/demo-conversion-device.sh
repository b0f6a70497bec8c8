#!/usr/bin/env bash
# GPU-machine side of the demo conversion (see bench/NOTES.md, "Demo conversion"): joins the base GGUF that
# arrived in two carried halves, runs convert/recipes/demo-conversion.sh, and puts what must come back
# under $OUT within the device tool's limits (at most 8 files of 16 MiB).
set -euo pipefail
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
cat /root/stash/part00 .device/b/part01 > /root/base.gguf
echo "$GGUF_SHA256  /root/base.gguf" | sha256sum -c
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl
export PYTHONPATH=$PWD/convert:/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
status=0
SOURCE=/root/base.gguf WORK=/root/w bash convert/recipes/demo-conversion.sh 2>&1 | tee "$OUT/log.txt" || status=$?
cd /root/w
if [ -f delta/delta.safetensors ]; then
  split -b 15000000 -d delta/delta.safetensors "$OUT/delta.safetensors.part-"
  sha256sum delta/delta.safetensors > delta.sha256
fi
tar czf "$OUT/results.tar.gz" --ignore-failed-read delta.sha256 delta/*.json delta/*.txt probes.json probes-details.jsonl \
  run/train_log.jsonl scale-*/train_log.jsonl scale-*.log train.log data/data_manifest.json model/*.json 2>/dev/null || true
ls -la "$OUT"
exit $status
