#!/usr/bin/env bash
# The MiniCPM5-2B recipe's dry run on the GPU machine: convert/recipes/convert.sh, the one command, on a checkpoint
# of MiniCPM5-2B's shape (random bf16 weights of its config, bench/random_model.py, with the tiny base's tokenizer),
# killed with SIGKILL once a checkpoint is saved mid-training and then run again (it resumes from that checkpoint),
# to a packed CUDA folder that simulate-startup passes, started for real on this GPU (--gpu-run). The job outlives
# the calls (setsid); the machine keeps it while calls follow within 30 s of each other.
#
# Stage here first: `bash bench/stage-recipe-kit.sh` (.device/recipe-kit: the CLI, production node_modules and the
# npm cache pack reifies from, the pinned Node, both addons, strace/bwrap). Then, with models/ out of the tree
# (`bash bench/slim-tree.sh out`):
#   carry [".device/recipe-kit"]  MODE=start [knobs] bash bench/device-recipe-dry-run.sh    (starts the job; returns)
#     (or the parts over several calls: each stashes what it carried in /root/rk-stash, exit 3 until all are there)
#   bash bench/device-recipe-dry-run.sh      polls: the job's state and its logs' tails; once the job has finished
#                                            (or COLLECT=1) copies into $OUT: summary.txt, log.txt, results.tar.gz
# Knobs (environment, with MODE=start): KILL_STEP (the first checkpoint at or after this step is where the first run
# is killed; 0: no kill), SHAPE_SET (bench/random_model.py --set fields, space-separated: a CPU rehearsal of the job
# with a narrow model), and convert.sh's and demo-conversion.sh's own (defaults below: a few hundred steps).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-/tmp/a2d-out}"
rk=/root/rk
mkdir -p "$out"

if [ "${MODE:-poll}" = start ]; then
  # assemble() and prepare() of the GPU-run kit, on this kit's folders.
  A2D_GPU_RUN_LIB=1 A2D_KIT_STASH=/root/rk-stash A2D_GPU_WORK=$rk source "$root/bench/device-gpu-run.sh"
  kit="$root/.device/recipe-kit"
  assemble || exit 3
  [ -f $rk/pid ] && kill -0 "$(cat $rk/pid)" 2>/dev/null && { echo "a job is running already (pid $(cat $rk/pid))"; exit 1; }
  rm -rf "$rk/repo" "$rk/npm-cache" "$rk/tools" "$rk/ckpt" "$rk/packed" "$rk/packed.work" "$rk/job"
  mkdir -p "$rk/job"
  # The job runs from a copy of the tree (the next call's tree replaces this one), the kit laid over it.
  t0=$SECONDS
  cp -a "$root" "$rk/repo" && rm -rf "$rk/repo/.device" && (cd /root/rk-stash && awk '{print $2}' SHA256SUMS | xargs cat) | xz -dc | tar -x -C "$rk" || exit 1
  echo "unpacked in $((SECONDS - t0)) s: $(du -sh $rk | cut -f1)"
  work=$rk prepare
  # This call's knobs (and PATH, with the kit's strace and bwrap) for the job.
  for name in PATH KILL_STEP $(compgen -e | grep -E '^(DISTILL_|STEPS$|SAVE_EVERY$|SEQ_LEN$|BATCH_ROWS$|MICRO_ROWS$|RANK$|LR$|WARMUP$|AC$|TRAIN_EXTRA$|PROBE|THRESHOLDS$|SIMULATE_EXTRA$|GPU$|LOG_EVERY$|MIN_TRAIN_S$|DEVICE$|SHAPE_SET$|OMP_NUM_THREADS$|BENCHMARKS$|CORPORA$|PROMPT_ARGS$)'); do
    [ -n "${!name+x}" ] && printf 'export %s=%q\n' "$name" "${!name}"
  done > "$rk/job/env"
  MODE=job setsid bash "$rk/repo/bench/device-recipe-dry-run.sh" < /dev/null > "$rk/job/log.txt" 2>&1 &
  echo $! > $rk/pid
  sleep 3
  echo "started the dry run (pid $(cat $rk/pid)); poll with: bash bench/device-recipe-dry-run.sh"
  tail -n 5 "$rk/job/log.txt"
  exit 0
