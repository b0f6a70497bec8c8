#!/usr/bin/env bash
# Build the converter's Python environment at .venv (idempotent): pinned requirements, then convert/ editable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.a2d-requirements.sha256
want=$(sha256sum convert/requirements.txt convert/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --progress-bar off --upgrade pip
  .venv/bin/python -m pip install -q --progress-bar off -r convert/requirements.txt
  .venv/bin/python -m pip install -q --progress-bar off --no-deps -e convert
  echo "$want" > "$stamp"
fi
echo "python venv ready: .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
