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
# The CUDA addon compiles without a GPU (sm_90 machine code); build it wherever nvcc is, so the tests keep
# its no-device path and its link line honest.
if command -v nvcc >/dev/null 2>&1; then
  npm run --silent build:cuda
fi