fi

if [ "${MODE:-poll}" = job ]; then
  cd "$rk/repo"
  . "$rk/job/env"
  node_bin=$(ls -d "$PWD"/vendor/node-*/bin | head -1)
  export PATH="$node_bin:$PATH" NODE="$node_bin/node" npm_config_cache=$rk/npm-cache PYTHONPATH=$PWD/convert PYTHONUNBUFFERED=1
  # A recipe that fits a dry run of the 2B shape: the denoiser's training flags, a few hundred steps.
  export DISTILL_N=${DISTILL_N:-2048} DISTILL_TOKENS=${DISTILL_TOKENS:-128} DISTILL_BATCH=${DISTILL_BATCH:-512}
  export DISTILL_WORKERS=${DISTILL_WORKERS:-1} DISTILL_S=${DISTILL_S:-150} SEQ_LEN=${SEQ_LEN:-512} BATCH_ROWS=${BATCH_ROWS:-16}
  export MICRO_ROWS=${MICRO_ROWS:-8} AC=${AC:-0} RANK=${RANK:-64} LR=${LR:-5e-4} WARMUP=${WARMUP:-20} STEPS=${STEPS:-240}
  export SAVE_EVERY=${SAVE_EVERY:-60} LOG_EVERY=${LOG_EVERY:-10} MIN_TRAIN_S=${MIN_TRAIN_S:-1}
  export TRAIN_EXTRA=${TRAIN_EXTRA:---window-adapter --kl-weight 1 --confidence-weight 2 --confidence-temperature 0.5 --mask-pattern decoder --loss-weighting none --t-min 0.1 --t-max 1.0}
  export PROBES_PER_FAMILY=${PROBES_PER_FAMILY:-1} PROBE_TOKENS=${PROBE_TOKENS:-16} THRESHOLDS=${THRESHOLDS:-0.9} PROBE_BATCH=${PROBE_BATCH:-64}
  # The benchmark blocklist convert.sh asks for: the eval fixtures (the layout `a2d eval --data` reads) stand in for
  # the benchmarks' own files.
  export BENCHMARKS=${BENCHMARKS:-$PWD/eval/fixtures}
  export PROBES_HELDOUT=0 PROBES_OPEN=0 SIMULATE_EXTRA=${SIMULATE_EXTRA:---gpu-run --budget 120} GPU=${GPU:-h200}
  kill_step=${KILL_STEP:-60}
  summary=$rk/job/summary.txt
  note() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$summary"; }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"
  # GPU memory in use, once a second, for the run's peak.
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 1000 > "$rk/job/gpu-memory.txt" 2>/dev/null &
  sampler=$!
  t0=$SECONDS
  set_args=(); for f in ${SHAPE_SET:-}; do set_args+=(--set "$f"); done
  python3 bench/random_model.py --shape minicpm5-2b --out $rk/ckpt --text-rows 0 ${set_args[@]+"${set_args[@]}"} | tee -a "$summary"
  # Every id of the random model's vocabulary a whole text of its own, as a real base's tokenizer has it: the start
  # checks read the answers as text.
  node bench/kit-tokenizer.mjs $rk/ckpt/config.json $rk/ckpt/tokenizer.json
  note "checkpoint (MiniCPM5-2B shape, random bf16): $((SECONDS - t0)) s, $(du -sh $rk/ckpt | cut -f1)"
  run() {  # N: convert.sh into packed/ in a session of its own (pid: its leader), its log in job/runN.log
    setsid bash convert/recipes/convert.sh $rk/ckpt $rk/packed > "$rk/job/run$1.log" 2>&1 &
    pid=$!
  }
  if [ "$kill_step" -gt 0 ]; then
    t1=$SECONDS
    run 1
    killed=""
    while kill -0 "$pid" 2>/dev/null; do
      step=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' $rk/packed.work/run/latest.json 2>/dev/null || echo 0)
      if [ "$step" -ge "$kill_step" ]; then
        # The whole session, as a preemption would: `timeout` puts the trainer in a process group of its own.
        pkill -KILL -s "$pid"; killed=$step; break
      fi
      sleep 2
    done
    wait "$pid" 2>/dev/null
    if [ -n "$killed" ]; then note "run 1: killed (SIGKILL to its whole session) at the step-$killed checkpoint, $((SECONDS - t1)) s in"
    else note "run 1: ended before a checkpoint at step $kill_step (see run1.log)"; fi
  fi
  t2=$SECONDS
  run 2
  wait "$pid"; status=$?
  note "run 2 (the same command again): exit $status in $((SECONDS - t2)) s"
  kill "$sampler" 2>/dev/null
  note "GPU memory peak (nvidia-smi, 1 s samples): $(sort -n $rk/job/gpu-memory.txt | tail -1) MiB"
  # Both runs' log lines are in train.log: the steps logged twice (after the killed run's checkpoint, before its
  # kill) must have the same loss if the resume restored the run exactly (weights, optimizer, data order, masks).
  python3 - $rk/packed.work/train.log >> "$summary" <<'PY'
