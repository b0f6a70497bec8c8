// What one persistent forward in which every SM owns a slice of every matrix (whole K, no split) could reach on
// the MiniCPM5-2B shape at 4 token rows, measured before writing one (bench/NOTES.md, eleventh session).
//
// Run 82 (dataflow_probe.cu) cut matrices into 16 KiB units of 512 k and let each unit wait for the part of its
// producer's output its K range reads: 13 us per matrix boundary, because a GEMM's every output needs its whole
// input and the wait became a chain of unit latencies. Here a step waits for its producer's whole output, once
// per SM, and nothing else is on the path:
//   - SM b owns rows [n b / G, n (b + 1) / G) of every matrix (gate/up: those features' gate rows and up rows),
//     stored contiguously, so its weights for the whole forward are one stream of 16 KiB chunks;
//   - one thread per SM copies that stream into a ring of shared-memory stages with the bulk copy engine
//     (cp.async.bulk), never waiting on a dependency, only on a free stage;
//   - 8 consumer warps run the steps in order. At a step's start one thread polls the producer step's counter
//     until all G SMs have raised it; then the warps stage the step's 4 input rows (from L2) in shared memory,
//     take the row scale of RMSNorm where the step has one, multiply the chunks as they arrive (warp w: the
//     w-th 1024 elements of each chunk, whole rows of K, so a row's partial sums stay in one warp), write the
//     slice's outputs (bf16 rows, residual adds, SiLU(gate) x up, fp32 logits), fence and raise the step's
//     counter.
// Per layer: qkv (normed), attention (here a copy of the q features: one more dependent step with next to no
// work, as the engine's attention at short KV), o (+ residual), gate/up (normed, SiLU x up), down (+ residual);
// then the lm_head (normed): 211 dependent steps. Modes: `flat` (no step waits: the streaming ceiling of this
// design) and `deps` (every step waits); (deps - flat) / 211 is what a boundary costs. Weights are zeros: the
// probe times the data flow, it checks only that every counter and every chunk was seen once per forward.
// Built outside the engine's CMake:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o build/probe/slice_probe bench/slice_probe.cu
#include "probe_util.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using a2d::cuda::bf16;
using namespace a2d::probe;

constexpr int kRows = 4;  // token rows
constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // + the copying warp
constexpr int kChunkBytes = 16384;
constexpr int kChunkElements = kChunkBytes / 2;
constexpr int kGroupElements = 1024;  // a warp's share of a chunk: 4 loads of 32 lanes x 8 bf16
constexpr int kMaxStages = 10;
constexpr int kMaxK = 6144;
constexpr int kMaxSliceRows = 1024;
constexpr int kMaxSteps = 224;

enum Kind : int { kNormed = 0, kResidual = 1, kGateUp = 2, kLogits = 3, kPass = 4 };

struct Step {
  int kind;
  int n, k;           // weight rows (gate/up: 2 per feature) and K; a pass: the features it copies
  int in_stride;      // elements per input row
  long long weight;   // the step's first weight element
  int input, output;  // activation buffers read and written (kLogits writes the fp32 logits)
  int producer;       // the step whose counter gates this one, -1 none
};

struct Plan {
  int steps;
  Step s[kMaxSteps];
};

// The units (rows; gate/up: features, 2 rows each) SM b owns of step s.
__host__ __device__ inline void slice_of(const Step& s, int b, int G, int& u0, int& u1, int& unit_rows) {
  unit_rows = s.kind == kGateUp ? 2 : 1;
  const long long units = s.n / unit_rows;
  u0 = static_cast<int>(units * b / G);
  u1 = static_cast<int>(units * (b + 1) / G);
}

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// 8 bf16 to fp32 (a bf16 is the high half of its fp32).
__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
  const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

