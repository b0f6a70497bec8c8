#!/usr/bin/env bash
# Stages an earlier conversion's delta folder (`export --delta`, or bench/snapshot-delta.sh's) for the device tool, so
# that a new run on the GPU machine starts its adapter from it (train --init-adapter /root/warm): the small files and
# delta.sha256 in .device/warm-00/, the weights split into parts that fit beside the travelling tree (64 MiB a call
# with what `carry` names), one folder a call. bench/device-base-gguf.sh (run by every MODE=start call of
# bench/device-conversion-bg.sh) stashes them and joins /root/warm once all are there.
#   bash bench/stage-warm-delta.sh /tmp/q15/delta
# Then carry [".device/warm-00"], [".device/warm-01"], ... in calls within 30 s of each other, before the start call,
# whose TRAIN_EXTRA adds --init-adapter /root/warm (the same --lora-rank, --lora-alpha and --lora-targets).
# STAGE_ROOT (default: the repository) is where .device/ goes.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src=${1:?usage: bash bench/stage-warm-delta.sh DELTA_DIR}
[ -f "$src/delta.json" ] && [ -f "$src/delta.safetensors" ] || { echo "$src: not a delta folder (delta.json and delta.safetensors)"; exit 1; }
cd "$root"
LIMIT=$((64 * 1024 * 1024)); MARGIN=${MARGIN:-$((2 * 1024 * 1024))}
source bench/device-parts.sh
tree=$(tree_bytes)
small=$(find "$src" -maxdepth 1 -type f ! -name delta.safetensors -printf '%s\n' | awk '{s += $1} END {print s + 4096}')
room=$(( LIMIT - tree - MARGIN - small ))  # the small files travel with the first part
[ "$room" -gt $((4 * 1024 * 1024)) ] || { echo "the tree takes $tree bytes: no room for the delta's parts (bash bench/slim-tree.sh out)"; exit 1; }
size=$(stat -c %s "$src/delta.safetensors")
stage=${STAGE_ROOT:-$root}
mkdir -p "$stage/.device"
split_parts "$src/delta.safetensors" "$room" "$stage/.device/warm" delta.safetensors 1
mkdir -p "$stage/.device/warm-00"
find "$src" -maxdepth 1 -type f ! -name delta.safetensors -exec cp {} "$stage/.device/warm-00/" \;
(cd "$src" && sha256sum delta.safetensors) > "$stage/.device/warm-00/delta.sha256"
echo "the delta ($size bytes) in $n parts of $part bytes; the calls:"
printf '  carry [".device/warm-00", ".device/warm-01"]\n'
for ((i = 2; i <= n; i++)); do printf '  carry [".device/warm-%02d"]\n' "$i"; done
