#!/usr/bin/env bash
# GPU-machine side, shared by the device scripts that need the demo base GGUF (demo-conversion-device.sh,
# rebuild-demo-device.sh): stashes the GGUF parts this call carried
# (.device/gguf-*/gguf.partNN-of-MM from bench/stage-demo-conversion.sh, or the older halves
# .device/a/part00 and .device/b/part01) in /root/stash, which a machine keeps while it stays warm (30 s
# after a call), and once every part is there joins them into /root/base.gguf, checks the pinned sha256
# and installs the carried wheels (.device/whl: gguf) into /tmp/site. Parts of an earlier run's delta
# (.device/warm-NN, bench/stage-warm-delta.sh) are stashed and joined into /root/warm the same way.
# Exit 0: /root/base.gguf is ready; 10: more parts are to come in the next call; 3: no parts at all.
set -euo pipefail
GGUF_SHA256=${GGUF_SHA256:-b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53}  # another base: set GGUF and GGUF_SHA256
mkdir -p /root/stash
shopt -s nullglob
# An earlier run's delta folder to start the adapter from (train --init-adapter /root/warm), as
# bench/stage-warm-delta.sh splits it into .device/warm-NN/: stashed like the GGUF's parts, joined and checked
# into /root/warm once every part of its weights is there.
# cp -u: the folders of earlier calls stay on a warm machine, so only this call's part is new.
for file in .device/warm-*/*; do
  mkdir -p /root/warm-stash && cp -u "$file" /root/warm-stash/ && echo "stashed $file"
done
warm_parts=(/root/warm-stash/delta.safetensors.part*-of-*)
if [ "${#warm_parts[@]}" -gt 0 ] && [ ! -f /root/warm/delta.safetensors ]; then
  warm_want=${warm_parts[0]##*-of-}
  if [ "${#warm_parts[@]}" -ge "$((10#$warm_want))" ]; then
    mkdir -p /root/warm
    find /root/warm-stash -maxdepth 1 -type f ! -name 'delta.safetensors.part*' -exec cp {} /root/warm/ \;
    cat "${warm_parts[@]}" > /root/warm/delta.safetensors
    (cd /root/warm && sha256sum -c delta.sha256) || { rm -f /root/warm/delta.safetensors; echo "the warm delta's parts do not join to its sha256"; exit 1; }
  else
    echo "warm delta: ${#warm_parts[@]} of $((10#$warm_want)) parts stashed"
  fi
fi
# An earlier conversion's training data (.device/data-NN, bench/stage-data.sh) into the recipe's WORK/data.
bash bench/device-data.sh
for part in .device/gguf-*/gguf.part*-of-* .device/a/part0[0] .device/b/part0[1]; do
  cp -u "$part" /root/stash/ && echo "stashed $part"
done
if [ ! -f /root/base.gguf ] || ! echo "$GGUF_SHA256  /root/base.gguf" | sha256sum -c --quiet 2>/dev/null; then
  parts=(/root/stash/gguf.part*-of-*)
  if [ "${#parts[@]}" -gt 0 ]; then
    want=${parts[0]##*-of-}
    if [ "${#parts[@]}" -lt "$((10#$want))" ]; then
      echo "base GGUF: ${#parts[@]} of $((10#$want)) parts stashed; carry the next part in the next call (within 30 s)"
      exit 10
    fi
    cat "${parts[@]}" > /root/base.gguf
  elif [ -f /root/stash/part00 ] && [ -f /root/stash/part01 ]; then
    cat /root/stash/part00 /root/stash/part01 > /root/base.gguf
  elif [ -f /root/stash/part00 ] || [ -f /root/stash/part01 ]; then
    echo "base GGUF: one of the two halves stashed; carry the other in the next call (within 30 s)"
    exit 10
  else
    echo "base GGUF: no parts here (a fresh machine?); start again with the first part's call"
    exit 3
  fi
  echo "$GGUF_SHA256  /root/base.gguf" | sha256sum -c
fi
if ! PYTHONPATH=/tmp/site python3 -c 'import gguf' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl
fi
