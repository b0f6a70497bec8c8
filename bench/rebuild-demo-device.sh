#!/usr/bin/env bash
# Rebuilds the bundled demo model (models/smollm2-135m-a2d + its sha256-pinned base GGUF) on the GPU
# machine into /root/demo, for `TRAINED=/root/demo bash bench/device-cuda.sh` (CUDA vs CPU backend on a
# trained model). The GGUF (98 MB) and the tracked tree do not fit one call, so it arrives in parts:
#   call 1 (models/ untracked, carry .device/a): mkdir -p /root/stash && cp .device/a/part00 /root/stash/
#   call 2 (models/ untracked, carry .device/b): cp .device/b/part01 /root/stash/
#   call 3 (carry build/device .device/whl):     bash bench/rebuild-demo-device.sh && TRAINED=/root/demo bash bench/device-cuda.sh
# (each call within the 30 s a machine stays warm; .device/ holds the parts, see bench/NOTES.md).
set -euo pipefail
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
cat /root/stash/part00 /root/stash/part01 > /root/base.gguf
echo "$GGUF_SHA256  /root/base.gguf" | sha256sum -c
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl
PYTHONPATH=$PWD/convert:/tmp/site python3 -m a2d_convert rebuild --base /root/base.gguf \
  --delta models/smollm2-135m-a2d --out /root/demo --force
PYTHONPATH=$PWD/convert:/tmp/site python3 -m a2d_convert verify /root/demo | tail -n 2
