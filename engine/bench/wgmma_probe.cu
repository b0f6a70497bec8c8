// Which Hopper code the driver runs from a fat binary that carries both sm_90a and sm_90 machine code, as the addon
// does (engine/cuda/CMakeLists.txt): gemm_wgmma.cu's kernels are sm_90a code, and its sm_90 copy traps. Built by
// bench/stage-device.sh with the addon's two -gencode flags as build/device/wgmma_probe; on the GPU machine it prints
// the device and whether gemm_wgmma_available() (the engine's own probe) finds the sm_90a code. Exit 0 either way,
// 1 on a CUDA error.
#include <cstdio>
#include <exception>

#include "gemm_prefill.cuh"

int main() {
  try {
    cudaDeviceProp prop{};
    A2D_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, compute capability %d.%d\n", prop.name, prop.major, prop.minor);
    std::printf("warpgroup prefill GEMM (sm_90a code) runs from a fat binary with sm_90a and sm_90: %s\n",
                a2d::cuda::gemm_wgmma_available() ? "yes" : "no (the driver loaded the sm_90 code)");
    return 0;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
