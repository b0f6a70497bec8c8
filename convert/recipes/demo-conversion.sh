#!/usr/bin/env bash
# The demo conversion: an AR base (a GGUF or HF folder) -> a trained block-diffusion model shipped as a
# compact LoRA delta. Runs on a GPU machine as it is, or on the CPU with tiny settings (the tests' dry run).
#
# Time-boxed and resumable. Every stage skips what WORK already holds (base/, prompts, data/, a run with
# checkpoints), so a second call on the same machine continues where the first stopped: training resumes
# from the last checkpoint (same LR schedule, same data order). With DEADLINE set (epoch seconds), each
# long stage runs under `timeout` with a budget that leaves RESERVE_S for what must follow it, and
# training stops itself (--time-limit-min) before its timeout. Whatever happens to a stage, the recipe
# goes on to export the last checkpoint and, with OUT set, copies the results there as it goes:
#   OUT/results.tar.gz            logs, train_log.jsonl, data manifest, probes, the delta's small files
#   OUT/delta.safetensors.part-NN the delta's weights in 15 MB parts (cat them back together)
# so a killed stage still leaves its logs and the last checkpoint's export.
#
# Every knob is an environment variable:
#   SOURCE      the base: .gguf file or HF folder                 (required)
#   WORK        working folder (kept between calls)               (required)
#   OUT         folder for results as they are made               (default: none)
#   DEADLINE    epoch seconds by which this call must be done     (default 0: no deadline)
#   PROMPTS     JSONL of prompts for self-distillation            (default: made by make_prompts.py)
#   PROMPT_ARGS more make_prompts.py arguments for that default, e.g. "--code-weight 10 --seed 1" (programming tasks
#               beside the other categories; another draw)
#   BENCHMARKS  benchmark files or folders, space-separated, whose text the data is n-gram-deduplicated
#               against: each benchmark's own file (gpqa_diamond.csv, math_500.jsonl, livecodebench_v6.jsonl,
#               mmlu_pro.jsonl|.parquet) or the folder `a2d eval --data` reads   (default: none; the manifest
#               then lists no blocklist)
#   CORPORA     more training data beside the self-distillation: `a2d_convert data --source` specs separated by
#               ";" (PATH,name=...,license=...,url=...; docs/conversion.md "data"), each recorded in the manifest
#               with its sha256 and licence                       (default: none)
#   NGPU        processes for training (torchrun)                 (default 1)
#   SCALE_STEPS steps of the 1-process vs NGPU-process comparison (default 0: skip)
#   SCALE_ONLY  1: stop after that comparison (no main run, export or probes)
#   DISTILL_N, DISTILL_TOKENS, DISTILL_SAMPLES (sampled responses per prompt besides the greedy one),
#   DISTILL_BATCH (rows per generate call), DISTILL_SLOTS (KV cache slots per generate call, rows x (longest prompt +
#   DISTILL_TOKENS); 0: no bound), DISTILL_WORKERS (processes; 0: 2 per GPU), DISTILL_S (its time limit)
#   STEPS (the LR schedule's length; time decides where a call stops; auto: as many steps as the first training
#   call's time holds at the step time the trainer measures after its first steps, `train --steps-from-time`, kept by
#   the calls that resume it), MINUTES (training cap per call),
#   TRAIN (0: no training this call), TRAIN_S (training seconds this call; 0: all the time left), BATCH_ROWS, MICRO_ROWS, SEQ_LEN, LR, RANK,
#   AC (1: activation checkpointing), SAVE_EVERY, MIN_TRAIN_S (train only with this much time, default 60),
#   TRAIN_TAIL_S (setup + final save allowance kept off the trainer's own time limit, default 75)
#   PROBES (1: evaluate-probes and the final export this call; 0: export the checkpoint only),
#   PROBES_PER_FAMILY, PROBE_TOKENS, THRESHOLDS, PROBE_BATCH, RESERVE_S (seconds kept after training)
#   PROBES_HELDOUT (1, the default: after the final export, the checkable prompts of heldout-prompts.jsonl beside
#   this recipe, which no training data holds, into probes-heldout.json: accuracy against the base outside the
#   built-in probes)
#   PROBES_OPEN (1, the default: after the final export, the open prompts of open-prompts.jsonl beside this
#   recipe, answers of up to OPEN_TOKENS tokens (default 128), into probes-open.json: tokens/forward where
#   answer length does not bound it)
#   CHECKPOINT_PROBES (1: keep every checkpoint, probe each (ck/step_N/probes.json) and ship the one the
#   probes rank first (`a2d_convert rank-probes`, checkpoint-ranking.json) instead of the last)
#   BLOCK (block size of the data and the training, default 4),
#   TRAIN_EXTRA (more `train` flags, e.g. "--ar-weight 1 --kl-weight 1"), EXPORT_EXTRA (more `export` flags,
#   default "--advance slide --remasking leftmost": the decoding the probes then use and the shipped model keeps;
#   a mask adapter predicts the leftmost masked position exactly as its base, so the top-up takes it), DATA_ONLY (1: stop once the data
#   exists), SAVE_DELTA (0: leave the delta's weights out of OUT, e.g. when several runs share one OUT)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${SOURCE:?SOURCE= the base GGUF file or HF folder}" "${WORK:?WORK= a working folder}"
OUT=${OUT:-}; DEADLINE=${DEADLINE:-0}
NGPU=${NGPU:-1}; SCALE_STEPS=${SCALE_STEPS:-0}; STEPS=${STEPS:-100000}; MINUTES=${MINUTES:-0}
BLOCK=${BLOCK:-4}; BATCH_ROWS=${BATCH_ROWS:-64}; MICRO_ROWS=${MICRO_ROWS:-16}; SEQ_LEN=${SEQ_LEN:-512}; LR=${LR:-5e-4}
RANK=${RANK:-64}; AC=${AC:-1}; SAVE_EVERY=${SAVE_EVERY:-100}; TRAIN_S=${TRAIN_S:-0}; WARMUP=${WARMUP:-20}
MIN_TRAIN_S=${MIN_TRAIN_S:-60}; TRAIN_TAIL_S=${TRAIN_TAIL_S:-75}; TRAIN=${TRAIN:-1}
DISTILL_N=${DISTILL_N:-4000}; DISTILL_TOKENS=${DISTILL_TOKENS:-256}; DISTILL_SAMPLES=${DISTILL_SAMPLES:-0}
DISTILL_BATCH=${DISTILL_BATCH:-256}; DISTILL_SLOTS=${DISTILL_SLOTS:-0}; DISTILL_WORKERS=${DISTILL_WORKERS:-0}; DISTILL_S=${DISTILL_S:-0}
PROBES=${PROBES:-1}; PROBES_PER_FAMILY=${PROBES_PER_FAMILY:-20}; PROBE_TOKENS=${PROBE_TOKENS:-48}
PROBES_HELDOUT=${PROBES_HELDOUT:-1}; PROBES_OPEN=${PROBES_OPEN:-1}; OPEN_TOKENS=${OPEN_TOKENS:-128}
THRESHOLDS=${THRESHOLDS:-0.5,0.7,0.9}; PROBE_BATCH=${PROBE_BATCH:-256}; LOG_EVERY=${LOG_EVERY:-5}
read -r -a TRAIN_EXTRA_ARGS <<< "${TRAIN_EXTRA:-}"; read -r -a EXPORT_EXTRA_ARGS <<< "${EXPORT_EXTRA---advance slide --remasking leftmost}"; DATA_ONLY=${DATA_ONLY:-0}; SAVE_DELTA=${SAVE_DELTA:-1}
CHECKPOINT_PROBES=${CHECKPOINT_PROBES:-0}
read -r -a BENCHMARK_PATHS <<< "${BENCHMARKS:-}"
BLOCKLIST_ARGS=()
CORPUS_ARGS=()
IFS=';' read -r -a CORPUS_SPECS <<< "${CORPORA:-}"
for c in ${CORPUS_SPECS[@]+"${CORPUS_SPECS[@]}"}; do
  [ -n "$c" ] || continue
  [ -e "${c%%,*}" ] || { echo "CORPORA: ${c%%,*} does not exist; name corpus files or folders that do" >&2; exit 2; }
  CORPUS_ARGS+=(--source "$c")
