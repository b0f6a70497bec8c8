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
  # As root (a container, CI) the packages are installed here; otherwise only with a sudo that asks for no
  # password, and else the command is printed for the user to run: nothing prompts in the middle of a test run.
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if sudo -n true 2>/dev/null; then
      SUDO="sudo -n"
    else
      echo "a2d setup: missing system packages: ${missing[*]}" >&2
      echo "  install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
      echo "  then run this command again" >&2
      exit 1
    fi
  fi
  echo "a2d setup: installing system packages (apt-get${SUDO:+ through sudo}): ${missing[*]}"
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
