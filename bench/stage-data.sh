#!/usr/bin/env bash
# A background conversion's training data (bench/device-conversion-bg.sh polls with SEND_DATA=1 bring back
# data.sha256 and data.tar.gz.part-NN, over several polls) staged for the next conversion: the parts joined by
# name from the polls' folders (each taken once, in order), checked against data.sha256, then split into
# .device/data-NN folders that fit beside the travelling tree (64 MiB a call with what `carry` names).
# bench/device-data.sh (run by every MODE=start call) stashes them and unpacks WORK/data once all are there, so
# the recipe trains on the same data without distilling it again.
#   bash bench/stage-data.sh /work/.device/N [/work/.device/M ...]
# Then carry [".device/data-00"], [".device/data-01"], ... in calls within 30 s of each other, before the start
# call. STAGE_ROOT (default: the repository) is where .device/ goes.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: bash bench/stage-data.sh DIR..." >&2; exit 2; }
cd "$root"
source bench/device-parts.sh
stage=${STAGE_ROOT:-$root}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sha=""
for d in "$@"; do
  [ -d "$d" ] || { echo "$d: no such folder" >&2; exit 1; }
  [ -z "$sha" ] && [ -f "$d/data.sha256" ] && sha=$d/data.sha256
done
[ -n "$sha" ] || { echo "none of $* holds data.sha256 (a poll with SEND_DATA=1 brings it back first)" >&2; exit 1; }
join_by_name "$tmp/data.tar.gz" data.tar.gz.part- "$@"
[ "$joined" -gt 0 ] || { echo "no data.tar.gz.part-* in $*" >&2; exit 1; }
cp "$sha" "$tmp/data.sha256"
(cd "$tmp" && sha256sum -c --quiet data.sha256) || { echo "the parts do not match data.sha256: a part is missing or cut short (poll again)" >&2; exit 1; }
LIMIT=$((64 * 1024 * 1024)); MARGIN=${MARGIN:-$((2 * 1024 * 1024))}
room=$(( LIMIT - $(tree_bytes) - MARGIN - 4096 ))
[ "$room" -gt $((4 * 1024 * 1024)) ] || { echo "the tree leaves no room for the data's parts (bash bench/slim-tree.sh out)" >&2; exit 1; }
mkdir -p "$stage/.device"
split_parts "$tmp/data.tar.gz" "$room" "$stage/.device/data" data.tar.gz 0
cp "$tmp/data.sha256" "$stage/.device/data-00/"
echo "the data ($(stat -c %s "$tmp/data.tar.gz") bytes) in $n parts of $part bytes; the calls:"
for ((i = 0; i < n; i++)); do printf '  carry [".device/data-%02d"]\n' "$i"; done
