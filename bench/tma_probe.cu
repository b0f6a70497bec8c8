// How fast the bulk copy engine (TMA, cp.async.bulk) streams weights into shared memory on its own, against
// 16-byte register loads, with a trivial consumer (bench/NOTES.md, run 58). Runs 51-54 measured GEMMs fed by
// bulk copies slower than the register-fed tile kernel; this separates the copy mechanism from the GEMM's
// consumer side. One flat sweep over a 2 GiB buffer of bf16, each variant timed over 10 launches:
//   regs       grid-stride 16-byte loads (common.cuh's load_stream16), 4 in flight per thread, 256 threads
//              (bench/stream_probe.cu's flat)
//   ring       per block one producer thread copying stages of B bytes into a ring of S stages (mbarriers
//              `full` and `empty` per stage), 8 consumer warps summing each stage from shared memory;
//              stages taken by the grid in turn (block b: stages b, b + G, ...) or as one contiguous share
// Built outside the engine's CMake:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o build/probe/tma_probe bench/tma_probe.cu
#include "probe_util.cuh"

#include <cstdint>
#include <cstdio>

namespace {

using a2d::cuda::load_stream16;
using namespace a2d::probe;

constexpr int kConsumerWarps = 8;
constexpr int kMaxStages = 32;

__device__ __forceinline__ float sum8(uint4 w) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    s += f.x + f.y;
  }
  return s;
}

__global__ void __launch_bounds__(256) regs_kernel(const uint4* w, long long n, float* out) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  float acc = 0.f;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long j = i + u * stride;
      v[u] = j < n ? load_stream16(w + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) acc += sum8(v[u]);
  }
  if (acc == 123.f) atomicAdd(out, acc);  // keeps the loads
}

// stages: ring depth; stage_bytes: bytes per stage (a multiple of 8 warps * 512); contiguous: block b takes
// stages [b * per_block, (b + 1) * per_block) instead of b, b + G, ...
__global__ void __launch_bounds__((kConsumerWarps + 1) * 32) ring_kernel(const unsigned char* w, long long total_stages,
                                                                     int stages, int stage_bytes, int contiguous,
                                                                     float* out) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  init_ring(full, empty, stages, kConsumerWarps);
  const long long per_block = (total_stages + gridDim.x - 1) / gridDim.x;
  auto global_stage = [&](long long i) {
    return contiguous ? blockIdx.x * per_block + i : blockIdx.x + i * gridDim.x;
  };
  auto in_range = [&](long long i) { return (!contiguous || i < per_block) && global_stage(i) < total_stages; };
  if (warp == kConsumerWarps) {
    if (lane == 0) {
      for (long long i = 0; in_range(i); ++i) {
        const int slot = static_cast<int>(i % stages);
        const long long use = i / stages;
        if (use > 0) bar_wait(&empty[slot], static_cast<unsigned>((use - 1) & 1));
        bar_expect(&full[slot], stage_bytes);
        bulk_copy(ring + static_cast<size_t>(slot) * stage_bytes, w + global_stage(i) * stage_bytes, stage_bytes, &full[slot]);
      }
    }
    return;
  }
  float acc = 0.f;
  const int per_warp = stage_bytes / kConsumerWarps / 16;  // uint4 per warp per stage
  for (long long i = 0; in_range(i); ++i) {
    const int slot = static_cast<int>(i % stages);
    bar_wait(&full[slot], static_cast<unsigned>((i / stages) & 1));
    const uint4* part = reinterpret_cast<const uint4*>(ring + static_cast<size_t>(slot) * stage_bytes) + warp * per_warp;
    for (int j = lane; j < per_warp; j += 32) acc += sum8(part[j]);
    __syncwarp();
    if (lane == 0) bar_arrive(&empty[slot]);
  }
  if (acc == 123.f) atomicAdd(out, acc);
}

}  // namespace

int main() {
  const long long bytes = 2LL << 30;
  unsigned char* w;
  float* out;
  A2D_CUDA_CHECK(cudaMalloc(&w, bytes));
  A2D_CUDA_CHECK(cudaMalloc(&out, sizeof(float)));
  A2D_CUDA_CHECK(cudaMemset(w, 0x3c, bytes));
  int sms = 0;
  A2D_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  A2D_CUDA_CHECK(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  auto time = [&](auto launch) { return bytes / (time_launches(10, launch) * 1e-3) / 1e12; };
  for (int per_sm : {2, 4}) {
    const double tbps = time([&] { regs_kernel<<<per_sm * sms, 256>>>(reinterpret_cast<const uint4*>(w), bytes / 16, out); });
    std::printf("regs   %d blocks/SM                              %.2f TB/s\n", per_sm, tbps);
  }
  const int stage_kib[] = {4, 8, 16, 32};
  const int ring_kib[] = {32, 64, 96, 128, 192};
  for (int contiguous : {0, 1}) {
    for (int per_sm : {1, 2}) {
      for (int sk : stage_kib) {
        for (int rk : ring_kib) {
          const int stages = rk / sk;
          if (stages < 2 || stages > kMaxStages || rk * per_sm > 200) continue;
          const int stage_bytes = sk * 1024;
          const long long total = bytes / stage_bytes;
          const double tbps = time([&] {
            ring_kernel<<<per_sm * sms, (kConsumerWarps + 1) * 32, static_cast<size_t>(stages) * stage_bytes>>>(
                w, total, stages, stage_bytes, contiguous, out);
          });
          A2D_CUDA_CHECK(cudaGetLastError());
          std::printf("ring   %d blocks/SM, %2d KiB stages x %2d = %3d KiB, %s  %.2f TB/s\n", per_sm, sk, stages, rk,
                      contiguous ? "contiguous" : "in turns  ", tbps);
        }
      }
    }
  }
  return 0;
}