done
for b in ${BENCHMARK_PATHS[@]+"${BENCHMARK_PATHS[@]}"}; do
  [ -e "$b" ] || { echo "BENCHMARKS: $b does not exist; name benchmark files or folders that do" >&2; exit 2; }
  BLOCKLIST_ARGS+=(--blocklist "$b")
done
read -r DEVICE GPUS < <(python3 -c 'import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; print("cuda" if n else "cpu", n)')
THREADS=$(( $(nproc) > 8 ? 8 : $(nproc) ))
RESERVE_S=${RESERVE_S:-$([ "$PROBES" = 1 ] && echo 150 || echo 60)}
py() { python3 -m a2d_convert "$@"; }
t0=$(date +%s)
stamp() { echo "== $(date -u +%H:%M:%S) (+$(( $(date +%s) - t0 )) s) $*" | tee -a "$WORK/timings.txt"; }
left() { if [ "$DEADLINE" -gt 0 ]; then echo $(( DEADLINE - $(date +%s) )); else echo 1000000; fi; }
budget() {  # budget CAP RESERVE: seconds a stage may take: CAP (0: none), within the deadline less RESERVE
  local cap=$1 reserve=$2 b
  b=$(( $(left) - reserve )); if [ "$cap" -gt 0 ] && [ "$cap" -lt "$b" ]; then b=$cap; fi
  echo "$b"
}
bounded() {  # bounded SECONDS CMD...: CMD under timeout; its status is returned, the recipe goes on
  local s=$1; shift
  local status=0
  timeout --signal=TERM --kill-after=20 "$s" "$@" || status=$?
  [ "$status" = 124 ] && printf "\n!! timed out after %s s: %s\n" "$s" "$*" | tee -a "$WORK/timings.txt"
  return "$status"
}
mkdir -p "$WORK"
[ -n "$OUT" ] && mkdir -p "$OUT"