__global__ void __launch_bounds__(kThreads, 1) slice_kernel(const bf16* weights, bf16* const* buffers, float* logits,
                                                            const Plan* plan, int stages, int wait, unsigned epoch,
                                                            unsigned* counters, unsigned* consumed) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  bf16* x = reinterpret_cast<bf16*>(smem + static_cast<size_t>(stages) * kChunkBytes);  // kRows x K
  float* sums = reinterpret_cast<float*>(x + kRows * kMaxK);                             // slice row x kRows
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  __shared__ float scale[kRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = gridDim.x, b = blockIdx.x;
  init_ring(full, empty, stages, kConsumerWarps);

  if (warp == kConsumerWarps) {  // the copying thread: this SM's chunks of every step, in order
    if (lane == 0) {
      int i = 0;
      for (int si = 0; si < plan->steps; ++si) {
        const Step& s = plan->s[si];
        if (s.kind == kPass) continue;
        int u0, u1, unit_rows;
        slice_of(s, b, G, u0, u1, unit_rows);
        const long long elements = static_cast<long long>(u1 - u0) * unit_rows * s.k;
        const bf16* source = weights + s.weight + static_cast<long long>(u0) * unit_rows * s.k;
        for (long long e = 0; e < elements; e += kChunkElements, ++i) {
          const int slot = i % stages;
          if (i >= stages) bar_wait(&empty[slot], static_cast<unsigned>((i / stages - 1) & 1));
          const long long left = elements - e;
          const unsigned bytes = static_cast<unsigned>((left < kChunkElements ? left : kChunkElements) * 2);
          bar_expect(&full[slot], bytes);
          bulk_copy(ring + static_cast<size_t>(slot) * kChunkBytes, source + e, bytes, &full[slot]);
        }
      }
    }
    return;
  }

  int i = 0;  // chunks consumed
  for (int si = 0; si < plan->steps; ++si) {
    const Step& s = plan->s[si];
    if (wait && s.producer >= 0 && threadIdx.x == 0) {
      wait_counter(counters + s.producer, static_cast<unsigned>(G) * epoch);
      __threadfence();
    }
    consumers_sync();
    const bf16* in = buffers[s.input];
    int u0, u1, unit_rows;
    slice_of(s, b, G, u0, u1, unit_rows);
    const int units = u1 - u0, rows = units * unit_rows;
    if (s.kind == kPass) {
      bf16* out = buffers[s.output];
      for (int t = threadIdx.x; t < kRows * units; t += kConsumers) {
        const int r = t / units, f = u0 + t % units;
        out[r * s.n + f] = __ldcg(in + r * s.in_stride + f);
      }
    } else {
      const int k = s.k;
      for (int t = threadIdx.x; t < kRows * k / 8; t += kConsumers) {
        const int r = t / (k / 8), c = t % (k / 8);
        reinterpret_cast<uint4*>(x + r * k)[c] = __ldcg(reinterpret_cast<const uint4*>(in + r * s.in_stride) + c);
      }
      for (int t = threadIdx.x; t < rows * kRows; t += kConsumers) sums[t] = 0.f;
      consumers_sync();
      if (s.kind != kResidual && warp < kRows) {  // RMSNorm's row scale, from the staged row
        float q = 0.f;
        for (int c = lane; c < k / 8; c += 32) {
          const uint4 v = reinterpret_cast<const uint4*>(x + warp * k)[c];
          q += dot8(v, v);
        }
        q = warp_sum(q);
        if (lane == 0) scale[warp] = rsqrtf(q / k + 1e-6f);
      }
      // A warp's k range repeats from chunk to chunk where K is a multiple of the chunk's 8192 / 4 rows (K = 2048),
      // so its inputs stay in registers, unpacked to fp32, until the range moves.
      float xf[4][kRows][8];
      int cached_k0 = -1;
      const long long elements = static_cast<long long>(rows) * k;
      for (long long e = 0; e < elements; e += kChunkElements, ++i) {
        const int slot = i % stages;
        const long long left = elements - e;
        const long long count = left < kChunkElements ? left : kChunkElements;
        bar_wait(&full[slot], static_cast<unsigned>((i / stages) & 1));
        if (warp * kGroupElements < count) {
          const long long g = e + warp * kGroupElements;
          const int row = static_cast<int>(g / k), k0 = static_cast<int>(g % k);
          if (k0 != cached_k0) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
              for (int r = 0; r < kRows; ++r) {
                unpack8(*reinterpret_cast<const uint4*>(x + r * k + k0 + j * 256 + lane * 8), xf[j][r]);
              }
            }
            cached_k0 = k0;
          }
          const uint4* stage = reinterpret_cast<const uint4*>(ring + static_cast<size_t>(slot) * kChunkBytes) +
                               warp * (kGroupElements / 8);
          float a[kRows] = {};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float wf[8];
            unpack8(stage[j * 32 + lane], wf);
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
#pragma unroll
              for (int c = 0; c < 8; ++c) a[r] = fmaf(wf[c], xf[j][r][c], a[r]);
            }
          }
#pragma unroll
          for (int r = 0; r < kRows; ++r) a[r] = warp_sum(a[r]);
          if (lane == 0) {
#pragma unroll
            for (int r = 0; r < kRows; ++r) atomicAdd(&sums[row * kRows + r], a[r]);
          }
        }
        __syncwarp();
        if (lane == 0) bar_arrive(&empty[slot]);
      }
      consumers_sync();
      for (int t = threadIdx.x; t < kRows * units; t += kConsumers) {
        const int r = t / units, u = t % units, f = u0 + u;
        if (s.kind == kNormed) {
          buffers[s.output][r * s.n + f] = __float2bfloat16(sums[u * kRows + r] * scale[r]);
        } else if (s.kind == kResidual) {
          bf16* out = buffers[s.output] + r * s.n + f;
          *out = __float2bfloat16(__bfloat162float(__ldcg(out)) + sums[u * kRows + r]);
        } else if (s.kind == kGateUp) {
          const float gate = sums[u * kRows + r] * scale[r], up = sums[(units + u) * kRows + r] * scale[r];
          buffers[s.output][r * (s.n / 2) + f] = __float2bfloat16(gate / (1.f + __expf(-gate)) * up);
        } else {
          logits[static_cast<long long>(r) * s.n + f] = sums[u * kRows + r] * scale[r];
        }
      }
    }
    __threadfence();
    consumers_sync();
    if (threadIdx.x == 0) atomicAdd(counters + si, 1u);
  }
  if (threadIdx.x == 0) atomicAdd(consumed, static_cast<unsigned>(i));
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 20;
  // MiniCPM5-2B: hidden 2048, 16 q / 2 kv heads of 128, intermediate 6144, 42 layers, vocab 130560.
  const int H = 2048, I = 6144, QKV = 16 * 128 + 2 * 2 * 128, V = 130560, kLayers = 42;
  enum Buffer { kResidualRows = 0, kQkvRows, kAttentionRows, kActivationRows, kBuffers };
  const int widths[kBuffers] = {H, QKV, H, I};
  static Plan plan{};
  long long elements = 0;
  auto add = [&](int kind, int n, int k, int in_stride, int input, int output, int producer) {
    Step& s = plan.s[plan.steps];
    s = Step{kind, n, k, in_stride, elements, input, output, producer};
    if (kind != kPass) elements += static_cast<long long>(n) * k;
    return plan.steps++;
  };
  int last = -1;
  for (int l = 0; l < kLayers; ++l) {
    const int qkv = add(kNormed, QKV, H, H, kResidualRows, kQkvRows, last);
    const int attention = add(kPass, H, 0, QKV, kQkvRows, kAttentionRows, qkv);
    const int o = add(kResidual, H, H, H, kAttentionRows, kResidualRows, attention);
    const int gate_up = add(kGateUp, 2 * I, H, H, kResidualRows, kActivationRows, o);
    last = add(kResidual, H, I, I, kActivationRows, kResidualRows, gate_up);
  }
  add(kLogits, V, H, H, kResidualRows, -1, last);
  const long long bytes = elements * 2;

  cudaDeviceProp prop{};
  A2D_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int G = prop.multiProcessorCount;
  long long chunks = 0;  // per forward, over every SM
  for (int si = 0; si < plan.steps; ++si) {
    const Step& s = plan.s[si];
    if (s.kind == kPass) continue;
    for (int b = 0; b < G; ++b) {
      int u0, u1, unit_rows;
      slice_of(s, b, G, u0, u1, unit_rows);
      if ((u1 - u0) * unit_rows > kMaxSliceRows) {
        std::fprintf(stderr, "step %d: %d rows per SM exceed %d\n", si, (u1 - u0) * unit_rows, kMaxSliceRows);
        return 1;
      }
      chunks += (static_cast<long long>(u1 - u0) * unit_rows * s.k + kChunkElements - 1) / kChunkElements;
    }
  }

  bf16* weights = nullptr;
  A2D_CUDA_CHECK(cudaMalloc(&weights, bytes));
  A2D_CUDA_CHECK(cudaMemset(weights, 0, bytes));
  std::vector<bf16*> host_buffers(kBuffers);
  for (int i = 0; i < kBuffers; ++i) {
    A2D_CUDA_CHECK(cudaMalloc(&host_buffers[i], kRows * widths[i] * sizeof(bf16)));
    A2D_CUDA_CHECK(cudaMemset(host_buffers[i], 0, kRows * widths[i] * sizeof(bf16)));
  }
  bf16** buffers = nullptr;
  float* logits = nullptr;
  unsigned *counters = nullptr, *consumed = nullptr;
  Plan* device_plan = nullptr;
  A2D_CUDA_CHECK(cudaMalloc(&buffers, kBuffers * sizeof(bf16*)));
  A2D_CUDA_CHECK(cudaMemcpy(buffers, host_buffers.data(), kBuffers * sizeof(bf16*), cudaMemcpyHostToDevice));
  A2D_CUDA_CHECK(cudaMalloc(&logits, static_cast<size_t>(kRows) * V * sizeof(float)));
  A2D_CUDA_CHECK(cudaMalloc(&counters, plan.steps * sizeof(unsigned)));
  A2D_CUDA_CHECK(cudaMalloc(&consumed, sizeof(unsigned)));
  A2D_CUDA_CHECK(cudaMalloc(&device_plan, sizeof(Plan)));
  A2D_CUDA_CHECK(cudaMemcpy(device_plan, &plan, sizeof(Plan), cudaMemcpyHostToDevice));

  const size_t fixed_smem = static_cast<size_t>(kRows) * kMaxK * sizeof(bf16) + kMaxSliceRows * kRows * sizeof(float);
  A2D_CUDA_CHECK(cudaFuncSetAttribute(slice_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(fixed_smem + kMaxStages * kChunkBytes)));
  std::printf("gpu %s, %d SMs; %d steps, %.3f GB of weights, %lld chunks of 16 KiB per forward\n", prop.name, G,
              plan.steps, bytes / 1e9, chunks);
  for (int stages : {4, 8, kMaxStages}) {
    float flat_ms = 0.f;
    for (int wait = 0; wait < 2; ++wait) {
      A2D_CUDA_CHECK(cudaMemset(counters, 0, plan.steps * sizeof(unsigned)));
      A2D_CUDA_CHECK(cudaMemset(consumed, 0, sizeof(unsigned)));
      unsigned epoch = 0;
      const size_t smem = fixed_smem + static_cast<size_t>(stages) * kChunkBytes;
      const float ms = time_launches(iterations, [&] {
        ++epoch;
        slice_kernel<<<G, kThreads, smem>>>(weights, buffers, logits, device_plan, stages, wait, epoch, counters,
                                           consumed);
      });
      std::vector<unsigned> seen(plan.steps);
      unsigned seen_chunks = 0;
      A2D_CUDA_CHECK(cudaMemcpy(seen.data(), counters, plan.steps * sizeof(unsigned), cudaMemcpyDeviceToHost));
      A2D_CUDA_CHECK(cudaMemcpy(&seen_chunks, consumed, sizeof(unsigned), cudaMemcpyDeviceToHost));
      const long long wrong = std::count_if(seen.begin(), seen.end(), [&](unsigned c) { return c != G * epoch; });
      const bool chunks_ok = seen_chunks == static_cast<unsigned>(chunks * epoch);
      if (wait == 0) flat_ms = ms;
      std::printf("%-5s stages %2d: %.3f ms per forward, %.2f TB/s", wait ? "deps" : "flat", stages, ms,
                  bytes / (ms * 1e-3) / 1e12);
      if (wait) std::printf(", %.2f us per step boundary", (ms - flat_ms) * 1e3 / plan.steps);
      std::printf("%s%s\n", wrong ? "  COUNTERS WRONG" : "", chunks_ok ? "" : "  CHUNKS WRONG");
    }
  }
  return 0;
}
