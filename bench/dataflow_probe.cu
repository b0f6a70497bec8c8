// What one persistent forward with tile-level dependencies could reach on the MiniCPM5-2B shape at 4 token rows
// (bench/NOTES.md, run 81), measured before writing one. Run 16 (stream_probe.cu) found that a grid-wide barrier
// per weight matrix costs as much as a launch (about 3 us each, 169 of them); here no unit waits for a whole
// matrix, only for the part of its producer's output that its K range reads:
//   - every matrix is cut into units of 16 weight rows x 512 k (16 KiB of bf16), ordered split-major (the units
//     of k 0..511 first), so a matrix consumes its input in the order it arrives;
//   - a unit waits until every unit producing its 512 input features has finished (a counter per 512 output
//     features of each matrix): o needs its 4 q heads' features and the k/v heads, down the gate/up features
//     of its K range, the next layer's qkv the residual features of its K range. RMSNorm's row scale is a
//     factor of the dot product, so the normalised GEMMs need their own K range too and the row's sum of
//     squares only when they finish (not modelled: that is one more counter at the merge, not before the loads);
//   - each block takes units b, b + G, b + 2G, ... of the one global order (every dependency lies earlier in
//     it and every block is resident, so some block can always go on) and issues the next unit's weight loads
//     before it waits for the current unit's inputs.
// The math is a stand-in with the engine's load shape (each thread: 4 x 16 weight bytes, the matching 16 input
// bytes of 4 token rows from L2, 128 FMAs, a block reduction, a few atomics). Modes (one launch each, except
// `launches`):
//   flat      no unit waits (the ceiling of this unit shape)
//   fine      the dependencies above
//   norm      as fine, but qkv, gate/up and the lm_head wait for their producer's whole output (a norm
//             computed before the loads, as the engine does today)
//   matrix    every unit waits for its producer's whole output (a barrier per matrix, weights prefetched)
//   launches  one launch per matrix, no waits (today's boundaries with this unit shape)
// Built outside the engine's CMake:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o build/probe/dataflow_probe bench/dataflow_probe.cu
#include "probe_util.cuh"

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using a2d::cuda::bf16;
using a2d::cuda::load_stream16;
using namespace a2d::probe;

constexpr int kThreads = 256;
constexpr int kRows = 4;                                         // token rows
constexpr int kTileRows = 16;                                    // weight rows per unit
constexpr int kSegment = 512;                                    // k per unit; output features per counter
constexpr int kLoads = kTileRows * kSegment / 8 / kThreads;      // 16-byte weight loads per thread per unit: 4
constexpr int kUnitVectors = kTileRows * kSegment / 8;           // uint4 per unit
constexpr int kMaxMatrices = 176;

struct Matrix {
  long long weight;       // the matrix's first uint4; unit i of it starts at weight + i * kUnitVectors
  int tiles, splits;      // units = tiles * splits; unit i is tile i % tiles of split i / tiles
  int first_unit;         // in the forward's order
  int producer;           // matrix whose output it reads, -1 none
  int extra_segment;      // one more producer segment every unit reads (o: the k/v heads), -1 none
  int wait_all;           // every unit waits for the producer's whole output
  int features_per_tile;  // output features a tile finishes (gate/up: 8 gate and 8 up rows -> 8)
  int segments;           // output segments (kSegment features each)
  int first_counter;
};

struct Forward {
  int count;
  int units;
  Matrix m[kMaxMatrices];
};

// Until the units producing what split `split` of `m` reads have finished (epoch x their count per counter).
__device__ void wait_inputs(const Forward* f, const Matrix& m, int split, unsigned epoch, const unsigned* counters) {
  if (m.producer < 0) return;
  const Matrix& p = f->m[m.producer];
  const unsigned per_segment = static_cast<unsigned>(kSegment / p.features_per_tile * p.splits) * epoch;
  if (m.wait_all) {
    for (int s = 0; s < p.segments; ++s) wait_counter(counters + p.first_counter + s, per_segment);
  } else {
    wait_counter(counters + p.first_counter + split, per_segment);
    if (m.extra_segment >= 0) wait_counter(counters + p.first_counter + m.extra_segment, per_segment);
  }
  __threadfence();
}