save_results() {  # the small results into OUT/results.tar.gz (replaced whole; the last one wins)
  [ -n "$OUT" ] || return 0
  ( cd "$WORK" && { [ -f data/distill/self-distill.jsonl ] && head -n 300 data/distill/self-distill.jsonl > distill-sample.jsonl || true; }
    tar czf "$OUT/.results.tar.gz" --ignore-failed-read timings.txt status.txt delta.sha256 distill-sample.jsonl data.log \
      train.log run/train_log.jsonl run/latest.json run/train_config.json scale-*/train_log.jsonl scale-*.log \
      data/data_manifest.json probes.json probes-details.jsonl probes.log probes-heldout.json probes-heldout-details.jsonl \
      probes-open.json probes-open-details.jsonl delta/*.json delta/*.txt model/*.json \
      model-candidate/*.json checkpoint-ranking.json ck/*/probes.json 2>/dev/null || true
    mv "$OUT/.results.tar.gz" "$OUT/results.tar.gz" )
}
save_delta() {  # DIR: the delta's weights into OUT in 15 MB parts, its sha256 alongside
  [ -n "$OUT" ] && [ "$SAVE_DELTA" = 1 ] && [ -f "$1/delta.safetensors" ] || return 0
  rm -f "$OUT"/delta.safetensors.part-*
  split -b 15000000 -d "$1/delta.safetensors" "$OUT/delta.safetensors.part-"
  (cd "$1" && sha256sum delta.safetensors) > "$WORK/delta.sha256"
}
status() { echo "$*" >> "$WORK/status.txt"; save_results; }
trap 'save_results' EXIT

