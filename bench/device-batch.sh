#!/usr/bin/env bash
# One GPU call: continuous batching on the packed MiniCPM5-2B-shape folder (random bf16 weights, CUDA engine).
# Stage first, here: `bash bench/stage-gpu-run.sh` (writes .device/kit). Then through the device tool:
#   carry [".device/kit"]:  bash bench/device-batch.sh                       (results under $OUT)
# (or the kit in two calls, as bench/device-gpu-run.sh says). Steps, within TOTAL_S (default 450):
#  - unpack the kit and regenerate the weights (bench/device-gpu-run.sh's steps);
#  - parity: PARITY_STREAMS (8) greedy generations of PARITY_TOKENS (256) tokens alone, then at once with
#    --max-batch PARITY_BATCH (8), through the packed engine (bench/batch-parity.mjs): identical tokens or the first
#    difference;
#  - HTTP: `a2d serve --device cuda --max-batch MAX_BATCH` (default 32) of the folder, then `a2d bench-serve`
#    at LEVELS (1,8,32), max_tokens BENCH_TOKENS (1024), temperature 0, ignore_eos, one token a forward
#    (threshold 1: random weights are never confident), so the figures compare with peers/http_stream.mjs;
#    PROMPT_TOKENS (e.g. 1024) sizes the prompt to that many tokens for TTFT at a prompt length.
#    NSYS=1: the server runs under Nsight Systems (`nsys launch`, CUDA and OS runtime, graphs as one range each)
#    and only bench-serve's time is recorded (`nsys start`/`stop`); then $OUT/nsys_*.csv (the CUDA API and
#    kernel summaries) and $OUT/nsys-gaps.txt (bench/nsys_gaps.py: the GPU's idle time between its work, the
#    host's share of a step). LEVELS=8 then profiles the 8-stream level alone.
# A backend that does not batch reports engineMaxBatch 1 in parity.json and serves one stream at a time.
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
export TOTAL_S="${TOTAL_S:-450}"
# The kit's steps (assemble, unpack, restore, prepare) and their variables ($folder, $node, $cli, $out).
A2D_GPU_RUN_LIB=1 source "$root/bench/device-gpu-run.sh"
port="${PORT:-18231}"

parity() {
  A2D_ADDON_DIR="$folder/engine" timeout -k 5 "$(limit "${PARITY_S:-150}")" "$node" "$root/bench/batch-parity.mjs" \
    --engine "$folder/app/dist/engine/index.js" --model "$folder/model" --device cuda --max-batch "${PARITY_BATCH:-8}" \
    --streams "${PARITY_STREAMS:-8}" --max-tokens "${PARITY_TOKENS:-256}" >"$out/parity.json"
  local status=$?
  cat "$out/parity.json"
  return $status
}

# Nsight Systems, where NSYS is set and the machine has it.
nsys_bin=""
if [[ -n ${NSYS:-} ]]; then
  nsys_bin=$(command -v nsys || ls -d /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -n 1)
  [[ -n $nsys_bin ]] || echo "NSYS: no nsys on this machine; serving without it"
fi

http() {
  local profile=()
  [[ -n $nsys_bin ]] && profile=("$nsys_bin" launch --session-new=a2d-serve --trace=cuda,osrt --cuda-graph-trace=graph)
  A2D_ADDON_DIR="$folder/engine" "${profile[@]}" "$node" "$cli" serve --model "$folder/model" --device cuda \
    --host 127.0.0.1 --port "$port" --max-batch "${MAX_BATCH:-32}" --log-level warn >"$out/serve.log" 2>&1 &
  local server=$! status=1 i
  for i in $(seq 240); do
    "$node" -e 'fetch(process.argv[1]).then((r) => process.exit(r.status === 200 ? 0 : 1), () => process.exit(1))' \
      "http://127.0.0.1:$port/health" && break
    kill -0 "$server" 2>/dev/null || { tail -n 20 "$out/serve.log"; return 1; }
    sleep 0.5
  done
  [[ -n $nsys_bin ]] && "$nsys_bin" start --session=a2d-serve --output="$out/serve" --force-overwrite=true
  timeout -k 5 "$(limit "${HTTP_S:-300}")" "$node" "$cli" bench-serve --url "http://127.0.0.1:$port" \
    --max-tokens "${BENCH_TOKENS:-1024}" --concurrency "${LEVELS:-1,8,32}" --temperature 0 \
    ${PROMPT_TOKENS:+--prompt-tokens "$PROMPT_TOKENS"} \
    --extra-body '{"ignore_eos": true, "threshold": 1}' --json >"$out/bench-serve.json"
  status=$?
  [[ $status == 0 ]] && "$node" --input-type=module -e '
    const { formatBenchServe } = await import(process.argv[1]);
    process.stdout.write(formatBenchServe(JSON.parse((await import("node:fs")).readFileSync(process.argv[2], "utf8"))));' \
    "$folder/app/dist/eval/bench-serve.js" "$out/bench-serve.json" | tee "$out/bench-serve.txt"
  if [[ -n $nsys_bin ]]; then
    "$nsys_bin" stop --session=a2d-serve
    "$nsys_bin" stats --quiet --report cuda_api_sum,cuda_gpu_kern_sum --format csv --output "$out/nsys" "$out/serve.nsys-rep"
    "$nsys_bin" stats --quiet --report cuda_gpu_trace --format csv --output /tmp/a2d-nsys "$out/serve.nsys-rep" &&
      python3 "$root/bench/nsys_gaps.py" /tmp/a2d-nsys_cuda_gpu_trace.csv | tee "$out/nsys-gaps.txt"
    rm -f "$out/serve.sqlite"
    "$nsys_bin" shutdown --kill=sigterm --session=a2d-serve 2>/dev/null
  fi
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  return $status
}

batch_main() {
  step "machine" machine
  step "assemble kit parts" assemble || finish 3
  step "unpack" unpack || finish 1
  step "restore weights (folder's node, bench generator)" restore || finish 1
  step "prepare (strace, libcuda)" prepare
  step "parity: alone vs --max-batch ${PARITY_BATCH:-8}" parity
  step "HTTP bench-serve ${LEVELS:-1,8,32}" http
  {
    echo "== batch summary"
    printf '%s\n' "${summary[@]}"
    cat "$out/bench-serve.txt" 2>/dev/null
  } | tee "$out/summary.txt"
}

batch_main 2>&1 | tee "$out/run.log"
exit "${PIPESTATUS[0]}"
