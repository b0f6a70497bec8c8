#!/usr/bin/env bash
# One command from an AR checkpoint to a packed, checked folder:
#
#   bash convert/recipes/convert.sh CHECKPOINT OUT
#
# CHECKPOINT: an HF folder (a Llama-family model; MiniCPM's muP scalars are folded into the weights at import,
# docs/conversion.md "import") or a GGUF file. OUT: the packed folder (`a2d pack`), made only once every check
# before it passed. The stages, each skipping what WORK (default OUT.work) already holds, so that running the
# same command again resumes where it stopped:
#   1. convert/recipes/demo-conversion.sh: import, self-distillation from the base, training (one GPU, or NGPU
#      processes under torchrun with FSDP2), export, evaluate-probes and the export at the probes' threshold;
#   2. `a2d_convert verify --base`: the model folder rebuilt from the base's own files and the delta, bit for bit;
#   3. `a2d pack --device DEVICE`;
#   4. `a2d simulate-startup`: the folder started offline, cold, and its start on one GPU predicted.
# The training data is checked against the benchmarks by default: BENCHMARKS (required) names the benchmark files or
# the folder `a2d eval --data` reads, whose text the data is n-gram-deduplicated against (blocklists in the manifest);
# BENCHMARKS=none trains without that check, and says so in the log. CORPORA adds declared corpora beside the
# self-distillation (demo-conversion.sh's header).
# Each stage prints its elapsed time and, from the second run on, what the earlier run's stages took (WORK/stages.txt)
# as the remaining stages' ETA. Knobs: every knob of demo-conversion.sh (its header; the defaults here are small
# enough for a first try: DISTILL_N 4000, training until STEPS or TRAIN_S), DEVICE (cuda or cpu: the folder's
# engine; default cuda when nvidia-smi sees a GPU), GPU (simulate-startup's target card, h100), SIMULATE_EXTRA (more
# simulate-startup flags, e.g. "--gpu-run" to also start the folder on this machine's GPU), NODE (the node that packs
# and ships; default the one on PATH), PYTHON (python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[ $# -eq 2 ] || { echo "usage: bash convert/recipes/convert.sh CHECKPOINT OUT   (knobs as environment variables: see the header)" >&2; exit 2; }
checkpoint=$1; out=$2
[ -e "$checkpoint" ] || { echo "convert: $checkpoint does not exist; give an HF checkpoint folder or a .gguf file" >&2; exit 2; }
[ -n "${BENCHMARKS:-}" ] || { echo "convert: set BENCHMARKS to the benchmark files or folder (the one \`a2d eval --data\` reads) that the training data must not overlap, or BENCHMARKS=none to train without that check" >&2; exit 2; }
[ "$BENCHMARKS" = none ] && BENCHMARKS=""
export BENCHMARKS
checkpoint=$(cd "$(dirname "$checkpoint")" && pwd)/$(basename "$checkpoint")
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
work=${WORK:-$out.work}
node=${NODE:-node}
cli="$root/dist/cli/main.js"
[ -f "$cli" ] || { echo "convert: $cli is missing; run npm run build:ts (or bash scripts/setup.sh) first" >&2; exit 2; }
if [ -z "${DEVICE:-}" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi
mkdir -p "$work"
stages_file=$work/stages.txt
t0=$(date +%s)
stage() {  # N NAME: prints the stage, the time so far and the earlier run's time of this stage and the rest
  local n=$1 name=$2 before=""
  if [ -f "$stages_file.previous" ]; then
    before=$(awk -v n="$n" '$1 >= n { s += $3 } END { if (s > 0) printf " (the last run took %d s from here)", s }' "$stages_file.previous")
  fi
  echo "== [$n/4] $name, +$(( $(date +%s) - t0 )) s$before"
  stage_start=$(date +%s)
}
stage_done() {  # N NAME
  echo "$1 $2 $(( $(date +%s) - stage_start ))" >> "$stages_file"
}
[ -f "$stages_file" ] && mv "$stages_file" "$stages_file.previous"

stage 1 conversion
SOURCE=$checkpoint WORK=$work OUT=${RESULTS:-$work/results} PROBES=${PROBES:-1} bash "$here/demo-conversion.sh"
[ -f "$work/model/config.json" ] || { echo "convert: the conversion left no final model in $work/model (see $work/timings.txt and $work/status.txt)" >&2; exit 1; }
stage_done 1 conversion

stage 2 verify
"${PYTHON:-python3}" -m a2d_convert verify --base "$checkpoint" "$work/model" | tail -n 2
stage_done 2 verify

stage 3 pack
"$node" "$cli" pack --device "$DEVICE" --model "$work/model" --out "$out" --force
stage_done 3 pack

stage 4 simulate-startup
read -r -a simulate_extra <<< "${SIMULATE_EXTRA:-}"
"$node" "$cli" simulate-startup "$out" --gpu "${GPU:-h100}" ${simulate_extra[@]+"${simulate_extra[@]}"}
stage_done 4 simulate-startup
echo "== done in $(( $(date +%s) - t0 )) s: $out (serve it with $out/serve.sh)"
