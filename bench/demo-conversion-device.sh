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
# (defaults here: DISTILL_N=40000 DISTILL_SAMPLES=0 DISTILL_BATCH=4096 DISTILL_SLOTS=400000 DISTILL_S=150 STEPS=400
# LR=8e-4 SAVE_EVERY=50 PROBES=0 PROBES_PER_FAMILY=16 PROBE_TOKENS=48 THRESHOLDS=0.3,0.5,0.7,0.9 PROBE_BATCH=512
# AC=0 MICRO_ROWS=32; batches of 2,048 rows made 83 k tokens/s on an H200 where 1,024 made 67 k, and 4,096 rows ran
# out of memory on the batch of the longest prompts (bench/NOTES.md, conversion 20). 4,096 rows bounded to 400 k cache
# slots peaked at 67 GB (conversion 21, while each batch's cache still outlived it; 1 M slots ran out of memory then).)
# VARIANTS (below) trains several configurations side by side (spread over the GPUs in turn, several on one
# GPU when there are more variants than GPUs: a 135M model leaves most of an H200 idle) and lets the probes
# choose.
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
export DISTILL_BATCH=${DISTILL_BATCH:-4096} DISTILL_SLOTS=${DISTILL_SLOTS:-400000} DISTILL_S=${DISTILL_S:-150} STEPS=${STEPS:-400} LR=${LR:-8e-4}
export SAVE_EVERY=${SAVE_EVERY:-50} PROBES=${PROBES:-0} PROBES_PER_FAMILY=${PROBES_PER_FAMILY:-16}
export PROBE_TOKENS=${PROBE_TOKENS:-48} THRESHOLDS=${THRESHOLDS:-0.3,0.5,0.7,0.9} PROBE_BATCH=${PROBE_BATCH:-512}
# An H200 holds a 135M model's activations for 32 rows of 3 x 512 positions without checkpointing (47 GB):
# twice the tokens per second of checkpointing at 16 rows (bench/NOTES.md, conversion 14).
export AC=${AC:-0} MICRO_ROWS=${MICRO_ROWS:-32}
status=0
if [ -z "${VARIANTS:-}" ]; then
  bash convert/recipes/demo-conversion.sh 2>&1 | tee -a "$OUT/log.txt" || status=$?
  ls -la "$OUT"
  exit $status
fi

# VARIANTS="name=train flags[|export flags];...": the data once on every GPU, then one training run per
# variant, each on its own GPU in its own WORK (/root/w-name, sharing base, prompts and data), results in
# /root/vout/name/ without the delta's weights, packed at the end into OUT/variants.tar.gz (a call returns
# at most 8 files). With PROBES=1 each variant is probed and exported; then the one
# that the probes rank first (meets >= 80 % of the base's accuracy at >= 2 tokens/forward at its
# recommended threshold, then accuracy there, then tokens/forward: `a2d_convert rank-probes`) has its delta's
# weights copied to OUT.
DATA_ONLY=1 bash convert/recipes/demo-conversion.sh 2>&1 | tee -a "$OUT/log.txt" || status=$?
[ "$status" = 0 ] || exit "$status"
IFS=';' read -r -a variants <<< "$VARIANTS"
pids=(); names=()
for i in "${!variants[@]}"; do
  name=${variants[$i]%%=*}; flags=${variants[$i]#*=}; names+=("$name")
  export_flags="--advance slide --remasking leftmost"; if [[ "$flags" == *"|"* ]]; then export_flags=${flags#*|}; flags=${flags%%|*}; fi
  mkdir -p "/root/w-$name" "/root/vout/$name"
  for f in base data prompts.jsonl; do [ -e "/root/w-$name/$f" ] || ln -s "/root/w/$f" "/root/w-$name/$f"; done
  echo "== variant $name on GPU $(( i % gpus )): $flags" | tee -a "$OUT/log.txt"
  CUDA_VISIBLE_DEVICES=$(( i % gpus )) NGPU=1 WORK=/root/w-$name OUT=/root/vout/$name SAVE_DELTA=0 TRAIN_EXTRA="$flags" EXPORT_EXTRA="$export_flags" \
    bash convert/recipes/demo-conversion.sh > "/root/vout/$name/log.txt" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do wait "${pids[$i]}" || echo "variant ${names[$i]} exited with $?" | tee -a "$OUT/log.txt"; done
for name in "${names[@]}"; do echo "== $name"; grep -E '^==|"step"' "/root/vout/$name/log.txt" | tail -4; done | tee -a "$OUT/log.txt"
if [ "$PROBES" = 1 ]; then
  reports=()
  for name in "${names[@]}"; do
    if [ -f "/root/w-$name/probes.json" ]; then reports+=("/root/w-$name/probes.json"); else echo "$name: no probes"; fi
  done
  best=""
  if [ "${#reports[@]}" -gt 0 ]; then
    best=$(python3 -m a2d_convert rank-probes "${reports[@]}" 2> >(tee -a "$OUT/log.txt" >&2)) || best=""
    best=${best%/probes.json}; best=${best#/root/w-}
  fi
  echo "== chosen by the probes: ${best:-none}" | tee -a "$OUT/log.txt"
  if [ -n "$best" ] && [ -f "/root/w-$best/delta/delta.safetensors" ]; then
    split -b 15000000 -d "/root/w-$best/delta/delta.safetensors" "$OUT/delta.safetensors.part-"
    echo "$best" > "$OUT/chosen.txt"
  fi
fi
(cd /root/vout && tar czf "$OUT/variants.tar.gz" "${names[@]}")
ls -la "$OUT"
exit $status
