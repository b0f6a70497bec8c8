#!/usr/bin/env bash
# Stages, here (no GPU needed), what convert/recipes/convert.sh needs on the GPU machine besides the tracked tree and
# the machine's own Python (torch, transformers, safetensors): the built CLI (dist/), the production node_modules
# and the npm cache `a2d pack` reifies the folder's modules from (the GPU machine reaches no registry), the pinned
# Node (vendor/node-*), the CPU and CUDA addons (build/engine, build/engine-cuda) and strace/bwrap for the
# simulator. Written as xz parts of at most 15 MiB into .device/recipe-kit/ (ignored), for
# bench/device-recipe-dry-run.sh.
#
#   bash bench/stage-recipe-kit.sh          (A2D_STAGE_BUILD=0 skips the builds; A2D_STAGE_DIR=/tmp/a2d-recipe-stage)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
stage="${A2D_STAGE_DIR:-/tmp/a2d-recipe-stage}"
kit="$root/.device/recipe-kit"
node_dir=$(node -e 'const l = require(process.argv[1]).node; console.log(`vendor/node-${l.version}`)' "$root/vendor/lock.json")
cd "$root"
if [[ ${A2D_STAGE_BUILD:-1} != 0 ]]; then
  npm run build:ts
  npm run build:engine
  npm run build:cuda
fi
for need in dist/cli/main.js build/engine/a2d_cpu.node build/engine-cuda/a2d_cuda.node build/engine-cuda/a2d_cuda.build.json "$node_dir/bin/node"; do
  [[ -e $need ]] || { echo "stage-recipe-kit: $need is missing (npm run demo builds and fetches everything)" >&2; exit 2; }
done
rm -rf "$stage" && mkdir -p "$stage/app"
# The production modules from the lockfile, into a cache of their own: the GPU machine's `a2d pack` finds every
# tarball it needs there, and nothing else.
cp package.json package-lock.json "$stage/app/"
(cd "$stage/app" && npm_config_cache="$stage/npm-cache" npm ci --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error)
bash bench/kit-tools.sh "$stage/tools"
mkdir -p "$kit"
rm -f "$kit"/kit.tar.xz.* "$kit/SHA256SUMS" "$kit/KIT.txt"
# The archive holds repo/ (laid over the tree's copy on the GPU machine), npm-cache/ and tools/.
mkdir -p "$stage/kit/repo/build/engine" "$stage/kit/repo/build/engine-cuda"
cp -a dist "$stage/kit/repo/"
cp -a build/engine/a2d_cpu.node "$stage/kit/repo/build/engine/"
cp -a build/engine-cuda/a2d_cuda.node build/engine-cuda/a2d_cuda.build.json "$stage/kit/repo/build/engine-cuda/"
mkdir -p "$stage/kit/repo/$node_dir/bin" && cp -a "$node_dir/bin/node" "$stage/kit/repo/$node_dir/bin/"
mv "$stage/app/node_modules" "$stage/kit/repo/node_modules"
mv "$stage/npm-cache" "$stage/tools" "$stage/kit/"
tar --sort=name --owner=0 --group=0 --numeric-owner -C "$stage/kit" -cf - repo npm-cache tools |
  xz -6 -T2 | split -b 15M -d -a 2 - "$kit/kit.tar.xz."
(cd "$kit" && sha256sum kit.tar.xz.* >SHA256SUMS)
{
  echo "a2d recipe kit, made $(date -u +%FT%TZ), commit $(git describe --always --dirty)"
  echo "node $("$node_dir/bin/node" --version); $(du -sh "$stage/kit/repo/node_modules" | cut -f1) production node_modules; npm cache $(du -sh "$stage/kit/npm-cache" | cut -f1)"
  (cd "$kit" && ls -l kit.tar.xz.* | awk '{print $5, $NF}')
} >"$kit/KIT.txt"
cat "$kit/KIT.txt"
echo "carry .device/recipe-kit/SHA256SUMS with one or more parts per call: bash bench/device-recipe-dry-run.sh (its header)"
