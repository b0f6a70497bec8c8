#!/usr/bin/env bash
# Rebuilds the bundled demo model (models/smollm2-135m-a2d + its sha256-pinned base GGUF) on the GPU
# machine into /root/demo, for `TRAINED=/root/demo bash bench/device-cuda.sh` (CUDA vs CPU backend on a
# trained model). The GGUF (98 MB) and the tracked tree do not fit one call, so it arrives in parts
# (bash bench/stage-demo-conversion.sh makes them here); every call carries the next part and runs
#   bash bench/rebuild-demo-device.sh && TRAINED=/root/demo bash bench/device-cuda.sh
# the last one carrying build/device and .device/whl too (each within the 30 s a machine stays warm).
# Exit 10: more parts to come.
set -euo pipefail
bash bench/device-base-gguf.sh
PYTHONPATH=$PWD/convert:/tmp/site python3 -m a2d_convert rebuild --base /root/base.gguf \
  --delta models/smollm2-135m-a2d --out /root/demo --force
PYTHONPATH=$PWD/convert:/tmp/site python3 -m a2d_convert verify /root/demo | tail -n 2
