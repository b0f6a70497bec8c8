#!/usr/bin/env bash
# One GPU call: the packed MiniCPM5-2B-shape folder (random bf16 weights, CUDA engine) started for real.
# Stage first, here: `bash bench/stage-gpu-run.sh` (writes .device/kit). Then through the device tool:
#   carry [".device/kit"]:  bash bench/device-gpu-run.sh                       (results under $OUT)
# or, when the tracked tree plus the whole kit is over 64 MiB, in two calls on the same warm machine:
#   carry [".device/kit/SHA256SUMS", ".device/kit/kit.tar.xz.00"]  -> stashes the part in /root/a2d-kit, exit 3
#   carry [".device/kit/SHA256SUMS", ".device/kit/kit.tar.xz.01"]  -> runs
# Steps, each under `timeout`, all within TOTAL_S (default 360):
#  - unpack to local disk (A2D_GPU_WORK, default /root/a2d-gpu-run);
#  - regenerate the weights with the folder's own Node running `a2d bench`'s generator: the same bytes as
#    packed, which `a2d verify` then checks against MANIFEST.json;
#  - `a2d simulate-startup --gpu-run --json --gpu h200 --budget 120`: each start gets 120 s (SIM_BUDGET_S),
#    not the product's 300, so a hung start is reported in the JSON instead of killed with it;
#  - `a2d bench --random-shape minicpm5-2b --device cuda --ar-baseline` through the packed CUDA addon, in two
#    passes (BENCH1_ARGS: KV 1024 with the AR baseline; BENCH2_ARGS: KV 8192 and 32768), so a slow long-KV
#    pass cannot take the baseline with it.
#  - `a2d selfcheck` of the folder (SELFCHECK_S, 0 skips it);
# Step limits RESTORE_S, VERIFY_S, SIM_S, SELFCHECK_S, BENCH1_S, BENCH2_S (seconds) are each cut to what is left of
# TOTAL_S.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-/tmp/a2d-out}"
kit="$root/.device/kit"
stash="${A2D_KIT_STASH:-/root/a2d-kit}"
work="${A2D_GPU_WORK:-/root/a2d-gpu-run}"
shape=minicpm5-2b
folder="$work/folder"
node="$folder/runtime/bin/node"
cli="$folder/app/dist/cli/main.js"
deadline=$((SECONDS + ${TOTAL_S:-360}))
mkdir -p "$out" "$stash" "$work"
summary=()

# The smaller of a step's own limit and what is left of TOTAL_S.
limit() {
  local left=$((deadline - SECONDS - 5))
  ((left < $1)) && echo $((left > 1 ? left : 1)) || echo "$1"
}

# Runs a step, records its exit status and seconds in the summary.
step() {
  local name="$1" t0=$SECONDS status
  shift
  echo "== $name"
  "$@"
  status=$?
  summary+=("$(printf '%-40s exit %3d  %4d s' "$name" "$status" $((SECONDS - t0)))")
  return $status
}

finish() {
  {
    echo "== summary"
    printf '%s\n' "${summary[@]}"
    [[ -s $out/simulate.json ]] && "$node" -e '
      const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
      const s = (x) => (x == null ? "n/a" : `${Number(x).toFixed(2)} s`);
      console.log(`simulate-startup: ${r.verdict}; CPU ready ${s(r.measured_ready_s)}; predicted ${r.gpu} ${s(r.predicted_ready_s)}; ` +
        `GPU run ready ${r.gpu_run ? s(r.gpu_run.ready_s) : "not run"}`);
      for (const p of r.problems) console.log(`  [${p.cause}] ${p.detail}`);' "$out/simulate.json"
    grep -hE "^(model |block |AR baseline|a2d: )|^ +[0-9]+ +[0-9]+ |^  block .* ms/forward" "$out/bench.log" 2>/dev/null
  } | tee "$out/summary.txt"
  exit "${1:-0}"
}

machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  echo "kernel $(uname -r); $(ldd --version | head -1); $(nproc) cores"
  df -h "$work" | tail -1
  ldconfig -p | grep -m1 'libcuda\.so\.1 ' || echo "libcuda.so.1 not in the loader cache"
  unshare --net true && echo "unshare --net: ok" || echo "unshare --net: FAILS (the simulator needs a network namespace)"
  command -v strace || echo "no strace on this machine (the kit's is tried below)"
  [[ -f $kit/KIT.txt ]] && cat "$kit/KIT.txt"
  true
}

# Collects the parts carried now with those stashed by an earlier call; exit 3 while any is missing.
assemble() {
  [[ -f $kit/SHA256SUMS ]] && cp -f "$kit/SHA256SUMS" "$stash/"
  for part in "$kit"/kit.tar.xz.*; do [[ -f $part ]] && cp -f "$part" "$stash/"; done
  [[ -f $stash/SHA256SUMS ]] || { echo "no kit: run bash bench/stage-gpu-run.sh first and carry .device/kit"; return 3; }
  (cd "$stash" && sha256sum -c --quiet SHA256SUMS >/dev/null 2>&1) && return 0
  echo "parts still missing or damaged (stashed in $stash for the next call):"
  (cd "$stash" && sha256sum -c SHA256SUMS 2>&1 | grep -v ': OK$')
  return 3
}

