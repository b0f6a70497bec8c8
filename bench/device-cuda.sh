#!/usr/bin/env bash
# One GPU call of the CUDA engine's checks and timings (bench/NOTES.md records each run). Stage first,
# here: `bash bench/stage-device.sh`; then through the device tool, carrying build/device:
#   bash bench/device-cuda.sh            (results under $OUT)
# Two processes: the tiny/backend parity sections, then the 2B sections, so a device fault in one
# leaves the other. SMALL_S / BIG_S bound each; BIG_SKIP=peers,load skips more of the second;
# SANITIZE=1 (the default) reruns the tiny section under memcheck if it failed; TRAINED=DIR adds the
# CUDA vs CPU comparison on a trained model folder (bench/rebuild-demo-device.sh makes the demo model);
# ISOLATION=1 (the default) first runs bench/engine_isolation.py (several 2B engines in one process).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out="${OUT:-/tmp/a2d-out}"
mkdir -p "$out"
lib="$PWD/build/device/liba2d_cuda_bench.so"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
ldd --version | head -1
if ! python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$lib"; then
  echo "the staged library does not load here: building it on this machine"
  t0=$(date +%s)
  nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a \
    -Iengine/src -Iengine/cuda -Ibuild/device/include -DA2D_CUDA \
    engine/bench/forward_bench.cu engine/cuda/*.cu engine/src/*.cpp -o /tmp/liba2d_cuda_bench.so -lpthread || exit 1
  lib=/tmp/liba2d_cuda_bench.so
  echo "built in $(( $(date +%s) - t0 )) s"
fi
timeout "${SMALL_S:-200}" python3 bench/cuda_check.py --lib "$lib" --out "$out/small" --skip 2b,peers,load \
  ${TRAINED:+--trained "$TRAINED"} > "$out/small.log" 2>&1
small=$?
echo "small sections: exit $small"
tail -n 25 "$out/small.log"
if [ "${SANITIZE:-1}" = 1 ] && ! grep -q "failures: none" "$out/small.log"; then
  timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 bench/cuda_check.py --lib "$lib" \
    --out /tmp/san --skip backend,2b,peers,load > "$out/sanitizer.log" 2>&1
  echo "sanitizer: exit $?"; grep -m 40 -E "=========|Error|error" "$out/sanitizer.log"
fi
if [ "${ISOLATION:-1}" = 1 ]; then
  timeout 150 python3 bench/engine_isolation.py --lib "$lib" > "$out/isolation.log" 2>&1
  echo "engine isolation: exit $?"; cat "$out/isolation.log" | grep -v Warning | tail -n 12
fi
timeout "${BIG_S:-330}" python3 bench/cuda_check.py --lib "$lib" --out "$out/big" --peers build/device \
  --skip "tiny,backend${BIG_SKIP:+,$BIG_SKIP}" --deadline "${DEADLINE_S:-240}" > "$out/big.log" 2>&1
big=$?
echo "2B sections: exit $big"
sed -n '/==== summary ====/,$p' "$out/big.log" | head -n 60
grep -n -m 20 -E "Error|error|Traceback" "$out/big.log"
[ "$small" = 0 ] && [ "$big" = 0 ]
