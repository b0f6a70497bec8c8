#!/usr/bin/env bash
# One GPU call: what a row adapter costs the CUDA forward, `a2d bench` through the packed CUDA addon of the GPU-run
# kit (bench/stage-gpu-run.sh) on random weights, each shape without an adapter and with rank-64 ones, blocks 4 and
# 32 at KV 1k: the bundled model's shape (SmolLM2-135M) and MiniCPM5-2B's. The kit's parts may come over several
# calls (they are stashed until complete, exit 3 meanwhile). Each bench's JSON goes to $OUT/adapter-cost.json:
#   {"<shape>[+<rule><rank>]": <a2d bench --json>, ...}
# Knobs: SHAPES ("smollm2-135m minicpm5-2b"), ADAPTERS ("mask:64 window:64 window-rule": window-rule is the window
# rule, whose factors are merged into the weights), BLOCKS (4,32), KV (1024), TOKENS (256),
# TOTAL_S (400).
# NCU=1 then profiles (Nsight Compute) the decode GEMMs of three layers of one MiniCPM5-2B forward at block 4, without
# and with a window:64 adapter, into $OUT/ncu-minicpm5-2b[-window64].txt: the tile kernel's launches only (every
# projection and the lm_head of a forward of up to 8 rows; a prompt's forwards of more rows take the wide one),
# NCU_SKIP of them first (2000: past the first generation's start), then NCU_COUNT (12).
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
export TOTAL_S="${TOTAL_S:-400}"
A2D_GPU_RUN_LIB=1 source "$root/bench/device-gpu-run.sh"
# Sets `name` ("<shape>" or "<shape>+<rule><rank>") and `args` (the bench's --random-adapter, if any) of a shape and
# an adapter ("none" or "<rule>:<rank>").
variant() {
  name=$1; args=()
  [[ $2 == none ]] || { name="$1+${2/:/}"; args=(--random-adapter "$2"); }
}
# `a2d bench --random-shape <shape> --device cuda <args...>` through the kit's folder within <seconds>, its stdout
# into <file> (its per-block progress lines dropped from stderr): bench_run <file> <seconds> <shape> <args...>,
# under the command in the array `profiler` when that is set.
profiler=()
bench_run() {
  local file=$1 seconds=$2 shape=$3
  shift 3
  TMPDIR="$work" A2D_ADDON_DIR="$folder/engine" timeout -k 10 "$seconds" "${profiler[@]}" "$node" "$cli" bench \
    --random-shape "$shape" --device cuda "$@" > "$file" 2> >(grep -v "^  block" >&2)
}
cost_main() {
  step "machine" machine
  step "assemble kit parts" assemble || finish 3
  [[ -x $node ]] || step "unpack" unpack || finish 1
  local shape adapter name args
  echo "{" > "$out/adapter-cost.json"
  for shape in ${SHAPES:-smollm2-135m minicpm5-2b}; do
    for adapter in none ${ADAPTERS:-mask:64 window:64 window-rule}; do
      variant "$shape" "$adapter"
      step "bench $name" bench_run "$work/bench.json" "$(limit 150)" "$shape" --blocks "${BLOCKS:-4,32}" \
        --kv "${KV:-1024}" --tokens "${TOKENS:-256}" --json "${args[@]}" &&
        { printf '"%s": ' "$name"; cat "$work/bench.json"; echo ","; } >> "$out/adapter-cost.json"
      "$node" -e '
        const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
        for (const row of r.rows) console.log(`${process.argv[2].padEnd(24)} block ${row.blockSize} kv ${row.kv}: ${row.msPerForward.toFixed(3)} ms/forward`);' \
        "$work/bench.json" "$name" 2>/dev/null | tee -a "$out/summary.txt"
    done
  done
  echo '"done": true}' >> "$out/adapter-cost.json"
  [[ ${NCU:-0} == 1 ]] && for adapter in none window:64; do
    variant minicpm5-2b "$adapter"
    profiler=(ncu --target-processes all --kernel-name regex:'^gemm_kernel$' --launch-skip "${NCU_SKIP:-2000}"
      --launch-count "${NCU_COUNT:-12}" --section SpeedOfLight --section WarpStateStats --section LaunchStats
      --section MemoryWorkloadAnalysis)
    step "ncu $name" bench_run "$out/ncu-${name/+/-}.txt" "$(limit 120)" minicpm5-2b --blocks 4 --kv 1024 --tokens 32 \
      "${args[@]}"
    grep -E "^  [a-z_]+.*gemm|Duration|DRAM Throughput|Compute \(SM\) Throughput|Grid Size" "$out/ncu-${name/+/-}.txt" |
      head -60
  done
  finish 0
}
cost_main 2>&1 | tee "$out/run.log"
exit "${PIPESTATUS[0]}"
