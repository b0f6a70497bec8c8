#!/usr/bin/env bash
# The trainer's speed on the MiniCPM5-2B shape on one GPU (random bf16 weights, the tiny tokenizer, synthetic
# text: bench/random_model.py): `train --window-adapter` at rank 64 for a few steps, its log lines (tokens/s,
# model TFLOP/s, MFU against 790 TFLOP/s) into $OUT/train-2b.jsonl. Knobs: STEPS (12), ROWS (16 rows of SEQ_LEN
# 1024 a step), MICRO_ROWS (8), EXTRA (more train flags).
set -euo pipefail
export PYTHONPATH=$PWD/convert:/tmp/site PYTHONUNBUFFERED=1
out="${OUT:-/tmp/a2d-out}"
work=/root/train-2b
mkdir -p "$out" "$work"
t0=$(date +%s)
[ -f "$work/base/model.safetensors" ] || python3 bench/random_model.py --shape minicpm5-2b --out "$work/base" --text-rows 256
echo "== random model: $(( $(date +%s) - t0 )) s"
python3 -m a2d_convert data --tokenizer "$work/base" --out "$work/data" --force --block-size 4 --seq-len "${SEQ_LEN:-1024}" \
  --source "$work/base/text.jsonl,name=synthetic,split=train,license=none" > "$work/data.log" 2>&1
echo "== data: $(( $(date +%s) - t0 )) s"
rm -rf "$work/run"
python3 -m a2d_convert train --base "$work/base" --data "$work/data" --out "$work/run" --block-size 4 \
  --max-steps "${STEPS:-12}" --batch-rows "${ROWS:-16}" --micro-batch-rows "${MICRO_ROWS:-8}" --lr 5e-4 --warmup-steps 2 \
  --log-every 4 --lora-rank 64 --window-adapter --kl-weight 1 --confidence-weight 2 --confidence-temperature 0.5 \
  --mask-pattern decoder --loss-weighting none --t-min 0.1 --t-max 1.0 --no-activation-checkpointing ${EXTRA:-} 2>&1 |
  grep --line-buffered -E '"step"|"event"|Error|error' | tee "$work/train.log"
grep -E '"step"' "$work/run/train_log.jsonl" > "$out/train-2b.jsonl"
echo "== train: $(( $(date +%s) - t0 )) s"
