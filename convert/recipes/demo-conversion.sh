#!/usr/bin/env bash
# The demo conversion: an AR base (a GGUF or HF folder) -> a trained block-diffusion model shipped as a
# compact LoRA delta, with a1-GPU vs N-GPU scaling check on the way. Runs on a GPU machine as it is, or on
# the CPU with tiny settings (the test suite's dry run). Every knob is an environment variable:
#   SOURCE      the base: .gguf file or HF folder                 (required)
#   WORK        working folder (kept between runs)                (required)
#   PROMPTS     JSONL of prompts for self-distillation            (default: made by make_prompts.py)
#   NGPU        processes for the main run (torchrun)             (default 1)
#   SCALE_STEPS steps of the 1-process vs NGPU-process comparison (default 0: skip)
#   SCALE_ONLY  1: stop after that comparison (no main run, export or probes)
#   STEPS, MINUTES, BATCH_ROWS, MICRO_ROWS, SEQ_LEN, LR, RANK, DISTILL_N, DISTILL_TOKENS, PROBES_PER_FAMILY
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${SOURCE:?SOURCE= the base GGUF file or HF folder}" "${WORK:?WORK= a working folder}"
NGPU=${NGPU:-1}; SCALE_STEPS=${SCALE_STEPS:-0}; STEPS=${STEPS:-100000}; MINUTES=${MINUTES:-5}
BATCH_ROWS=${BATCH_ROWS:-64}; MICRO_ROWS=${MICRO_ROWS:-16}; SEQ_LEN=${SEQ_LEN:-512}; LR=${LR:-5e-4}
RANK=${RANK:-64}; DISTILL_N=${DISTILL_N:-4000}; DISTILL_TOKENS=${DISTILL_TOKENS:-256}
PROBES_PER_FAMILY=${PROBES_PER_FAMILY:-20}; THRESHOLDS=${THRESHOLDS:-0.5,0.7,0.8,0.9}
DEVICE=$(python3 -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
py() { python3 -m a2d_convert "$@"; }
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }
mkdir -p "$WORK"

if [ ! -f "$WORK/base/config.json" ]; then
  stamp import; py import --source "$SOURCE" --out "$WORK/base" --force
fi
PROMPTS=${PROMPTS:-$WORK/prompts.jsonl}
[ -f "$PROMPTS" ] || python3 "$here/make_prompts.py" --out "$PROMPTS" --count "$DISTILL_N"
if [ ! -f "$WORK/data/data_manifest.json" ]; then
  stamp "data (self-distillation of $(wc -l < "$PROMPTS") prompts)"
  py data --tokenizer "$WORK/base" --out "$WORK/data" --force --block-size 4 --seq-len "$SEQ_LEN" \
    --holdout-fraction 0.02 \
    --source "$PROMPTS,kind=distill,base=$WORK/base,name=self-distill,license=Apache-2.0,max_rows=$DISTILL_N,max_new_tokens=$DISTILL_TOKENS,temperature=0,batch_size=256"
fi

train_args=(--base "$WORK/base" --data "$WORK/data" --block-size 4 --batch-rows "$BATCH_ROWS"
  --micro-batch-rows "$MICRO_ROWS" --lr "$LR" --lora-rank "$RANK" --warmup-steps 20 --log-every 10)
run_train() {  # NPROC OUT extra args...
  local n=$1 out=$2; shift 2
  if [ "$n" -gt 1 ]; then
    torchrun --standalone --nproc-per-node "$n" -m a2d_convert train "${train_args[@]}" --out "$out" "$@"
  else
    py train "${train_args[@]}" --out "$out" "$@"
  fi
}
if [ "$SCALE_STEPS" -gt 0 ] && [ "$NGPU" -gt 1 ]; then
  stamp "scaling: 1 process, $SCALE_STEPS steps"; run_train 1 "$WORK/scale-1" --max-steps "$SCALE_STEPS" 2>&1 | tee "$WORK/scale-1.log" | grep -E '"step"' | tail -3
  stamp "scaling: $NGPU processes, $SCALE_STEPS steps"; run_train "$NGPU" "$WORK/scale-$NGPU" --max-steps "$SCALE_STEPS" 2>&1 | tee "$WORK/scale-$NGPU.log" | grep -E '"step"' | tail -3
fi
if [ "${SCALE_ONLY:-0}" = 1 ]; then stamp "done (SCALE_ONLY)"; exit 0; fi
stamp "train: $NGPU process(es), up to $STEPS steps or $MINUTES min"
run_train "$NGPU" "$WORK/run" --max-steps "$STEPS" --time-limit-min "$MINUTES" 2>&1 | tee "$WORK/train.log" | grep -E '"step"' | awk 'NR % 10 == 1' | tail -20

stamp "export (model folder + delta)"
py export --checkpoint "$WORK/run" --out "$WORK/model-untuned" --force
stamp "probes: base vs converted at thresholds $THRESHOLDS"
py evaluate-probes --model "$WORK/model-untuned" --base "$WORK/base" --device "$DEVICE" \
  --per-family "$PROBES_PER_FAMILY" --thresholds "$THRESHOLDS" --out "$WORK/probes.json" --details "$WORK/probes-details.jsonl" | tail -30
py export --checkpoint "$WORK/run" --out "$WORK/model" --delta "$WORK/delta" --probes "$WORK/probes.json" --force
py verify "$WORK/model"
stamp done
