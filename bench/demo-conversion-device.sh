#!/usr/bin/env bash
# GPU-machine side of the demo conversion (see bench/NOTES.md, "Demo conversion"). Prepared here by
# bench/stage-demo-conversion.sh, which splits the base GGUF into parts small enough to travel beside the
# tracked tree (64 MiB a call in all) and prints the calls. Every call runs this same script:
#   1. it stashes the GGUF parts it carried (.device/gguf-*/gguf.partNN-of-MM, or the older halves
#      .device/a/part00 and .device/b/part01) in /root/stash: a machine keeps them while it stays warm
#      (30 s after a call), so the parts' calls must follow one another at once;
#   2. once every part is there, it joins them into /root/base.gguf and checks the pinned sha256, installs
#      the carried wheels (.device/whl: gguf), and runs convert/recipes/demo-conversion.sh on /root/w
#      with DEADLINE = start + CALL_S, results to $OUT (log.txt, results.tar.gz, delta.safetensors.part-NN:
#      5 files of at most 15 MB) as they are made.
# A later call on the same warm machine resumes: /root/w keeps the base, the data and the run, so it
# continues training from the last checkpoint (TRAIN_S seconds) and with PROBES=1 ends with
# evaluate-probes on the GPU and the final export. Knobs: CALL_S (default 570), and any of the recipe's
# (its defaults here are the next session's plan: DISTILL_N=20000 DISTILL_SAMPLES=1 DISTILL_BATCH=512
# DISTILL_S=150 STEPS=300 LR=8e-4 SAVE_EVERY=50 PROBES=0 PROBES_PER_FAMILY=16 PROBE_TOKENS=48
# THRESHOLDS=0.3,0.5,0.7,0.9 PROBE_BATCH=512).
set -euo pipefail
start=$(date +%s)
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p /root/stash
shopt -s nullglob
for part in .device/gguf-*/gguf.part*-of-* .device/a/part0[0] .device/b/part0[1]; do
  cp "$part" /root/stash/ && echo "stashed $part"
done
if [ ! -f /root/base.gguf ] || ! echo "$GGUF_SHA256  /root/base.gguf" | sha256sum -c --quiet 2>/dev/null; then
  parts=(/root/stash/gguf.part*-of-*)
  if [ "${#parts[@]}" -gt 0 ]; then
    want=${parts[0]##*-of-}
    if [ "${#parts[@]}" -lt "$((10#$want))" ]; then
      echo "base GGUF: ${#parts[@]} of $((10#$want)) parts stashed; carry the next part in the next call (within 30 s)"
      exit 0
    fi
    cat "${parts[@]}" > /root/base.gguf
  elif [ -f /root/stash/part00 ] && [ -f /root/stash/part01 ]; then
    cat /root/stash/part00 /root/stash/part01 > /root/base.gguf
  else
    echo "base GGUF: no parts here (a fresh machine?); start again with the first part's call"
    exit 3
  fi
  echo "$GGUF_SHA256  /root/base.gguf" | sha256sum -c
fi
if ! PYTHONPATH=/tmp/site python3 -c 'import gguf' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl
fi
export PYTHONPATH=$PWD/convert:/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
gpus=$(nvidia-smi -L | wc -l)
export SOURCE=/root/base.gguf WORK=/root/w OUT DEADLINE=$(( start + ${CALL_S:-570} ))
export NGPU=${NGPU:-$gpus} DISTILL_N=${DISTILL_N:-20000} DISTILL_SAMPLES=${DISTILL_SAMPLES:-1}
export DISTILL_BATCH=${DISTILL_BATCH:-512} DISTILL_S=${DISTILL_S:-150} STEPS=${STEPS:-300} LR=${LR:-8e-4}
export SAVE_EVERY=${SAVE_EVERY:-50} PROBES=${PROBES:-0} PROBES_PER_FAMILY=${PROBES_PER_FAMILY:-16}
export PROBE_TOKENS=${PROBE_TOKENS:-48} THRESHOLDS=${THRESHOLDS:-0.3,0.5,0.7,0.9} PROBE_BATCH=${PROBE_BATCH:-512}
status=0
bash convert/recipes/demo-conversion.sh 2>&1 | tee -a "$OUT/log.txt" || status=$?
ls -la "$OUT"
exit $status
