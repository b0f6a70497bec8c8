// What one persistent kernel per forward could reach on the MiniCPM5-2B shape (bench/NOTES.md, run 16).
// Streams the forward's 4.50 GB of bf16 weights (42 layers x qkv, o, gate/up, down; then the lm_head) with
// a dot product against a small input, three ways, each one launch:
//   flat      every byte in one grid-stride sweep, no phases (the streaming ceiling of this access pattern)
//   barrier   169 phases (one per weight matrix) separated by a grid-wide barrier, as a persistent forward
//             must wait for each GEMM's output before the next GEMM's inputs exist
//   prefetch  the same barriers, but each thread issues its loads of the next phase's weights before it
//             arrives at the barrier (weights never depend on activations), so HBM stays busy across it
// and, for reference, the same 169 phases as 169 ordinary launches. Prints ms per forward and TB/s.
// The loads are the engine's own (common.cuh's load_stream16). Built outside the engine's CMake:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o build/probe/stream_probe bench/stream_probe.cu
#include "probe_util.cuh"

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using a2d::cuda::load_stream16;

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread per round
constexpr int kMaxPhases = 256;

struct Phases {
  int count;
  long long begin[kMaxPhases + 1];  // in uint4 units
};

__device__ __forceinline__ float dot8(uint4 w, float x) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    s += f.x * x + f.y * x;
  }
  return s;
}

// Streams [begin, end) of the weights, grid-stride, kUnroll loads in flight; with `has_first`, `first` holds
// this thread's loads of the range's first round, issued already by the caller (prefetch).
__device__ __forceinline__ float stream_range(const uint4* w, long long begin, long long end, float x,
                                              const uint4 (&first)[kUnroll], bool has_first) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long tid = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc = 0.f;
  long long i = begin + tid;
  if (has_first) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u * stride < end) acc += dot8(first[u], x);
    }
    i += kUnroll * stride;
  }
  for (; i < end; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = i + u * stride < end ? load_stream16(w + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc += dot8(v[u], x);
  }
  return acc;
}

// Sense-reversing grid barrier over a counter and a generation word (all blocks resident: the grid is
// sized from the occupancy calculator).
__device__ void grid_barrier(unsigned* count, volatile unsigned* generation) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = *generation;
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      *count = 0;
      __threadfence();
      atomicAdd(const_cast<unsigned*>(generation), 1u);
    } else {
      while (*generation == gen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) flat_kernel(const uint4* w, long long total, float x, float* out) {
  const uint4 none[kUnroll] = {};
  const float acc = stream_range(w, 0, total, x, none, false);
  if (acc == 12345.f) out[blockIdx.x] = acc;  // keeps the loads alive
}

__global__ void __launch_bounds__(kThreads) phase_kernel(const uint4* w, Phases phases, int phase, float x, float* out) {
  const uint4 none[kUnroll] = {};
  const float acc = stream_range(w, phases.begin[phase], phases.begin[phase + 1], x, none, false);
  if (acc == 12345.f) out[blockIdx.x] = acc;
}

template <bool kPrefetch>
__global__ void __launch_bounds__(kThreads) persistent_kernel(const uint4* w, Phases phases, float x, float* out,
                                                              unsigned* count, unsigned* generation) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long tid = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc = 0.f;
  uint4 next[kUnroll] = {};
  bool have = false;
  for (int p = 0; p < phases.count; ++p) {
    acc += stream_range(w, phases.begin[p], phases.begin[p + 1], x + acc * 1e-30f, next, have);
    have = false;
    if (kPrefetch && p + 1 < phases.count) {
      const long long b = phases.begin[p + 1], e = phases.begin[p + 2];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) next[u] = b + tid + u * stride < e ? load_stream16(w + b + tid + u * stride) : make_uint4(0, 0, 0, 0);
      have = true;
    }
    grid_barrier(count, generation);
  }
  if (acc == 12345.f) out[blockIdx.x] = acc;
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 20;
  // MiniCPM5-2B: hidden 2048, 16 q / 2 kv heads of 128, intermediate 6144, 42 layers, vocab 130560.
  const long long H = 2048, I = 6144, Q = 16 * 128, KV = 2 * 128, V = 130560;
  std::vector<long long> bytes;
  for (int l = 0; l < 42; ++l) {
    bytes.push_back((Q + 2 * KV) * H * 2);  // qkv
    bytes.push_back(H * Q * 2);             // o
    bytes.push_back(2 * I * H * 2);         // gate/up
    bytes.push_back(H * I * 2);             // down
  }
  bytes.push_back(V * H * 2);  // lm_head
  Phases phases{};
  phases.count = static_cast<int>(bytes.size());
  long long total = 0;
  for (int p = 0; p < phases.count; ++p) {
    phases.begin[p] = total / 16;
    total += bytes[p];
  }
  phases.begin[phases.count] = total / 16;

  cudaDeviceProp prop{};
  A2D_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  uint4* w = nullptr;
  float* out = nullptr;
  unsigned* sync = nullptr;
  A2D_CUDA_CHECK(cudaMalloc(&w, total));
  A2D_CUDA_CHECK(cudaMemset(w, 0, total));
  A2D_CUDA_CHECK(cudaMalloc(&out, 1 << 20));
  A2D_CUDA_CHECK(cudaMalloc(&sync, 2 * sizeof(unsigned)));
  A2D_CUDA_CHECK(cudaMemset(sync, 0, 2 * sizeof(unsigned)));
  A2D_CUDA_CHECK(cudaDeviceSynchronize());

  auto timed = [&](const char* name, int blocks_per_sm, auto&& launch_once) {
    const float ms = a2d::probe::time_launches(iterations, launch_once);
    std::printf("%-10s blocks/SM %d: %.3f ms per forward, %.2f TB/s\n", name, blocks_per_sm, ms, total / (ms * 1e-3) / 1e12);
    return ms;
  };

  std::printf("gpu %s, %d SMs; %d phases, %.3f GB of weights\n", prop.name, prop.multiProcessorCount, phases.count, total / 1e9);
  for (int per_sm : {1, 2, 4, 8}) {
    int fits = 0;
    A2D_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fits, persistent_kernel<true>, kThreads, 0));
    if (per_sm > fits) continue;
    const int grid = per_sm * prop.multiProcessorCount;
    const float flat = timed("flat", per_sm, [&] { flat_kernel<<<grid, kThreads>>>(w, total / 16, 1.f, out); });
    const float launches = timed("launches", per_sm, [&] {
      for (int p = 0; p < phases.count; ++p) phase_kernel<<<grid, kThreads>>>(w, phases, p, 1.f, out);
    });
    const float barrier = timed("barrier", per_sm, [&] { persistent_kernel<false><<<grid, kThreads>>>(w, phases, 1.f, out, sync, sync + 1); });
    const float prefetch = timed("prefetch", per_sm, [&] { persistent_kernel<true><<<grid, kThreads>>>(w, phases, 1.f, out, sync, sync + 1); });
    std::printf("  per phase boundary over flat: launches %.2f us, barrier %.2f us, prefetch %.2f us\n",
                (launches - flat) * 1e3 / phases.count, (barrier - flat) * 1e3 / phases.count,
                (prefetch - flat) * 1e3 / phases.count);
  }
  return 0;
}
