#!/usr/bin/env bash
# GPU-machine side of the demo conversion (see bench/NOTES.md, "Demo conversion"). Prepared here by
# bench/stage-demo-conversion.sh, which splits the base GGUF into parts small enough to travel beside the
# tracked tree (64 MiB a call in all) and prints the calls. Every call runs this same script:
#   1. bench/device-base-gguf.sh stashes the GGUF parts it carried in /root/stash (a machine keeps them
#      while it stays warm, 30 s after a call, so the parts' calls must follow one another at once);
#   2. once every part is there (the base joined, checked and the wheels installed), it runs
#      convert/recipes/demo-conversion.sh on /root/w
#      with DEADLINE = start + CALL_S, results to $OUT (log.txt, results.tar.gz, delta.safetensors.part-NN:
#      5 files of at most 15 MB) as they are made.
# A later call on the same warm machine resumes: /root/w keeps the base, the data and the run, so it
# continues training from the last checkpoint (TRAIN_S seconds) and with PROBES=1 ends with
# evaluate-probes on the GPU and the final export. Knobs: CALL_S (default 570), and any of the recipe's
# (its defaults here are the next session's plan: DISTILL_N=40000 DISTILL_SAMPLES=0 DISTILL_BATCH=512
# DISTILL_S=150 STEPS=400 LR=8e-4 SAVE_EVERY=50 PROBES=0 PROBES_PER_FAMILY=16 PROBE_TOKENS=48
# THRESHOLDS=0.3,0.5,0.7,0.9 PROBE_BATCH=512).
set -euo pipefail
start=$(date +%s)
status=0
bash bench/device-base-gguf.sh || status=$?
[ "$status" = 10 ] && exit 0
[ "$status" = 0 ] || exit "$status"
export PYTHONPATH=$PWD/convert:/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
gpus=$(nvidia-smi -L | wc -l)
export SOURCE=/root/base.gguf WORK=/root/w OUT DEADLINE=$(( start + ${CALL_S:-570} ))
export NGPU=${NGPU:-$gpus} DISTILL_N=${DISTILL_N:-40000} DISTILL_SAMPLES=${DISTILL_SAMPLES:-0}
export DISTILL_BATCH=${DISTILL_BATCH:-512} DISTILL_S=${DISTILL_S:-150} STEPS=${STEPS:-400} LR=${LR:-8e-4}
export SAVE_EVERY=${SAVE_EVERY:-50} PROBES=${PROBES:-0} PROBES_PER_FAMILY=${PROBES_PER_FAMILY:-16}
export PROBE_TOKENS=${PROBE_TOKENS:-48} THRESHOLDS=${THRESHOLDS:-0.3,0.5,0.7,0.9} PROBE_BATCH=${PROBE_BATCH:-512}
status=0
bash convert/recipes/demo-conversion.sh 2>&1 | tee -a "$OUT/log.txt" || status=$?
ls -la "$OUT"
exit $status
