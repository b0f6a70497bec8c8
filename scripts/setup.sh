#!/usr/bin/env bash
# Bring a fresh checkout to a built state (idempotent): system packages, npm dependencies, the TypeScript
# build, the CPU engine addon and the converter's Python venv. Every test and demo command runs it first.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(cmake g++ make nlohmann-json3-dev doctest-dev strace iproute2 util-linux bubblewrap)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "a2d setup: installing system packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "a2d setup: npm ci"
  npm ci --no-audit --no-fund
fi

npm run --silent build
# The official Node build the packer ships (vendor/lock.json), fetched once from the npm registry.
node scripts/fetch-locked.mjs node >/dev/null
# The CUDA addon compiles without a GPU (sm_90 machine code) with the CUDA 12 toolkit of wheels/lock.json
# (fetched once, about 120 MB; the compile takes about 10 minutes on two cores). Built where a CUDA toolkit
# is installed (a GPU developer's machine) or A2D_CUDA=1 asks for it; A2D_CUDA=0 skips it.
if [ "${A2D_CUDA:-}" = 1 ] || { [ "${A2D_CUDA:-}" != 0 ] && command -v nvcc >/dev/null 2>&1; }; then
  npm run --silent build:cuda
fi
