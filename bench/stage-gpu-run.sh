#!/usr/bin/env bash
# Stages the GPU-run kit here (no GPU needed): a folder packed with the CUDA engine for the MiniCPM5-2B
# shape (random bf16 weights, the tiny model's tokenizer), archived WITHOUT its 4.7 GiB weights file into
# .device/kit/ (ignored; carried by the device tool). bench/device-gpu-run.sh unpacks it on the GPU machine
# and regenerates the weights with the folder's own Node running `a2d bench`'s generator (randomModel in
# cli/commands/bench.ts): same binary, same bytes, so MANIFEST.json and `a2d verify` hold there.
#
#   bash bench/stage-gpu-run.sh            (A2D_STAGE_BUILD=0 skips the three builds; A2D_STAGE_DIR=/tmp/a2d-gpu-stage)
#
# The kit is split into parts of at most 15 MiB, so it can travel in one call or two (see device-gpu-run.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
stage="${A2D_STAGE_DIR:-/tmp/a2d-gpu-stage}"
kit="$root/.device/kit"
shape=minicpm5-2b
model="$stage/$shape-random"
folder="$stage/folder"
timings=()

step() {
  local name="$1" t0=$SECONDS
  shift
  echo "== $name"
  "$@"
  timings+=("$(printf '%-40s %4d s' "$name" $((SECONDS - t0)))")
}

build() {
  cd "$root"
  npm run build:ts
  npm run build:engine
  npm run build:cuda
}

# The tiny base's tokenizer (a real BPE with a ChatML template): the server needs one to start and chat.
tokenizer() {
  "$root/.venv/bin/python" -m a2d_convert tiny-base --out "$stage/tokenizer-base" --force >/dev/null
}

weights() {
  rm -rf "$stage/a2d-bench-$shape"
  TMPDIR="$stage" node --input-type=module \
    -e "const { randomModel } = await import(process.argv[1]); randomModel(process.argv[2]);" \
    "$root/dist/cli/commands/bench.js" "$shape"
  rm -rf "$model"
  mkdir -p "$model"
  ln "$stage/a2d-bench-$shape/model.safetensors" "$model/"
  cp "$stage/a2d-bench-$shape/config.json" "$stage/tokenizer-base/tokenizer.json" "$stage/tokenizer-base/tokenizer_config.json" "$model/"
  # The tiny tokenizer fitted to the random model: its mask token, and a whole UTF-8 text for every id.
  node "$root/bench/kit-tokenizer.mjs" "$model/config.json" "$model/tokenizer.json"
}

pack() {
  node "$root/dist/cli/main.js" pack --model "$model" --out "$folder" --device cuda --force
}

# strace and bwrap for the simulator (the GPU image has neither).
tools() {
  bash "$root/bench/kit-tools.sh" "$stage/tools"
}

archive() {
  mkdir -p "$kit"
  rm -f "$kit"/kit.tar.xz.* "$kit/SHA256SUMS" "$kit/KIT.txt"
  tar --sort=name --owner=0 --group=0 --numeric-owner --exclude=folder/model/model.safetensors -C "$stage" -cf - folder tools |
    xz -9 -T2 | split -b 15M -d -a 2 - "$kit/kit.tar.xz."
  (cd "$kit" && sha256sum kit.tar.xz.* >SHA256SUMS)
  {
    echo "a2d GPU-run kit: $shape random weights, CUDA folder, made $(date -u +%FT%TZ)"
    echo "commit $(git -C "$root" describe --always --dirty)"
    echo "node $(node --version); weights regenerated on the GPU machine:"
    grep -o '"path":"model/model.safetensors"[^}]*' "$folder/MANIFEST.json"
    (cd "$kit" && ls -l kit.tar.xz.* | awk '{print $5, $NF}')
  } >"$kit/KIT.txt"
}

mkdir -p "$stage"
[[ ${A2D_STAGE_BUILD:-1} == 0 ]] || step "build (ts, cpu addon, cuda addon)" build
step "tokenizer (tiny-base)" tokenizer
step "weights ($shape, bench generator)" weights
step "pack --device cuda" pack
step "strace and bwrap for the simulator" tools
step "archive (tar | xz -9, 15 MiB parts)" archive

cat "$kit/KIT.txt"
du -sh "$kit"
printf '%s\n' "${timings[@]}"
echo "carry .device/kit (one call), or .device/kit/SHA256SUMS with one part per call; then: bash bench/device-gpu-run.sh"
