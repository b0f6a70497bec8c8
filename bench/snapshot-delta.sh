#!/usr/bin/env bash
# A background conversion's delta (bench/device-conversion-bg.sh) as a delta folder here, from the folders the polls
# brought back: a snapshot (snapshot.tar.gz, the latest checkpoint's export while the job ran, and its
# snapshot-delta.safetensors.part-NN) or the final results (results.tar.gz and delta.safetensors.part-NN). A delta
# larger than one call's return comes over several polls: name every folder that holds some of it; each part is
# taken once, by name, in order. The joined weights' sha256 is checked. Then
# `a2d_convert rebuild --base BASE --delta OUT_DELTA --out MODEL`.
#   bash bench/snapshot-delta.sh /work/.device/N [/work/.device/M ...] /tmp/snapshot/delta
set -euo pipefail
source "$(dirname "$0")/device-parts.sh"
[ $# -ge 2 ] || { echo "usage: bash bench/snapshot-delta.sh DIR... OUT_DELTA" >&2; exit 2; }
dst=${*: -1}
dirs=("${@:1:$#-1}")
kind=""
for d in "${dirs[@]}"; do
  [ -d "$d" ] || { echo "$d: no such folder" >&2; exit 1; }
  if [ -z "$kind" ] && [ -f "$d/snapshot.tar.gz" ]; then kind=snapshot archive=$d/snapshot.tar.gz; fi
  if [ -z "$kind" ] && [ -f "$d/results.tar.gz" ]; then kind=results archive=$d/results.tar.gz; fi
done
[ -n "$kind" ] || { echo "none of ${dirs[*]} holds snapshot.tar.gz or results.tar.gz (a poll brings one back once an export finished)" >&2; exit 1; }
prefix=delta.safetensors.part-
[ "$kind" = snapshot ] && prefix=snapshot-$prefix
rm -rf "$dst.tmp" && mkdir -p "$dst.tmp"
if [ "$kind" = snapshot ]; then
  tar xzf "$archive" -C "$dst.tmp"
else
  # results.tar.gz: the delta folder's small files under delta/, the weights' sha256 beside it.
  mkdir -p "$dst.tmp/results"
  tar xzf "$archive" -C "$dst.tmp/results" delta delta.sha256
  mv "$dst.tmp/results/delta/"* "$dst.tmp/" && mv "$dst.tmp/results/delta.sha256" "$dst.tmp/" && rm -rf "$dst.tmp/results"
fi
join_by_name "$dst.tmp/delta.safetensors" "$prefix" "${dirs[@]}"
[ "$joined" -gt 0 ] || { rm -rf "$dst.tmp"; echo "no $prefix* in ${dirs[*]}" >&2; exit 1; }
(cd "$dst.tmp" && sha256sum -c --quiet delta.sha256) ||
  { rm -rf "$dst.tmp"; echo "the joined weights do not match delta.sha256: a part is missing ($joined found in ${dirs[*]})" >&2; exit 1; }
rm -rf "$dst" && mv "$dst.tmp" "$dst"
if [ "$kind" = snapshot ]; then echo "$dst: the delta of checkpoint $(cat "$dst/checkpoint")"; else echo "$dst: the final delta"; fi
