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
#       results into $OUT: log.txt, results.tar.gz, the delta's parts, train-2b.jsonl; what does not fit one call's
#       return (RETURN_BYTES, 62 MB, and RETURN_FILES, 8) comes with the next poll. With SEND_DATA=1, after those,
#       the training data (WORK/data's train and held-out rows and manifest: data.sha256, data.tar.gz.part-NN) for
#       the next conversion: `bash bench/stage-data.sh DIR...` here stages it, and that conversion skips its
#       self-distillation (bench/device-data.sh).
#       While it runs, each poll also exports the run's latest checkpoint in the background (SNAPSHOT=1, the
#       default) and the next poll brings that export back: snapshot.tar.gz (the delta folder's small files and
#       the checkpoint's name) and snapshot-delta.safetensors.part-NN, so that a machine taken back mid-run
#       still leaves a model; a snapshot larger than one call's return comes over several polls, and the next
#       export starts once it is all back. Here: `bash bench/snapshot-delta.sh DIR... OUT_DELTA` (the polls'
#       folders; the final results' too), then `a2d_convert rebuild`.
# Knobs: everything demo-conversion-device.sh and the recipe read (CALL_S bounds the recipe; default 1500 here);
# PART_BYTES (a snapshot's parts, 15 MB), RETURN_BYTES and RETURN_FILES (what one poll copies back).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out="${OUT:-/tmp/a2d-out}"
bg=${BG:-/root/bg}     # the job's state; a test points BG and BG_WORK elsewhere
work=${BG_WORK:-/root/w}  # the recipe's WORK (demo-conversion-device.sh)
mkdir -p "$out" "$bg/out"
if [ "${MODE:-poll}" = start ]; then
  status=0
  bash bench/device-base-gguf.sh || status=$?
  [ "$status" = 10 ] && exit 0
  [ "$status" = 0 ] || exit "$status"
  [ -f "$bg/pid" ] && kill -0 "$(cat "$bg/pid")" 2>/dev/null && { echo "a job is running already (pid $(cat "$bg/pid"))"; exit 1; }
  rm -f "$bg/done" "$bg/out/"*
  rm -rf "$bg/snap"
  export CALL_S=${CALL_S:-1500}
  printf '%s' "${EXPORT_EXTRA:-}" > "$bg/export_extra"  # the snapshots' decoding defaults, as the recipe's export
  # The job runs from a copy of the tree: the next call's tree replaces this one, and bash reads its scripts as it runs them.
  rm -rf "$bg/repo" && cp -a "$PWD" "$bg/repo"
  setsid bash -c '
    cd "$1"
    OUT=$2/out bash bench/demo-conversion-device.sh > "$2/recipe.log" 2>&1
    echo "recipe exit $?" >> "$2/done"
    if [ "${MFU_2B:-1}" = 1 ]; then
      OUT=$2/out bash bench/device-train-speed.sh > "$2/train-2b.log" 2>&1
      echo "train-2b exit $?" >> "$2/done"
    fi
    echo finished >> "$2/done"' _ "$bg/repo" "$bg" < /dev/null > /dev/null 2>&1 &
  echo $! > "$bg/pid"
  # A recipe that fails on its arguments (a prompt count, a flag) exits within seconds: watch START_WAIT s for
  # that, so that this call says so instead of the next poll, minutes later.
  for _ in $(seq 1 "${START_WAIT:-30}"); do
    grep -q "recipe exit" "$bg/done" 2>/dev/null && { tail -n 20 "$bg/recipe.log"; echo "the background job ended at once: $(head -n 1 "$bg/done")"; exit 1; }
    sleep 1
  done
  echo "started the background job (pid $(cat "$bg/pid")); poll with: bash bench/device-conversion-bg.sh"
  exit 0
fi

