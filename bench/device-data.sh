#!/usr/bin/env bash
# GPU-machine side: an earlier conversion's training data (the polls brought it back with SEND_DATA=1, and
# `bash bench/stage-data.sh` split it into .device/data-NN here) into the recipe's WORK/data, so that the recipe
# skips its self-distillation (convert/recipes/demo-conversion.sh makes data only where WORK/data has no
# data_manifest.json) and trains for that time instead. Run by bench/device-base-gguf.sh on every call: each call
# stashes the parts it carried (a machine keeps them while it stays warm, 30 s after a call); once all are there
# they are joined, checked against data.sha256 and unpacked. Nothing carried: nothing done.
# DATA_STASH (default /root/data-stash) and DATA_DIR (default /root/w/data) say where.
set -euo pipefail
stash=${DATA_STASH:-/root/data-stash}
dest=${DATA_DIR:-/root/w/data}
source "$(dirname "$0")/device-parts.sh"
shopt -s nullglob
carried=(.device/data-*/*)
[ "${#carried[@]}" -gt 0 ] || exit 0
stash_carried "$stash" "${carried[@]}"
if [ -f "$dest/data_manifest.json" ]; then echo "data: $dest holds its data already"; exit 0; fi
[ -f "$stash/data.sha256" ] || { echo "data: no data.sha256 stashed yet"; exit 0; }
status=0
join_stashed "$stash" data.tar.gz "$stash/data.tar.gz" || status=$?
[ "$status" = 3 ] && echo "data: no parts stashed yet"
[ "$status" = 0 ] || exit 0
(cd "$stash" && sha256sum -c --quiet data.sha256) || { rm -f "$stash/data.tar.gz"; echo "data: the parts do not join to data.sha256"; exit 1; }
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
tar xzf "$stash/data.tar.gz" -C "$dest.tmp"
[ -f "$dest.tmp/data_manifest.json" ] || { rm -rf "$dest.tmp"; echo "data: the archive holds no data_manifest.json"; exit 1; }
rm -rf "$dest" && mv "$dest.tmp" "$dest" && rm -f "$stash/data.tar.gz"
echo "data: unpacked into $dest ($(ls "$dest" | tr '\n' ' ')); the recipe skips its self-distillation"