// Units [unit_begin, unit_end) of the forward's order, block b taking unit_begin + b, + G, ...; with `waits`,
// each unit first waits for its inputs' counters (at epoch x the units that produce them).
__global__ void __launch_bounds__(kThreads, 4) forward_kernel(const uint4* weights, const bf16* input, const Forward* f,
                                                           int unit_begin, int unit_end, int mode, unsigned epoch,
                                                           unsigned* counters, float* out) {
  __shared__ float partial[kThreads / 32][kRows];
  const int tid = threadIdx.x;
  const int lane = tid % 32, warp = tid / 32;
  int cursor = 0;  // the matrix of the current unit: units only increase
  auto locate = [&](int unit, int& mi) {
    while (mi + 1 < f->count && f->m[mi + 1].first_unit <= unit) ++mi;
  };
  auto issue = [&](uint4 (&w)[kLoads], int unit, int mi) {
    const uint4* base = weights + f->m[mi].weight + static_cast<long long>(unit - f->m[mi].first_unit) * kUnitVectors;
#pragma unroll
    for (int j = 0; j < kLoads; ++j) w[j] = load_stream16(base + tid + j * kThreads);
  };

  int unit = unit_begin + blockIdx.x;
  if (unit >= unit_end) return;
  locate(unit, cursor);
  uint4 cur[kLoads], next[kLoads];
  issue(cur, unit, cursor);
  float keep = 0.f;
  for (; unit < unit_end; unit += gridDim.x) {
    const Matrix& m = f->m[cursor];
    const int local = unit - m.first_unit;
    const int tile = local % m.tiles, split = local / m.tiles;
    const int following = unit + gridDim.x;
    int next_matrix = cursor;
    if (following < unit_end) {
      locate(following, next_matrix);
      issue(next, following, next_matrix);
    }
    if (mode != 0 && tid == 0) wait_inputs(f, m, split, epoch, counters);
    __syncthreads();

    // Thread t multiplies k = (t % 64) * 8 .. + 7 of weight rows t / 64 + 4j with the 4 token rows' inputs.
    const int k = split * kSegment + (tid % (kSegment / 8)) * 8;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint4 x = __ldcg(reinterpret_cast<const uint4*>(input + static_cast<size_t>(r) * 6144 + k % 6144));
      acc[r] = 0.f;
#pragma unroll
      for (int j = 0; j < kLoads; ++j) acc[r] += dot8(cur[j], x);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
      if (lane == 0) partial[warp][r] = acc[r];
    }
    __syncthreads();
    if (tid < kRows) {
      float sum = 0.f;
      for (int w = 0; w < kThreads / 32; ++w) sum += partial[w][tid];
      atomicAdd(out + (tile * kRows + tid) % 4096, sum);
    }
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      atomicAdd(counters + m.first_counter + tile * m.features_per_tile / kSegment, 1u);
    }
    keep += acc[0];
    cursor = next_matrix;
#pragma unroll
    for (int j = 0; j < kLoads; ++j) cur[j] = next[j];
  }
  if (keep == 12345.f) out[4096 + blockIdx.x] = keep;
}

// The same forward with the loads decoupled from the dependencies: one block per SM, one producer thread copying
// the block's units (16 KiB each, in the block's order) into a ring of kRingWarps shared-memory stages with the
// bulk copy engine (cp.async.bulk, run 58: as fast as register loads from 16 KiB copies), and kRingWarps consumer
// warps, warp w owning stage w: it waits for its stage, for the unit's inputs (counters, as above), multiplies,
// signals and frees the stage. A waiting warp holds only its own stage; the producer runs ahead over the others.
constexpr int kRingWarps = 12;
constexpr int kUnitBytes = kUnitVectors * 16;

