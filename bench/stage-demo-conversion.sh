#!/usr/bin/env bash
# Stages the demo conversion for the device tool: splits the pinned base GGUF into parts that fit beside
# the working tree that travels with every call (64 MiB in all: tracked files plus untracked ones that
# are not ignored, plus what `carry` names), into .device/gguf-NN/ (ignored), and prints the calls that
# bench/demo-conversion-device.sh expects. GGUF= the base file (default: npm run demo's download).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
GGUF=${GGUF:-.cache/demo/base.gguf}
GGUF_SHA256=${GGUF_SHA256:-b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53}  # another base: set GGUF and GGUF_SHA256
LIMIT=$((64 * 1024 * 1024)); MARGIN=${MARGIN:-$((2 * 1024 * 1024))}  # room for the tree to grow meanwhile
echo "$GGUF_SHA256  $GGUF" | sha256sum -c --quiet || { echo "$GGUF: not the pinned base (run npm run demo once, or set GGUF=)"; exit 1; }
[ -n "$(ls .device/whl/gguf-*.whl 2>/dev/null)" ] || { echo ".device/whl/gguf-*.whl missing (python3 -m pip download gguf==0.19.0 --no-deps -d .device/whl)"; exit 1; }
source bench/device-parts.sh
tree=$(tree_bytes)
whl=$(du -cb .device/whl | tail -1 | cut -f1)
room=$(( LIMIT - tree - MARGIN - whl ))
size=$(stat -c %s "$GGUF")
[ "$room" -gt $((4 * 1024 * 1024)) ] || { echo "the tree takes $tree bytes: no room for GGUF parts"; exit 1; }
split_parts "$GGUF" "$room" .device/gguf gguf 0
echo "tree $tree bytes + parts of $part bytes: $n parts of the GGUF ($size bytes) in .device/gguf-NN/"
echo "calls (each within 30 s of the last, so the machine stays warm; kind nvidia-h200-x2, or nvidia-h200):"
for ((i = 0; i < n - 1; i++)); do
  printf '  %d. carry [".device/gguf-%02d"]: bash bench/demo-conversion-device.sh   (stashes part %d, a few seconds)\n' $((i + 1)) "$i" "$i"
done
printf '  %d. carry [".device/gguf-%02d", ".device/whl"], timeout_s 600: bash bench/demo-conversion-device.sh\n' "$n" $((n - 1))
echo "     (joins the GGUF, imports, distils, trains until CALL_S=570 s less the export; delta + logs in \$OUT)"
printf '  %d. no carry, timeout_s 300: TRAIN_S=140 CALL_S=230 MIN_TRAIN_S=30 bash bench/demo-conversion-device.sh\n' $((n + 1))
echo "     (same warm machine: resumes to the end of the LR schedule, exports; the delta in \$OUT. Then here:"
echo "      python -m a2d_convert rebuild and evaluate-probes on the CPU, about 6 min: bench/NOTES.md, second conversion."
echo "      PROBES=1 TRAIN=0 CALL_S=240 instead runs the probes on the GPU machine)"
echo "with models/ out of the tree (bash bench/slim-tree.sh out; 44 MB less), run this again: fewer, larger parts"