# The prompts first: a count the generator cannot write fails here, in a second, not after the import.
PROMPTS=${PROMPTS:-$WORK/prompts.jsonl}
read -r -a PROMPT_ARGS_ARRAY <<< "${PROMPT_ARGS:-}"
[ -f "$PROMPTS" ] || python3 "$here/make_prompts.py" --out "$PROMPTS" --count "$DISTILL_N" ${PROMPT_ARGS_ARRAY[@]+"${PROMPT_ARGS_ARRAY[@]}"}
if [ ! -f "$WORK/base/config.json" ]; then
  stamp import; py import --source "$SOURCE" --out "$WORK/base" --force
fi

distill_source() {  # WORKERS BATCH SECONDS SLOTS
  echo "$PROMPTS,kind=distill,base=$WORK/base,name=self-distill,license=Apache-2.0,max_rows=$DISTILL_N,max_new_tokens=$DISTILL_TOKENS,temperature=0,batch_size=$2,batch_slots=$4,samples=$DISTILL_SAMPLES,sample_temperature=0.8,sample_top_p=0.95,workers=$1,time_limit_s=$3"
}
run_data() {  # WORKERS BATCH SLOTS: self-distillation within DISTILL_S (and the deadline), then packing
  local s pack=90
  s=$(budget "$DISTILL_S" $(( RESERVE_S + 120 + pack )))
  [ "$s" -gt 30 ] || { stamp "data: no time left ($s s)"; return 1; }
  stamp "data (self-distillation of $(wc -l < "$PROMPTS") prompts, $DISTILL_SAMPLES sampled each, workers=$1, batch=$2, limit ${s} s)"
  [ ${#BLOCKLIST_ARGS[@]} -gt 0 ] || stamp "data: no BENCHMARKS given, so no n-gram dedup against benchmark text"
  bounded $(( s + pack )) python3 -m a2d_convert data --tokenizer "$WORK/base" --out "$WORK/data" --force --block-size "$BLOCK" \
    --seq-len "$SEQ_LEN" --holdout-fraction 0.02 --source "$(distill_source "$1" "$2" "$s" "$3")" ${CORPUS_ARGS[@]+"${CORPUS_ARGS[@]}"} ${BLOCKLIST_ARGS[@]+"${BLOCKLIST_ARGS[@]}"} \
    2>&1 | tee -a "$WORK/data.log" | grep --line-buffered -v 'row/s\|batch/s' || true
  [ -f "$WORK/data/data_manifest.json" ]
}
if [ ! -f "$WORK/data/data_manifest.json" ]; then
  workers=$DISTILL_WORKERS; [ "$workers" = 0 ] && workers=$(( GPUS > 0 ? 2 * GPUS : 1 ))
  if ! run_data "$workers" "$DISTILL_BATCH" "$DISTILL_SLOTS"; then
    # One retry with the plain settings that ran before (one process per GPU, batch 256, the decode steps launched
    # one by one rather than replayed from CUDA graphs).
    A2D_DISTILL_GRAPHS=0 run_data 0 256 0 || { status "data failed"; exit 1; }
  fi
  stamp "data done: $(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); t=m["totals"]["train.safetensors"]; g=m["sources"][0].get("generator",{}); print(t["samples"], "samples,", t["tokens_in_samples"], "tokens,", t["loss_tokens"], "loss tokens,", t["rows"], "rows;", g.get("responses"), "responses,", g.get("unfinished"), "unfinished,", g.get("batching",{}).get("seconds"), "s generating")' "$WORK/data/data_manifest.json")"
  status "data ok"
fi
if [ "$DATA_ONLY" = 1 ]; then stamp "done (DATA_ONLY)"; exit 0; fi

train_args=(--base "$WORK/base" --data "$WORK/data" --block-size "$BLOCK" --batch-rows "$BATCH_ROWS"
  --micro-batch-rows "$MICRO_ROWS" --lr "$LR" --lora-rank "$RANK" --warmup-steps "$WARMUP" --log-every "$LOG_EVERY"
  ${TRAIN_EXTRA_ARGS[@]+"${TRAIN_EXTRA_ARGS[@]}"})
[ "$AC" = 1 ] || train_args+=(--no-activation-checkpointing)
[ "$CHECKPOINT_PROBES" = 1 ] && train_args+=(--keep-checkpoints 0)
train_cmd() {  # NPROC OUT extra args...: sets cmd=(the train command line)
  local n=$1 out=$2; shift 2
  if [ "$n" -gt 1 ]; then
    cmd=(torchrun --standalone --nproc-per-node "$n" -m a2d_convert train "${train_args[@]}" --out "$out" "$@")
  else
    cmd=(python3 -m a2d_convert train "${train_args[@]}" --out "$out" "$@")
  fi
}
if [ "$SCALE_STEPS" -gt 0 ] && [ "$NGPU" -gt 1 ] && [ ! -f "$WORK/scale-$NGPU/latest.json" ]; then
  for n in 1 "$NGPU"; do
    s=$(budget 0 "$RESERVE_S")
    stamp "scaling: $n process(es), $SCALE_STEPS steps (limit $s s)"
    rm -rf "$WORK/scale-$n"
    train_cmd "$n" "$WORK/scale-$n" --max-steps "$SCALE_STEPS" --threads "$THREADS"
    bounded "$s" "${cmd[@]}" > "$WORK/scale-$n.log" 2>&1 || true
    grep -E '"step"' "$WORK/scale-$n.log" | tail -3 || true
  done
  save_results
fi
if [ "${SCALE_ONLY:-0}" = 1 ]; then stamp "done (SCALE_ONLY)"; exit 0; fi

# Training: this call's share of the time (TRAIN_S, MINUTES, the deadline less RESERVE_S), resumed when a
# checkpoint exists. --time-limit-min counts a run's training time over all calls, so it is the time
# already trained plus this call's share less what setup and the last save take.
cap=$TRAIN_S; [ "$MINUTES" != 0 ] && cap=$(python3 -c "print(int(float('$MINUTES') * 60))")
s=$(budget "$cap" "$RESERVE_S")
if [ "$TRAIN" != 1 ]; then
  stamp "train: skipped (TRAIN=$TRAIN)"
elif [ "$s" -ge "$MIN_TRAIN_S" ]; then
  resume=(); done_s=0
  if [ -f "$WORK/run/latest.json" ]; then
    resume=(--resume)
    done_s=$(python3 -c 'import json,sys,pathlib; r=pathlib.Path(sys.argv[1]); p=json.load(open(r/"latest.json"))["path"]; print(json.load(open(r/p/"checkpoint.json"))["progress"].get("elapsed_s", 0))' "$WORK/run")
  fi
  size=()
  if [ "$STEPS" = auto ]; then
    # The trainer sizes the schedule to the first training call's time and keeps that size when it resumes.
    STEPS=1000000; size=(--steps-from-time)
    stamp "train: STEPS=auto: the schedule sized to the first training call's time (train --steps-from-time)"
  fi
  # Setup (processes, model, FSDP) runs before the trainer's clock starts; the last log interval, the
  # held-out evaluation and the final save come after it stops: TRAIN_TAIL_S for both.
  limit_min=$(python3 -c "print(round(max($done_s + $s - $TRAIN_TAIL_S, $done_s + 10) / 60, 3))")
  steps_text="up to $STEPS steps"; [ ${#size[@]} -gt 0 ] && steps_text="the steps the trainer sizes"
  stamp "train: $NGPU process(es), $steps_text, $s s this call (time limit ${limit_min} min of training in all)${resume:+, resumed}"
  train_cmd "$NGPU" "$WORK/run" --max-steps "$STEPS" --time-limit-min "$limit_min" --save-every "$SAVE_EVERY" --threads "$THREADS" ${resume[@]+"${resume[@]}"} \
    ${size[@]+"${size[@]}"}
  bounded "$s" "${cmd[@]}" 2>&1 | tee -a "$WORK/train.log" | grep --line-buffered -E '^!!|"step"|"event"|Error|error' || true
  # A run that left no checkpoint at all failed before its first save: once more with only the layers compiled
  # (the loss chunks eager), then with nothing compiled, each failure's last error line in the timings.
  for fallback in layers off; do
    [ ! -f "$WORK/run/latest.json" ] && [ "$(budget "$cap" "$RESERVE_S")" -ge "$MIN_TRAIN_S" ] || break
    stamp "train: no checkpoint ($(grep -aE '^[A-Za-z]*(Error|Exception)' "$WORK/train.log" | tail -n 1 | cut -c1-160)); once more with --compile $fallback"
    s=$(budget "$cap" "$RESERVE_S")
    train_cmd "$NGPU" "$WORK/run" --max-steps "$STEPS" --time-limit-min "$(python3 -c "print(round(max($s - $TRAIN_TAIL_S, 10) / 60, 3))")" \
      --save-every "$SAVE_EVERY" --threads "$THREADS" --compile "$fallback" ${size[@]+"${size[@]}"}
    bounded "$s" "${cmd[@]}" 2>&1 | tee -a "$WORK/train.log" | grep --line-buffered -E '^!!|"step"|"event"|Error|error' || true
  done
  status "train stopped at step $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$WORK/run/latest.json" 2>/dev/null || echo none)"
else
  stamp "train: skipped ($s s left for it)"
fi
[ -f "$WORK/run/latest.json" ] || { stamp "no checkpoint to export"; status "no checkpoint"; exit 1; }

# The checkpoint as a model folder and a delta, into OUT at once: what comes back if nothing else does.
latest=$(tr -d ' \n' < "$WORK/run/latest.json")
if [ "$latest" = "$(cat "$WORK/exported.txt" 2>/dev/null)" ] && [ -f "$WORK/model-candidate/config.json" ] && [ -f "$WORK/delta/delta.safetensors" ]; then
  stamp "export of $latest: done already"
else
  stamp "export (model folder + delta) of $latest"
  rm -f "$WORK/exported.txt"
  bounded 120 python3 -m a2d_convert export --checkpoint "$WORK/run" --out "$WORK/model-candidate" --delta "$WORK/delta" --force ${EXPORT_EXTRA_ARGS[@]+"${EXPORT_EXTRA_ARGS[@]}"} | tail -3
  echo "$latest" > "$WORK/exported.txt"
fi
save_delta "$WORK/delta"; status "exported $latest"
if [ "$PROBES" != 1 ]; then stamp "done (PROBES=0: the checkpoint's delta is in OUT)"; exit 0; fi

probe() {  # MODEL OUT SECONDS [more evaluate-probes flags]: MODEL against the base into OUT (later flags win)
  local model=$1 out=$2 seconds=$3; shift 3
  rm -f "$out"
  bounded "$seconds" python3 -m a2d_convert evaluate-probes --model "$model" --base "$WORK/base" --device "$DEVICE" \
    --per-family "$PROBES_PER_FAMILY" --max-tokens "$PROBE_TOKENS" --thresholds "$THRESHOLDS" --batch-size "$PROBE_BATCH" \
    --threads "$THREADS" --out "$out" "$@" >> "$WORK/probes.log" 2>&1 || true
}
checkpoint=$WORK/run; candidate=$WORK/model-candidate
# A checkpoint's model folder: the newest one is model-candidate already (exported above), the others ck/NAME.
latest_name=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"].split("/")[-1])' "$WORK/run/latest.json")
model_of() { if [ "$1" = "$latest_name" ]; then echo "$WORK/model-candidate"; else echo "$WORK/ck/$1"; fi; }
# The probes and the final export are done once per checkpoint and probe settings: a second run of the same WORK
# with the same ones skips them.
final_key="$latest thresholds=$THRESHOLDS per_family=$PROBES_PER_FAMILY tokens=$PROBE_TOKENS checkpoint_probes=$CHECKPOINT_PROBES export=${EXPORT_EXTRA_ARGS[*]-}"
final_done=0
if [ "$final_key" = "$(cat "$WORK/final.txt" 2>/dev/null)" ] && [ -f "$WORK/model/config.json" ] && [ -f "$WORK/probes.json" ]; then
  final_done=1
  stamp "probes and the final export of $latest: done already"
else
  rm -f "$WORK/final.txt"
  rm -f "$WORK/probes.json" "$WORK/probes.log"
  if [ "$CHECKPOINT_PROBES" = 1 ]; then
    # Every kept checkpoint exported and probed, newest first (what the deadline cuts off is the oldest).
    for ck in $(ls -d "$WORK"/run/checkpoints/step_* 2>/dev/null | sort -r); do
      name=$(basename "$ck"); s=$(budget 0 60)
      [ "$s" -gt 30 ] || { stamp "checkpoint probes: no time left for $name"; break; }
      if [ ! -f "$WORK/ck/$name/probes.json" ]; then
        stamp "checkpoint $name: export and probes (limit $s s)"
        mkdir -p "$WORK/ck/$name"
        if [ "$(model_of "$name")" != "$WORK/model-candidate" ]; then
          bounded 120 python3 -m a2d_convert export --checkpoint "$ck" --out "$WORK/ck/$name" --force ${EXPORT_EXTRA_ARGS[@]+"${EXPORT_EXTRA_ARGS[@]}"} > /dev/null || continue
        fi
        probe "$(model_of "$name")" "$WORK/ck/$name/probes.json" "$(budget 0 60)" --details "$WORK/ck/$name/probes-details.jsonl"
      fi
    done
    best=$(python3 -m a2d_convert rank-probes "$WORK"/ck/step_*/probes.json --out "$WORK/checkpoint-ranking.json" 2> >(tee -a "$WORK/timings.txt" >&2)) || best=""
    if [ -n "$best" ]; then
      name=$(basename "$(dirname "$best")")
      checkpoint=$WORK/run/checkpoints/$name; candidate=$(model_of "$name")
      cp "$best" "$WORK/probes.json"; cp "$WORK/ck/$name/probes-details.jsonl" "$WORK/probes-details.jsonl" 2>/dev/null || true
      stamp "checkpoint chosen by the probes: $name"
    fi
  else
    s=$(budget 0 40)
    stamp "probes: base vs converted at thresholds $THRESHOLDS ($PROBES_PER_FAMILY per family, $PROBE_TOKENS tokens, limit $s s)"
    probe "$WORK/model-candidate" "$WORK/probes.json" "$s" --details "$WORK/probes-details.jsonl"
  fi
  grep -v 'it/s\|s/it' "$WORK/probes.log" | tail -40 || true
  if [ -f "$WORK/probes.json" ]; then
    status "probes ok"
    stamp "export with the probes' threshold"
    bounded 120 python3 -m a2d_convert export --checkpoint "$checkpoint" --out "$WORK/model" --delta "$WORK/delta" --probes "$WORK/probes.json" --force ${EXPORT_EXTRA_ARGS[@]+"${EXPORT_EXTRA_ARGS[@]}"} | tail -3
    save_delta "$WORK/delta"
    py verify "$WORK/model" | tail -2
    echo "$final_key" > "$WORK/final.txt"
    status "final export verified"
  else
    status "probes failed or timed out"
  fi
fi
if [ "$PROBES_HELDOUT" = 1 ] && ! { [ "$final_done" = 1 ] && [ -f "$WORK/probes-heldout.json" ]; }; then
  s=$(budget 0 10)
  stamp "held-out prompts (limit $s s)"
  probe "$candidate" "$WORK/probes-heldout.json" "$s" --probes "$here/heldout-prompts.jsonl" --details "$WORK/probes-heldout-details.jsonl"
  [ -f "$WORK/probes-heldout.json" ] && status "held-out prompts ok"
fi
if [ "$PROBES_OPEN" = 1 ] && ! { [ "$final_done" = 1 ] && [ -f "$WORK/probes-open.json" ]; }; then
  s=$(budget 0 10)
  stamp "open prompts (up to $OPEN_TOKENS tokens; limit $s s)"
  probe "$candidate" "$WORK/probes-open.json" "$s" --probes "$here/open-prompts.jsonl" --max-tokens "$OPEN_TOKENS" --details "$WORK/probes-open-details.jsonl"
  [ -f "$WORK/probes-open.json" ] && status "open prompts ok"
fi
stamp done
