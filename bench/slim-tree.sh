#!/usr/bin/env bash
# The tree that travels with every device call (64 MiB with what `carry` names) holds the 39 MB demo delta.
# `bash bench/slim-tree.sh out` takes models/ out of it for calls that carry large files (the GGUF parts
# .device/gguf-NN, a warm delta's or data's parts, build/device; the delta itself can then travel as
# `carry ["models/smollm2-135m-a2d"]`); `bash bench/slim-tree.sh in` puts it back. While it is out, git
# sees the delta as deleted in the index: put it back before any commit.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=.git/info/exclude
case "${1:-}" in
  out)
    git rm -r --cached -q models/smollm2-135m-a2d
    grep -qx '/models/' "$exclude" 2>/dev/null || echo '/models/' >> "$exclude"
    echo "models/ is out of the travelling tree; run 'bash bench/slim-tree.sh in' before committing" ;;
  in)
    if [ -f "$exclude" ]; then grep -vx '/models/' "$exclude" > "$exclude.tmp" || true; mv "$exclude.tmp" "$exclude"; fi
    git add models/smollm2-135m-a2d
    git diff --cached --quiet -- models || { echo "models/ differs from HEAD after putting it back:"; git diff --cached --stat -- models; exit 1; }
    echo "models/ is back in the tree" ;;
  *) echo "usage: bash bench/slim-tree.sh out|in"; exit 2 ;;
esac
