#!/usr/bin/env bash
# The demo conversion as a background job on the GPU machine, for runs longer than one device call. The machine
# keeps what it holds while it stays warm (calls within 30 s of each other), so one call starts the job and
# short calls after it poll:
#   MODE=start [knobs] bash bench/device-conversion-bg.sh  (after the GGUF parts' calls: bench/stage-demo-conversion.sh)
#       joins the base, then starts `bench/demo-conversion-device.sh` (the recipe, its OUT /root/bg/out) and, after
#       it, with MFU_2B=1 (the default), bench/device-train-speed.sh (the trainer on the MiniCPM5-2B shape, random
#       weights), both under setsid, so that they outlive the call; returns at once.
#   bash bench/device-conversion-bg.sh
#       prints the job's state and the tail of its logs; once it has finished (or with COLLECT=1) copies its
#       results into $OUT: log.txt, results.tar.gz, the delta's parts, train-2b.jsonl (at most 8 files).
# Knobs: everything demo-conversion-device.sh and the recipe read (CALL_S bounds the recipe; default 1500 here).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out="${OUT:-/tmp/a2d-out}"
bg=/root/bg
mkdir -p "$out" "$bg/out"
if [ "${MODE:-poll}" = start ]; then
  status=0
  bash bench/device-base-gguf.sh || status=$?
  [ "$status" = 10 ] && exit 0
  [ "$status" = 0 ] || exit "$status"
  [ -f "$bg/pid" ] && kill -0 "$(cat "$bg/pid")" 2>/dev/null && { echo "a job is running already (pid $(cat "$bg/pid"))"; exit 1; }
  rm -f "$bg/done" "$bg/out/"*
  export CALL_S=${CALL_S:-1500}
  # The job runs from a copy of the tree: the next call's tree replaces this one, and bash reads its scripts as it runs them.
  rm -rf "$bg/repo" && cp -a "$PWD" "$bg/repo"
  setsid bash -c '
    cd "$1"
    OUT=/root/bg/out bash bench/demo-conversion-device.sh > /root/bg/recipe.log 2>&1
    echo "recipe exit $?" >> /root/bg/done
    if [ "${MFU_2B:-1}" = 1 ]; then
      OUT=/root/bg/out bash bench/device-train-speed.sh > /root/bg/train-2b.log 2>&1
      echo "train-2b exit $?" >> /root/bg/done
    fi
    echo finished >> /root/bg/done' _ "$bg/repo" < /dev/null > /dev/null 2>&1 &
  echo $! > "$bg/pid"
  # A recipe that fails on its arguments (a prompt count, a flag) exits within seconds: watch START_WAIT s for
  # that, so that this call says so instead of the next poll, minutes later.
  for _ in $(seq 1 "${START_WAIT:-30}"); do
    grep -q "recipe exit" "$bg/done" 2>/dev/null && { tail -n 20 /root/bg/recipe.log; echo "the background job ended at once: $(head -n 1 "$bg/done")"; exit 1; }
    sleep 1
  done
  echo "started the background job (pid $(cat "$bg/pid")); poll with: bash bench/device-conversion-bg.sh"
  exit 0
fi

[ -f "$bg/pid" ] || { echo "no background job on this machine (a fresh one?): start it with MODE=start"; exit 3; }
if kill -0 "$(cat "$bg/pid")" 2>/dev/null; then echo "running (pid $(cat "$bg/pid"))"; else echo "not running"; fi
cat "$bg/done" 2>/dev/null
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null
grep -hE '^==|^!!' /root/w/timings.txt 2>/dev/null | tail -n 6
tail -c 1500 /root/w/train.log 2>/dev/null | grep -E '"step"' | tail -n 2
tail -n 3 /root/bg/train-2b.log 2>/dev/null
grep -h '"distill"' /root/w/data.log 2>/dev/null | tail -n 1
if grep -q finished "$bg/done" 2>/dev/null || [ "${COLLECT:-0}" = 1 ]; then
  cp /root/bg/recipe.log "$out/log.txt" 2>/dev/null
  cp "$bg"/out/results.tar.gz "$bg"/out/delta.safetensors.part-* "$out/" 2>/dev/null
  cp "$bg"/out/train-2b.jsonl "$out/" 2>/dev/null
  ls -la "$out"
fi
exit 0
