#!/usr/bin/env bash
# GPU-machine side, shared by the device scripts that need the demo base GGUF (demo-conversion-device.sh,
# rebuild-demo-device.sh): stashes the GGUF parts this call carried (.device/gguf-*/gguf.partNN-of-MM from
# bench/stage-demo-conversion.sh) in /root/stash, which a machine keeps while it stays warm (30 s after a call),
# and once every part is there joins them into /root/base.gguf, checks the pinned sha256 and installs the carried
# wheels (.device/whl: gguf) into /tmp/site. Parts of an earlier run's delta (.device/warm-NN,
# bench/stage-warm-delta.sh) are stashed and joined into /root/warm the same way, and an earlier conversion's
# training data (.device/data-NN) by bench/device-data.sh; a corpus's files (.device/corpus) are stashed.
# Exit 0: /root/base.gguf is ready; 10: more parts are to come in the next call; 3: no parts at all.
# GGUF_STASH, BASE_GGUF, WARM_STASH and WARM_DIR (defaults /root/stash, /root/base.gguf, /root/warm-stash,
# /root/warm) say where the parts and what they join go.
set -euo pipefail
GGUF_SHA256=${GGUF_SHA256:-b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53}  # another base: set GGUF and GGUF_SHA256
here=$(dirname "$0")
source "$here/device-parts.sh"
shopt -s nullglob
# An earlier run's delta folder to start the adapter from (train --init-adapter /root/warm), as
# bench/stage-warm-delta.sh splits it into .device/warm-NN/: joined and checked into /root/warm once every part of
# its weights is there.
gguf_stash=${GGUF_STASH:-/root/stash} base=${BASE_GGUF:-/root/base.gguf}
warm_stash=${WARM_STASH:-/root/warm-stash}
warm=${WARM_DIR:-/root/warm}
carried=(.device/warm-*/*)
[ "${#carried[@]}" -gt 0 ] && stash_carried "$warm_stash" "${carried[@]}"
if [ -d "$warm_stash" ] && [ ! -f "$warm/delta.safetensors" ]; then
  status=0
  join_stashed "$warm_stash" delta.safetensors "$warm_stash/joined" || status=$?
  if [ "$status" = 0 ]; then
    mkdir -p "$warm"
    find "$warm_stash" -maxdepth 1 -type f ! -name 'delta.safetensors.part*' ! -name joined -exec cp {} "$warm/" \;
    mv "$warm_stash/joined" "$warm/delta.safetensors"
    (cd "$warm" && sha256sum -c delta.sha256) || { rm -f "$warm/delta.safetensors"; echo "the warm delta's parts do not join to its sha256"; exit 1; }
  fi
fi
bash "$here/device-data.sh"
# Files for the recipe's CORPORA (bench/stage-corpus.sh: a pinned wheel whose sources convert/recipes/code_corpus.py
# cuts into a JSONL), kept in CORPUS_STASH (default /root/corpus) for the start call to build from.
carried=(.device/corpus/*)
[ "${#carried[@]}" -gt 0 ] && stash_carried "${CORPUS_STASH:-/root/corpus}" "${carried[@]}"
carried=(.device/gguf-*/gguf.part*-of-*)
[ "${#carried[@]}" -gt 0 ] && stash_carried "$gguf_stash" "${carried[@]}"
if [ ! -f "$base" ] || ! echo "$GGUF_SHA256  $base" | sha256sum -c --quiet 2>/dev/null; then
  status=0
  join_stashed "$gguf_stash" gguf "$base" || status=$?
  [ "$status" = 3 ] && echo "base GGUF: no parts here (a fresh machine?); start again with the first part's call"
  [ "$status" = 0 ] || exit "$status"
  echo "$GGUF_SHA256  $base" | sha256sum -c
fi
if ! PYTHONPATH=/tmp/site python3 -c 'import gguf' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl
fi