[ -f "$bg/pid" ] || { echo "no background job on this machine (a fresh one?): start it with MODE=start"; exit 3; }
if kill -0 "$(cat "$bg/pid")" 2>/dev/null; then echo "running (pid $(cat "$bg/pid"))"; else echo "not running"; fi
cat "$bg/done" 2>/dev/null
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null
grep -hE '^==|^!!' "$work/timings.txt" 2>/dev/null | tail -n 6
tail -c 1500 "$work/train.log" 2>/dev/null | grep -E '"step"' | tail -n 2
tail -n 3 "$bg/train-2b.log" 2>/dev/null
grep -h '"distill"' "$work/data.log" 2>/dev/null | tail -n 1
snap=$bg/snap
# What one call brings back is bounded (64 MiB, 8 files): each poll copies what is not sent yet, in order, within
# RETURN_BYTES and RETURN_FILES, marks it sent (DIR/.sent/NAME) and leaves the rest to the next poll.
budget_bytes=${RETURN_BYTES:-62000000} budget_files=${RETURN_FILES:-8} sent_bytes=0 sent_files=0
send() {  # FILE...: 0 once every one of them has been sent (by this poll or an earlier one)
  local f mark size rest=0
  for f in "$@"; do
    [ -f "$f" ] || continue
    mark=$(dirname "$f")/.sent/$(basename "$f")
    [ -f "$mark" ] && continue
    size=$(stat -c %s "$f")
    if [ $((sent_bytes + size)) -gt "$budget_bytes" ] || [ "$sent_files" -ge "$budget_files" ]; then rest=1; continue; fi
    cp "$f" "$out/" && mkdir -p "$(dirname "$mark")" && touch "$mark" || { rest=1; continue; }
    sent_bytes=$((sent_bytes + size)) sent_files=$((sent_files + 1))
  done
  return $rest
}
if [ "${SNAPSHOT:-1}" = 1 ] && ! grep -q finished "$bg/done" 2>/dev/null; then
  if [ -f "$snap/ready" ] && [ ! -f "$snap/sent" ]; then
    if send "$snap"/snapshot.tar.gz "$snap"/snapshot-delta.safetensors.part-*; then
      touch "$snap/sent"
      echo "snapshot of $(cat "$snap/checkpoint") copied back (its parts may span this poll's OUT and earlier ones)"
    else
      echo "snapshot of $(cat "$snap/checkpoint"): part of it copied back, the rest comes with the next poll"
    fi
  fi
  latest=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["path"])' "$work/run/latest.json" 2>/dev/null || true)
  busy=0; [ -f "$snap/pid" ] && kill -0 "$(cat "$snap/pid")" 2>/dev/null && busy=1
  unsent=0; [ -f "$snap/ready" ] && [ ! -f "$snap/sent" ] && unsent=1
  # A new checkpoint, or the last export failed (its checkpoint rotated away meanwhile): export again, once the
  # last export has come back whole.
  if [ -n "$latest" ] && [ "$busy" = 0 ] && [ "$unsent" = 0 ] &&
     { [ "$latest" != "$(cat "$snap/checkpoint" 2>/dev/null)" ] || [ ! -f "$snap/ready" ]; }; then
    rm -rf "$snap" && mkdir -p "$snap" && echo "$latest" > "$snap/checkpoint"
    # shellcheck disable=SC2016
    setsid bash -c '
      cd "$3/repo"
      read -r -a extra < "$3/export_extra" || true
      PYTHONPATH=$PWD/convert:/tmp/site python3 -m a2d_convert export --checkpoint "$4/run/$1" --out "$2/model" \
        --delta "$2/delta" --force ${extra[@]+"${extra[@]}"} > "$2/export.log" 2>&1 || exit 1
      split -b "$5" -d "$2/delta/delta.safetensors" "$2/snapshot-delta.safetensors.part-"
      (cd "$2/delta" && sha256sum delta.safetensors > delta.sha256 && cp ../checkpoint . &&
        tar czf "$2/snapshot.tar.gz" --exclude delta.safetensors .)
      rm -rf "$2/model"
      touch "$2/ready"' _ "$latest" "$snap" "$bg" "$work" "${PART_BYTES:-15000000}" < /dev/null > /dev/null 2>&1 &
    echo $! > "$snap/pid"
    echo "snapshot: exporting $latest in the background; the next poll brings it back"
  fi
fi
if grep -q finished "$bg/done" 2>/dev/null || [ "${COLLECT:-0}" = 1 ]; then
  cp "$bg/recipe.log" "$out/log.txt" 2>/dev/null && sent_files=1 sent_bytes=$(stat -c %s "$out/log.txt")
  if send "$bg"/out/results.tar.gz "$bg"/out/delta.safetensors.part-* "$bg"/out/train-2b.jsonl; then
    echo "results copied back (the delta's parts may span this poll's OUT and earlier ones: bench/snapshot-delta.sh joins them)"
    if [ "${SEND_DATA:-0}" = 1 ] && [ -f "$work/data/data_manifest.json" ]; then
      data=$bg/data
      if [ ! -f "$data/ready" ]; then
        rm -rf "$data" && mkdir -p "$data"
        (cd "$work/data" && tar czf "$data/data.tar.gz" data_manifest.json train.safetensors $(ls heldout.safetensors 2>/dev/null)) &&
          (cd "$data" && sha256sum data.tar.gz > data.sha256 && split -b "${PART_BYTES:-15000000}" -d data.tar.gz data.tar.gz.part- &&
            rm data.tar.gz && touch ready)
      fi
      if [ ! -f "$data/ready" ]; then
        echo "the training data could not be packed in $data (disk space? the next poll tries again)"
      elif send "$data"/data.sha256 "$data"/data.tar.gz.part-*; then
        echo "training data copied back (bash bench/stage-data.sh joins it from the polls' folders)"
      else
        echo "part of the training data copied back; poll again for the rest"
      fi
    fi
  else
    echo "part of the results copied back; poll again for the rest"
  fi
  ls -la "$out"
fi
exit 0
