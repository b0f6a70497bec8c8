#!/usr/bin/env bash
# strace and bwrap for simulate-startup's tracing and sandbox on the GPU machine, whose image has neither: each
# copied with the non-libc libraries it links and run through the dynamic loader with its own library path, so
# nothing it starts inherits that path. Used by the GPU kits (bench/stage-gpu-run.sh, bench/stage-recipe-kit.sh).
#
#   bash bench/kit-tools.sh DIR      (writes DIR/strace/strace and DIR/bwrap/bwrap)
set -euo pipefail
dir=${1:?usage: bash bench/kit-tools.sh DIR}
rm -rf "$dir"
for tool in strace bwrap; do
  command -v "$tool" >/dev/null || { echo "kit-tools: $tool is not installed here (apt-get install strace bubblewrap)" >&2; exit 2; }
  mkdir -p "$dir/$tool/lib"
  cp "$(command -v "$tool")" "$dir/$tool/$tool.real"
  ldd "$dir/$tool/$tool.real" | awk '$3 ~ /^\// {print $3}' | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    xargs -r -I{} cp -L {} "$dir/$tool/lib/"
  printf '#!/bin/sh\nhere="$(dirname "$(readlink -f "$0")")"\nexec /lib64/ld-linux-x86-64.so.2 --library-path "$here/lib" "$here/%s.real" "$@"\n' "$tool" >"$dir/$tool/$tool"
  chmod +x "$dir/$tool/$tool"
done
"$dir/strace/strace" -V | head -1
"$dir/bwrap/bwrap" --version