__global__ void __launch_bounds__((kRingWarps + 1) * 32, 1) ring_kernel(const uint4* weights, const bf16* input,
                                                                        const Forward* f, int mode, unsigned epoch,
                                                                        unsigned* counters, float* out) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kRingWarps], empty[kRingWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  init_ring(full, empty, kRingWarps, 1);
  const int per_block = (f->units - static_cast<int>(blockIdx.x) + gridDim.x - 1) / gridDim.x;  // units b, b + G, ...
  if (warp == kRingWarps) {
    if (lane == 0) {
      int mi = 0;
      for (int i = 0; i < per_block; ++i) {
        const int unit = blockIdx.x + i * gridDim.x;
        while (mi + 1 < f->count && f->m[mi + 1].first_unit <= unit) ++mi;
        const int slot = i % kRingWarps;
        if (i >= kRingWarps) bar_wait(&empty[slot], static_cast<unsigned>((i / kRingWarps - 1) & 1));
        bar_expect(&full[slot], kUnitBytes);
        bulk_copy(ring + static_cast<size_t>(slot) * kUnitBytes,
                  weights + f->m[mi].weight + static_cast<long long>(unit - f->m[mi].first_unit) * kUnitVectors, kUnitBytes,
                  &full[slot]);
      }
    }
    return;
  }
  const uint4* stage = reinterpret_cast<const uint4*>(ring + static_cast<size_t>(warp) * kUnitBytes);
  int mi = 0;
  float keep = 0.f;
  for (int i = warp; i < per_block; i += kRingWarps) {
    const int unit = blockIdx.x + i * gridDim.x;
    while (mi + 1 < f->count && f->m[mi + 1].first_unit <= unit) ++mi;
    const Matrix& m = f->m[mi];
    const int local = unit - m.first_unit;
    const int tile = local % m.tiles, split = local / m.tiles;
    if (mode != 0 && lane == 0) wait_inputs(f, m, split, epoch, counters);
    __syncwarp();
    // Lane l: k = 8l..8l+7 and 256+8l.. of the unit's 16 rows (each warp load reads 512 contiguous bytes).
    uint4 x[kRows][2];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int k = (split * kSegment + 256 * h + 8 * lane) % 6144;
        x[r][h] = __ldcg(reinterpret_cast<const uint4*>(input + static_cast<size_t>(r) * 6144 + k));
      }
    }
    bar_wait(&full[warp], static_cast<unsigned>((i / kRingWarps) & 1));
    float acc[kRows] = {};
