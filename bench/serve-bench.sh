#!/usr/bin/env bash
# bench/serve-bench.sh MODEL_DIR [a2d serve flags...]: starts `a2d serve` on MODEL_DIR (port $PORT, default
# 18100), waits for /health, runs `a2d bench-serve` against it and stops it. The table goes to stdout, the
# JSON to $JSON_OUT when set.
#   LEVELS       concurrency levels (default 1,2,4,8,16,32)
#   MAX_TOKENS   max_tokens per request (default 128)
#   A2D_ROOT     the checkout whose dist/cli/main.js serves (default: this one; an older build measures "before")
#   BENCH_ROOT   the checkout whose bench-serve measures (default: this one)
#   NODE         the node binary (default: node)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model=${1:?usage: bench/serve-bench.sh MODEL_DIR [a2d serve flags...]}
shift
root=${A2D_ROOT:-$here}
bench_root=${BENCH_ROOT:-$here}
port=${PORT:-18100}
node=${NODE:-node}
log=$(mktemp)
"$node" "$root/dist/cli/main.js" serve --model "$model" --port "$port" --host 127.0.0.1 --log-level warn "$@" >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1200); do
  if curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$server" 2>/dev/null; then cat "$log" >&2; echo "serve-bench: a2d serve exited" >&2; exit 1; fi
  sleep 0.5
done
curl -fs "http://127.0.0.1:$port/health" | "$node" -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const h=JSON.parse(s);console.error(`serving ${h.model} on ${h.device}, queue ${JSON.stringify(h.queue)}`)})'
args=(bench-serve --url "http://127.0.0.1:$port" --max-tokens "${MAX_TOKENS:-128}" --concurrency "${LEVELS:-1,2,4,8,16,32}"
      --temperature 0 --extra-body '{"ignore_eos": true}')
if [ -n "${JSON_OUT:-}" ]; then
  "$node" "$bench_root/dist/cli/main.js" "${args[@]}" --json >"$JSON_OUT"
  "$node" -e 'import(process.argv[1]).then(m=>process.stdout.write(m.formatBenchServe(JSON.parse(require("fs").readFileSync(process.argv[2],"utf8")))))' \
    "$bench_root/dist/eval/bench-serve.js" "$JSON_OUT"
else
  "$node" "$bench_root/dist/cli/main.js" "${args[@]}"
fi
