#!/usr/bin/env bash
# The trainer's speed on one GPU for a model shape (random bf16 weights, the tiny tokenizer, synthetic text:
# bench/random_model.py): `train --window-adapter` at rank 64 for a few steps per variant, each variant's log lines
# (tokens/s, model TFLOP/s, MFU against 790 TFLOP/s) into $OUT/train-<shape>.jsonl (one "variant" field each) and
# the first variant's profile (--profile-steps) into $OUT/profile-<shape>.txt, each variant's last 60 output lines into
# $OUT/train-<shape>-variant<i>.tail.
# Knobs: SHAPE (minicpm5-2b; or smollm2-135m), STEPS (12), SEQ_LEN (1024), ROWS (16 rows a step), MICRO_ROWS (8),
# PROFILE (6:8; empty: none), VARIANTS (";"-separated extra train flags, one run each; default one run with none),
# EXTRA (flags for every variant).
set -uo pipefail
export PYTHONPATH=$PWD/convert:/tmp/site PYTHONUNBUFFERED=1
out="${OUT:-/tmp/a2d-out}"
shape="${SHAPE:-minicpm5-2b}"
work=/root/train-$shape
mkdir -p "$out" "$work"
t0=$(date +%s)
[ -f "$work/base/model.safetensors" ] || python3 bench/random_model.py --shape "$shape" --out "$work/base" --text-rows 2048
echo "== random model: $(( $(date +%s) - t0 )) s"
python3 -m a2d_convert data --tokenizer "$work/base" --out "$work/data" --force --block-size 4 --seq-len "${SEQ_LEN:-1024}" \
  --source "$work/base/text.jsonl,name=synthetic,split=train,license=none" > "$work/data.log" 2>&1 || { tail "$work/data.log"; exit 1; }
echo "== data: $(( $(date +%s) - t0 )) s"
IFS=';' read -r -a variants <<< "${VARIANTS:- }"
: > "$out/train-$shape.jsonl"
profile="${PROFILE-6:8}"
for i in "${!variants[@]}"; do
  variant="${variants[$i]}"
  rm -rf "$work/run"
  flags=()
  [ "$i" = 0 ] && [ -n "$profile" ] && flags=(--profile-steps "$profile")
  echo "== variant $i: ${variant:-(defaults)}"
  # shellcheck disable=SC2086
  timeout -k 10 "${VARIANT_S:-400}" python3 -m a2d_convert train --base "$work/base" --data "$work/data" --out "$work/run" --block-size 4 \
    --max-steps "${STEPS:-12}" --batch-rows "${ROWS:-16}" --micro-batch-rows "${MICRO_ROWS:-8}" --lr 5e-4 --warmup-steps 2 \
    --log-every 4 --lora-rank 64 --window-adapter --kl-weight 1 --confidence-weight 2 --confidence-temperature 0.5 \
    --mask-pattern decoder --loss-weighting none --t-min 0.1 --t-max 1.0 --no-activation-checkpointing "${flags[@]}" ${EXTRA:-} $variant 2>&1 |
    tee "$work/train-full.log" | grep --line-buffered -E '"step"|"event"|Error|error' | tee "$work/train.log"
  # The variant's last output lines whole (a run that logs no step says why here).
  tail -n 60 "$work/train-full.log" > "$out/train-$shape-variant$i.tail"
  python3 - "$work/run/train_log.jsonl" "$variant" >> "$out/train-$shape.jsonl" <<'PY'
import json, sys
try:
    lines = open(sys.argv[1]).read().splitlines()
except OSError:
    lines = []
for line in lines:
    print(json.dumps({"variant": sys.argv[2].strip(), **json.loads(line)}))
PY
  [ -f "$work/run/profile.txt" ] && cp "$work/run/profile.txt" "$out/profile-$shape.txt"
  echo "== variant $i: $(( $(date +%s) - t0 )) s"
done