import json, re, sys
seen = {}
for line in open(sys.argv[1], errors="replace"):
    for m in re.finditer(r'\{"step": \d+, "loss"[^{}]*\}', line):
        r = json.loads(m.group(0))
        seen.setdefault(r["step"], []).append(r)
twice = {s: rs for s, rs in seen.items() if len(rs) > 1}
if twice:
    diff = max(abs(rs[0]["loss"] - rs[1]["loss"]) for rs in twice.values())
    print(f"resume: steps {min(twice)}-{max(twice)} logged by both runs ({len(twice)} log lines), largest loss difference {diff:.3g}")
else:
    print("resume: no step logged by both runs")
last = seen[max(seen)][-1] if seen else {}
print("last log line:", {k: last.get(k) for k in ("step", "loss", "ce", "tokens_per_s", "mfu", "peak_mem_gb", "elapsed_s")})
PY
  # convert.sh's own stage lines of the second run, the stage times, then the recipe's stamps of both runs (the
  # stamps are in run2.log too: taken once, from timings.txt).
  grep -E '^== (\[|done)' $rk/job/run2.log >> "$summary"
  cat $rk/packed.work/stages.txt >> "$summary" 2>/dev/null
  grep -hE '^== ' $rk/packed.work/timings.txt >> "$summary" 2>/dev/null
  tail -n 30 $rk/job/run2.log >> "$summary"
  echo "finished $status" > $rk/job/done
  exit 0
fi

[ -f $rk/pid ] || { echo "no dry run on this machine (a fresh one?): start it with MODE=start"; exit 3; }
if kill -0 "$(cat $rk/pid)" 2>/dev/null; then echo "running (pid $(cat $rk/pid))"; else echo "not running"; fi
cat $rk/job/done 2>/dev/null
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null
tail -n 4 $rk/job/summary.txt 2>/dev/null
grep -hE '^==|^!!' $rk/packed.work/timings.txt 2>/dev/null | tail -n 4
tail -c 3000 $rk/packed.work/train.log 2>/dev/null | grep -E '"step"' | tail -n 1 | cut -c1-400
for f in $rk/job/run2.log $rk/job/run1.log; do [ -f "$f" ] && { echo "-- $(basename "$f")"; tail -n 3 "$f" | cut -c1-300; break; }; done
if grep -q finished $rk/job/done 2>/dev/null || [ "${COLLECT:-0}" = 1 ]; then
  cp $rk/job/summary.txt "$out/" 2>/dev/null
  cat $rk/job/log.txt $rk/job/run1.log $rk/job/run2.log > "$out/log.txt" 2>/dev/null
  (cd $rk && tar czf "$out/results.tar.gz" --ignore-failed-read job packed.work/timings.txt packed.work/stages.txt packed.work/status.txt \
     packed.work/train.log packed.work/run/train_log.jsonl packed.work/run/train_config.json packed.work/data.log \
     packed.work/data/data_manifest.json packed.work/probes.json packed.work/probes.log packed/MANIFEST.json 2>/dev/null)
  ls -la "$out"
fi
exit 0