unpack() {
  rm -rf "$folder" "$work/tools"
  (cd "$stash" && awk '{print $2}' SHA256SUMS | xargs cat) | xz -dc | tar -x -C "$work" &&
    "$node" -e 'console.log(`node ${process.version} runs here`)'
}

# randomModel writes $TMPDIR/a2d-bench-<shape> (reused when complete), where `a2d bench --random-shape` finds it.
restore() {
  TMPDIR="$work" timeout -k 5 "$(limit "${RESTORE_S:-150}")" "$node" --input-type=module \
    -e "const { randomModel } = await import(process.argv[1]); randomModel(process.argv[2]);" \
    "$folder/app/dist/cli/commands/bench.js" "$shape" &&
    ln -f "$work/a2d-bench-$shape/model.safetensors" "$folder/model/model.safetensors"
}

verify() {
  timeout -k 5 "$(limit "${VERIFY_S:-120}")" "$node" "$cli" verify "$folder" | tee "$out/verify.log" | tail -n 20
  return "${PIPESTATUS[0]}"
}

# The GPU image has no strace or bwrap and may reach libcuda only through LD_LIBRARY_PATH, which the simulator's
# `env -i` drops (a machine with the driver installed has it in the loader cache).
prepare() {
  if ! command -v strace >/dev/null; then
    if "$work/tools/strace/strace" -f --seccomp-bpf -qq -e trace=execve -o /dev/null /bin/true; then
      export PATH="$PATH:$work/tools/strace"
      echo "strace: the kit's ($("$work/tools/strace/strace" -V | head -1))"
    else
      echo "strace: the kit's does not run here; the simulator runs untraced (an isolation problem)"
    fi
  fi
  if ! command -v bwrap >/dev/null; then
    if "$work/tools/bwrap/bwrap" --dev-bind / / /bin/true; then
      export PATH="$PATH:$work/tools/bwrap"
      echo "bwrap: the kit's ($("$work/tools/bwrap/bwrap" --version))"
    else
      echo "bwrap: the kit's does not run here; the simulator runs unsandboxed (an isolation problem)"
    fi
  fi
  if [[ -e /dev/nvidiactl || -e /proc/driver/nvidia/version ]] && ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
    local d
    for d in ${LD_LIBRARY_PATH//:/ } /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
      if [[ -e $d/libcuda.so.1 ]]; then
        echo "$d" >/etc/ld.so.conf.d/000-a2d-gpu-run.conf && ldconfig &&
          echo "NOTE: libcuda.so.1 was only on LD_LIBRARY_PATH; registered $d with ldconfig, as a driver install does"
        break
      fi
    done
  fi
  true
}

simulate() {
  timeout -k 10 "$(limit "${SIM_S:-280}")" "$node" "$cli" simulate-startup "$folder" --gpu-run --json --gpu h200 \
    --budget "${SIM_BUDGET_S:-120}" --figures "$root/bench/NOTES.md" >"$out/simulate.json" 2>"$out/simulate.log"
  local status=$?
  tail -n 5 "$out/simulate.log"
  return $status
}

# The folder's own selfcheck (serve.sh started as a user would: readiness, the API's shapes, single-stream speed).
selfcheck() {
  timeout -k 10 "$(limit "${SELFCHECK_S:-240}")" "$node" "$cli" selfcheck "$folder" --json >"$out/selfcheck.json" \
    2>"$out/selfcheck.log"
  local status=$?
  "$node" -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    console.log(JSON.stringify(r).slice(0, 1500));' "$out/selfcheck.json" 2>/dev/null || tail -n 5 "$out/selfcheck.log"
  return $status
}

bench() {
  local seconds="$1"
  shift
  TMPDIR="$work" A2D_ADDON_DIR="$folder/engine" timeout -k 10 "$(limit "$seconds")" \
    "$node" "$cli" bench --random-shape "$shape" --device cuda "$@" 2>&1 | tee -a "$out/bench.log"
  return "${PIPESTATUS[0]}"
}

main() {
  step "machine" machine
  step "assemble kit parts" assemble || finish 3
  step "unpack" unpack || finish 1
  step "restore weights (folder's node, bench generator)" restore || finish 1
  step "a2d verify" verify
  step "prepare (strace, libcuda)" prepare
  step "simulate-startup --gpu-run --gpu h200" simulate
  [[ ${SELFCHECK_S:-240} == 0 ]] || step "selfcheck" selfcheck
  local bench1 bench2
  read -ra bench1 <<<"${BENCH1_ARGS:---kv 1024 --ar-baseline}"
  read -ra bench2 <<<"${BENCH2_ARGS:---kv 8192,32768}"
  step "bench ${bench1[*]}" bench "${BENCH1_S:-150}" "${bench1[@]}"
  step "bench ${bench2[*]}" bench "${BENCH2_S:-600}" "${bench2[@]}"
  finish 0
}

# Sourced with A2D_GPU_RUN_LIB=1 (bench/device-batch.sh): the steps above only, nothing run.
[[ ${A2D_GPU_RUN_LIB:-} == 1 ]] && return 0
main 2>&1 | tee "$out/run.log"
exit "${PIPESTATUS[0]}"