#pragma unroll 4
    for (int row = 0; row < kTileRows; ++row) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 w = stage[row * (kSegment / 8) + 32 * h + lane];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] += dot8(w, x[r][h]);
      }
    }
    __syncwarp();
    if (lane == 0) bar_arrive(&empty[warp]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
    }
    if (lane < kRows) atomicAdd(out + (tile * kRows + lane) % 4096, acc[lane]);
    __syncwarp();
    if (lane == 0) {
      __threadfence();
      atomicAdd(counters + m.first_counter + tile * m.features_per_tile / kSegment, 1u);
    }
    keep += acc[0];
  }
  if (keep == 12345.f) out[4096 + blockIdx.x] = keep;
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 20;
  // MiniCPM5-2B: hidden 2048, 16 q / 2 kv heads of 128, intermediate 6144, 42 layers, vocab 130560.
  const int H = 2048, I = 6144, QKV = 16 * 128 + 2 * 2 * 128, V = 130560, kLayers = 42;
  static Forward f{};
  long long vectors = 0;
  int counters = 0;
  auto add = [&](int n_rows, int k, int producer, int extra_segment, bool normalised, int features_per_tile) {
    Matrix& m = f.m[f.count];
    m.weight = vectors;
    m.tiles = n_rows / kTileRows;
    m.splits = k / kSegment;
    m.first_unit = f.units;
    m.producer = producer;
    m.extra_segment = extra_segment;
    m.wait_all = normalised ? 1 : 0;  // marks the normalised GEMMs; whether they wait for all is the mode's
    m.features_per_tile = features_per_tile;
    m.segments = m.tiles * features_per_tile / kSegment;
    m.first_counter = counters;
    counters += m.segments;
    f.units += m.tiles * m.splits;
    vectors += static_cast<long long>(m.tiles) * m.splits * kUnitVectors;
    return f.count++;
  };
  int last = -1;
  for (int l = 0; l < kLayers; ++l) {
    const int qkv = add(QKV, H, last, -1, true, kTileRows);
    const int o = add(H, H, qkv, QKV / kSegment - 1, false, kTileRows);  // + the k/v heads' segment
    const int gate_up = add(2 * I, H, o, -1, true, 8);
    last = add(H, I, gate_up, -1, false, kTileRows);
  }
  add(V, H, last, -1, true, kTileRows);
  const long long bytes = vectors * 16;

  cudaDeviceProp prop{};
  A2D_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  uint4* weights = nullptr;
  bf16* input = nullptr;
  float* out = nullptr;
  unsigned* counts = nullptr;
  Forward* device_f = nullptr;
  A2D_CUDA_CHECK(cudaMalloc(&weights, bytes));
  A2D_CUDA_CHECK(cudaMemset(weights, 0, bytes));
  A2D_CUDA_CHECK(cudaMalloc(&input, kRows * 6144 * sizeof(bf16)));
  A2D_CUDA_CHECK(cudaMemset(input, 0, kRows * 6144 * sizeof(bf16)));
  A2D_CUDA_CHECK(cudaMalloc(&out, (4096 + 8192) * sizeof(float)));
  A2D_CUDA_CHECK(cudaMalloc(&counts, counters * sizeof(unsigned)));
  A2D_CUDA_CHECK(cudaMalloc(&device_f, sizeof(Forward)));

  int fits = 0;
  A2D_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fits, forward_kernel, kThreads, 0));
  std::printf("gpu %s, %d SMs; %d matrices, %d units of %d KiB, %.3f GB of weights; up to %d blocks per SM\n", prop.name,
              prop.multiProcessorCount, f.count, f.units, kUnitVectors * 16 / 1024, bytes / 1e9, fits);

  const char* names[] = {"flat", "fine", "norm", "matrix", "launches"};
  const int ring_smem = kRingWarps * kUnitBytes;
  A2D_CUDA_CHECK(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_smem));
  for (int per_sm : {0, 2, 3, 4}) {  // 0: the ring kernel, one block per SM
    if (per_sm > fits) continue;
    const int grid = (per_sm == 0 ? 1 : per_sm) * prop.multiProcessorCount;
    for (int mode = 0; mode < (per_sm == 0 ? 4 : 5); ++mode) {
      // Which matrices wait for their producer's whole output in this mode.
      Forward g = f;
      for (int i = 0; i < g.count; ++i) g.m[i].wait_all = mode == 3 || (mode == 2 && f.m[i].wait_all);
      A2D_CUDA_CHECK(cudaMemcpy(device_f, &g, sizeof(Forward), cudaMemcpyHostToDevice));
      A2D_CUDA_CHECK(cudaMemset(counts, 0, counters * sizeof(unsigned)));
      unsigned epoch = 0;
      auto once = [&] {
        ++epoch;
        if (per_sm == 0) {
          ring_kernel<<<grid, (kRingWarps + 1) * 32, ring_smem>>>(weights, input, device_f, mode, epoch, counts, out);
        } else if (mode == 4) {
          for (int i = 0; i < g.count; ++i) {
            const int end = i + 1 < g.count ? g.m[i + 1].first_unit : g.units;
            forward_kernel<<<grid, kThreads>>>(weights, input, device_f, g.m[i].first_unit, end, 0, epoch, counts, out);
          }
        } else {
          forward_kernel<<<grid, kThreads>>>(weights, input, device_f, 0, g.units, mode, epoch, counts, out);
        }
      };
      const float ms = time_launches(iterations, once);
      // Every unit ran once per forward: each counter holds epoch x its segment's units.
      std::vector<unsigned> seen(counters);
      A2D_CUDA_CHECK(cudaMemcpy(seen.data(), counts, counters * sizeof(unsigned), cudaMemcpyDeviceToHost));
      int wrong = 0;
      for (int i = 0; i < g.count; ++i) {
        const unsigned want = static_cast<unsigned>(kSegment / g.m[i].features_per_tile * g.m[i].splits) * epoch;
        for (int s = 0; s < g.m[i].segments; ++s) wrong += seen[g.m[i].first_counter + s] != want;
      }
      std::printf("%-9s %s %d: %.3f ms per forward, %.2f TB/s%s\n", names[mode], per_sm == 0 ? "ring, warps" : "blocks/SM",
                  per_sm == 0 ? kRingWarps : per_sm, ms,
                  bytes / (ms * 1e-3) / 1e12, wrong ? "  COUNTERS WRONG" : "");
    }
  }
  return 0;
}
