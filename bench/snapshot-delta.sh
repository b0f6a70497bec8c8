#!/usr/bin/env bash
# A background conversion's snapshot (bench/device-conversion-bg.sh: the latest checkpoint's export that a poll
# brought back) as a delta folder here: snapshot.tar.gz's small files and the joined snapshot-delta.safetensors
# parts, the weights' sha256 checked. Then `a2d_convert rebuild --base BASE --delta OUT_DELTA --out MODEL`.
#   bash bench/snapshot-delta.sh /work/.device/N /tmp/snapshot/delta
set -euo pipefail
src=${1:?usage: bash bench/snapshot-delta.sh DIR_WITH_THE_SNAPSHOT OUT_DELTA}
dst=${2:?usage: bash bench/snapshot-delta.sh DIR_WITH_THE_SNAPSHOT OUT_DELTA}
[ -f "$src/snapshot.tar.gz" ] || { echo "no snapshot.tar.gz in $src (a poll brings one back once an export finished)" >&2; exit 1; }
compgen -G "$src/snapshot-delta.safetensors.part-*" > /dev/null || { echo "no snapshot-delta.safetensors.part-* in $src" >&2; exit 1; }
rm -rf "$dst.tmp" && mkdir -p "$dst.tmp"
tar xzf "$src/snapshot.tar.gz" -C "$dst.tmp"
cat "$src"/snapshot-delta.safetensors.part-* > "$dst.tmp/delta.safetensors"
(cd "$dst.tmp" && sha256sum -c --quiet delta.sha256) || { echo "the joined weights do not match delta.sha256: a part is missing" >&2; exit 1; }
rm -rf "$dst" && mv "$dst.tmp" "$dst"
echo "$dst: the delta of checkpoint $(cat "$dst/checkpoint")"
