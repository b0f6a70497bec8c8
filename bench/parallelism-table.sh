#!/usr/bin/env bash
# A model's accuracy under parallelism, for docs/conversion.md: `evaluate-probes` on the CPU engine over the
# built-in probes, the held-out prompts (convert/recipes/heldout-prompts.jsonl) and the open prompts
# (open-prompts.jsonl: tokens per forward only), at thresholds 0.5-0.95, each top-up rule (leftmost,
# low_confidence) and at least 1 or 2 tokens a step; then bench/parallelism_table.py renders the table, five
# answers beside the base's and the code prompt's answer; for a window adapter or the window rule, its calibration by window offset.
#   MODEL=.cache/demo/model BASE=.cache/demo/base OUT=/tmp/parallelism bash bench/parallelism-table.sh
# (BASE: the imported AR base, `a2d_convert import --source .cache/demo/base.gguf --out .cache/demo/base`.)
# Knobs: THRESHOLDS (0.5,0.7,0.8,0.9,0.95), RULES (leftmost low_confidence), MINS (1 2), THREADS (2),
# MAX_TOKENS (48; open prompts OPEN_TOKENS, 128), CALIBRATION (0: no calibration table; it takes minutes and
# depends only on the model, so one run of several that split the decodings between them is enough), EXTRA (more
# evaluate-probes flags for every decoding, e.g. "--reveal-order prefix").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
model=${MODEL:-$root/.cache/demo/model}
base=${BASE:-$root/.cache/demo/base}
out=${OUT:-/tmp/parallelism}
py=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$out"
sets=("builtin:" "heldout:--probes $root/convert/recipes/heldout-prompts.jsonl" "open:--probes $root/convert/recipes/open-prompts.jsonl")
for set in "${sets[@]}"; do
  name=${set%%:*}; flags=${set#*:}
  tokens=${MAX_TOKENS:-48}; [ "$name" = open ] && tokens=${OPEN_TOKENS:-128}
  for rule in ${RULES:-leftmost low_confidence}; do
    for min in ${MINS:-1 2}; do
      report="$out/$name-$rule-$min.json"
      [ -f "$report" ] && continue
      # The base answers once per set; later runs reuse them.
      if [ -f "$out/$name-base.jsonl" ]; then basearg=(--base-answers "$out/$name-base.jsonl"); else basearg=(--base "$base"); fi
      echo "== $name, top-up $rule, at least $min a step"
      # shellcheck disable=SC2086
      "$py" -m a2d_convert evaluate-probes --model "$model" "${basearg[@]}" --engine cpu --threads "${THREADS:-2}" \
        --thresholds "${THRESHOLDS:-0.5,0.7,0.8,0.9,0.95}" --max-tokens "$tokens" --remasking "$rule" --min-per-step "$min" \
        --out "$report.tmp" --details "$out/$name-$rule-$min.jsonl" $flags ${EXTRA:-} > "$out/log.txt" 2>&1 || { tail -5 "$out/log.txt"; exit 1; }
      mv "$report.tmp" "$report"
      [ -f "$out/$name-base.jsonl" ] || grep '"kind": "base"' "$out/$name-$rule-$min.jsonl" > "$out/$name-base.jsonl"
    done
  done
done
# The answers at the model's default threshold.
default=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["a2d"]["decoding"]["threshold"])' "$model/config.json" 2>/dev/null || true)
"$py" "$root/bench/parallelism_table.py" "$out" $default | tee "$out/table.md"
# A window adapter's calibration by offset on the held-out answers of the base (bench/window_calibration.py).
if [ "${CALIBRATION:-1}" != 0 ] && grep -qE '"window_(adapter|rule)"' "$model/config.json" 2>/dev/null; then
  echo | tee -a "$out/table.md"
  "$py" "$root/bench/window_calibration.py" --model "$model" --base-answers "$out/heldout-base.jsonl" \
    --threads "${THREADS:-2}" 2> /dev/null | tee -a "$out/table.md"
fi
