#!/usr/bin/env bash
# Development launcher: serves $A2D_MODEL through the OpenAI-compatible API from this checkout.
# Works from any directory. PORT (default 8000), A2D_DEVICE (cpu|cuda, default cpu) and A2D_API_KEY
# are read from the environment; extra arguments go to `a2d serve` (e.g. --max-queue 16).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cli="$root/dist/cli/main.js"

if [[ -z "${A2D_MODEL:-}" ]]; then
  echo "serve.sh: set A2D_MODEL to an a2d model folder (one made by \`python -m a2d_convert init\`, say)" >&2
  exit 2
fi
if [[ ! -f "$A2D_MODEL/config.json" ]]; then
  echo "serve.sh: $A2D_MODEL has no config.json; A2D_MODEL must name an a2d model folder (docs/model-format.md)" >&2
  exit 2
fi
if [[ ! -f "$cli" ]]; then
  echo "serve.sh: $cli is missing; build first with \`npm run build\` in $root" >&2
  exit 2
fi

exec node "$cli" serve --model "$A2D_MODEL" --port "${PORT:-8000}" --host 0.0.0.0 --device "${A2D_DEVICE:-cpu}" "$@"
