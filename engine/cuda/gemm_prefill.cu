#include "gemm_prefill.cuh"

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>

#include "gemm_prefill_epilogue.cuh"
#include "weights.cuh"

namespace a2d::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlockTiles = 8;    // weight tiles (16 rows each) per block: 128 rows
constexpr int kStageChunks = 2;   // 32-column chunks per stage: 64 k
constexpr int kChunkElements = 16 * 32;  // one chunk of one tile: 1 KiB
constexpr int kWeightStage = kBlockTiles * kStageChunks * kChunkElements;  // bf16 per stage
// Warp w: tiles 4 (w % 2) .. + 3 of the block, tokens block_tokens / 4 * (w / 2) onwards.
constexpr int kWarpTiles = 4;
// A split's partial of one output block: each thread's kWarpTiles x (block_tokens / 32) accumulators of 4, stored
// as float4 [tile x group][thread] so that a warp's stores and loads are contiguous. The kernel's indexing and
// prefill_split's scratch both read it.
__host__ __device__ constexpr int partial_quads(int block_tokens) { return kWarpTiles * (block_tokens / 32); }

// The sizes that follow from a block shape (PrefillShape).
template <int kBlockTokens, int kStages, int kMinBlocks>
struct Layout {
  static_assert(kBlockTokens == 32 || kBlockTokens == 64 || kBlockTokens == 128, "a block's tokens: 4 warps of 8-token groups");
  static_assert(kStages >= 2, "the ring needs a stage in flight beside the one computed");
  static constexpr int input_stage = kStageChunks * kBlockTokens * 32;
  static constexpr int smem_bytes = kStages * (kWeightStage + input_stage) * 2;  // 128 KiB (128 tokens, 4 stages)
  static_assert(smem_bytes * kMinBlocks <= 227 * 1024, "the ring of every resident block must fit in shared memory");
  static constexpr int warp_groups = kBlockTokens / 32;  // groups of 8 tokens
};
// The 64-k steps of K: the kernel's loop and prefill_split's plan.
__host__ __device__ int prefill_steps(int k) { return (k + kStageChunks * 32 - 1) / (kStageChunks * 32); }

template <PrefillEpilogue kEpilogue, int kBlockTokens, int kStages, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gemm_prefill_kernel(const __grid_constant__ PrefillGemmParams p) {
  using L = Layout<kBlockTokens, kStages, kMinBlocks>;
  constexpr int kInputStage = L::input_stage;
  constexpr int kWarpGroups = L::warp_groups;
  constexpr int kPartialQuads = partial_quads(kBlockTokens);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int c = lane % 4;
  const int tiles = (p.n_rows + 15) / 16;
  const int chunks = (p.k + 31) / 32;
  const int tile0 = blockIdx.y * kBlockTiles;
  const int token0 = blockIdx.x * kBlockTokens;
  // This block's steps: all of them, or its split's range.
  const int all_steps = prefill_steps(p.k);
  const int first_step = p.steps_per_split > 0 ? static_cast<int>(blockIdx.z) * p.steps_per_split : 0;
  const int end_step = p.steps_per_split > 0 ? min(all_steps, first_step + p.steps_per_split) : all_steps;
  const int steps = end_step - first_step;

  // This block's stage `local` (chunks kStageChunks * (first_step + local) ..) into ring slot `slot`: weights
  // [tile][chunk][512], inputs [chunk][token][32]; zeros past the matrix, past K, past the block's steps and past
  // the token rows. One commit group per call.
  auto load_stage = [&](int local, int slot) {
    bf16* ws = smem + slot * (kWeightStage + kInputStage);
    bf16* xs = ws + kWeightStage;
    const bool in_range = local < steps;
    const int s = first_step + local;
    for (int piece = threadIdx.x; piece < kWeightStage / 8; piece += kThreads) {
      const int tile = piece / (kStageChunks * 64);
      const int chunk = piece / 64 % kStageChunks;
      const int e = piece % 64 * 8;
      const int global_chunk = s * kStageChunks + chunk;
      const bool valid = in_range && tile0 + tile < tiles && global_chunk < chunks;
      const size_t offset = valid ? (static_cast<size_t>(tile0 + tile) * chunks + global_chunk) * kChunkElements + e : 0;
      cp_async16(ws + (tile * kStageChunks + chunk) * kChunkElements + e, p.weight + offset, valid);
    }
    for (int piece = threadIdx.x; piece < kInputStage / 8; piece += kThreads) {
      const int chunk = piece / (kBlockTokens * 4);
      const int token = piece / 4 % kBlockTokens;
      const int quarter = piece % 4;
      const int k = (s * kStageChunks + chunk) * 32 + quarter * 8;
      const bool valid = in_range && token0 + token < p.rows && k < p.k;
      const size_t offset = valid ? static_cast<size_t>(token0 + token) * p.x_stride + k : 0;
      cp_async16(xs + (chunk * kBlockTokens + token) * 32 + quarter * 8, p.x + offset, valid);
    }
    cp_async_commit();
  };

  const int warp_tile = (warp % 2) * kWarpTiles;
  const int warp_token = (warp / 2) * (kWarpGroups * 8);
  float acc[kWarpTiles][kWarpGroups][4];
#pragma unroll
  for (int i = 0; i < kWarpTiles; ++i) {
#pragma unroll
    for (int j = 0; j < kWarpGroups; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
  }

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load_stage(s, s);
  for (int s = 0; s < steps; ++s) {
    cp_async_wait<kStages - 2>();  // stage s's copies (this thread's), then everyone's:
    __syncthreads();               // and every warp is done with the slot of stage s - 1, refilled here
    load_stage(s + kStages - 1, (s + kStages - 1) % kStages);
    const bf16* ws = smem + (s % kStages) * (kWeightStage + kInputStage);
    const bf16* xs = ws + kWeightStage;
#pragma unroll
    for (int chunk = 0; chunk < kStageChunks; ++chunk) {
      uint4 wa[kWarpTiles], wb[kWarpTiles], xv[kWarpGroups];
#pragma unroll
      for (int i = 0; i < kWarpTiles; ++i) {
        const bf16* w = ws + ((warp_tile + i) * kStageChunks + chunk) * kChunkElements + lane * 8;
        wa[i] = *reinterpret_cast<const uint4*>(w);
        wb[i] = *reinterpret_cast<const uint4*>(w + kChunkElements / 2);
      }
#pragma unroll
      for (int j = 0; j < kWarpGroups; ++j) {
        xv[j] = *reinterpret_cast<const uint4*>(xs + (chunk * kBlockTokens + warp_token + j * 8 + g) * 32 + c * 8);
      }
#pragma unroll
      for (int i = 0; i < kWarpTiles; ++i) {
#pragma unroll
        for (int j = 0; j < kWarpGroups; ++j) {
          mma_bf16_16816(acc[i][j], wa[i].x, wb[i].x, wa[i].y, wb[i].y, xv[j].x, xv[j].y);
          mma_bf16_16816(acc[i][j], wa[i].z, wb[i].z, wa[i].w, wb[i].w, xv[j].z, xv[j].w);
        }
      }
    }
  }
  cp_async_wait<0>();

  if (p.steps_per_split > 0) {
    // Publish this split's accumulators; the output block's last split to arrive adds every split's in order.
    const int block = blockIdx.y * gridDim.x + blockIdx.x;
    float4* own = reinterpret_cast<float4*>(p.partial) + (static_cast<size_t>(blockIdx.z) * gridDim.x * gridDim.y + block) * kPartialQuads * kThreads;
#pragma unroll
    for (int i = 0; i < kWarpTiles; ++i) {
#pragma unroll
      for (int j = 0; j < kWarpGroups; ++j) {
        own[(i * kWarpGroups + j) * kThreads + threadIdx.x] = make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
      }
    }
    __threadfence();
    __syncthreads();
    __shared__ int arrived;
    if (threadIdx.x == 0) arrived = atomicAdd(&p.counters[block], 1);
    __syncthreads();
    if (arrived != static_cast<int>(gridDim.z) - 1) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < kWarpTiles; ++i) {
#pragma unroll
      for (int j = 0; j < kWarpGroups; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    }
    for (int split = 0; split < static_cast<int>(gridDim.z); ++split) {
      const float4* part = reinterpret_cast<const float4*>(p.partial) + (static_cast<size_t>(split) * gridDim.x * gridDim.y + block) * kPartialQuads * kThreads;
#pragma unroll
      for (int i = 0; i < kWarpTiles; ++i) {
#pragma unroll
        for (int j = 0; j < kWarpGroups; ++j) {
          const float4 v = __ldcg(part + (i * kWarpGroups + j) * kThreads + threadIdx.x);
          acc[i][j][0] += v.x;
          acc[i][j][1] += v.y;
          acc[i][j][2] += v.z;
          acc[i][j][3] += v.w;
        }
      }
    }
    if (threadIdx.x == 0) p.counters[block] = 0;
  }

  // Epilogue from the registers: acc[i][j] holds tile rows g (elements 0, 1) and g + 8 (2, 3) for the
  // tokens 2c and 2c + 1 (elements 0, 2 and 1, 3) of token group j.
#pragma unroll
  for (int i = 0; i < kWarpTiles; ++i) {
    const int tile = tile0 + warp_tile + i;
    if (tile >= tiles) continue;
    const float2 bias = prefill_tile_bias(p, tile, g);
    // Token row b = 2j + h: token 8j + 2c + h of the warp's rows.
    prefill_epilogue_rows<kEpilogue, 2 * kWarpGroups>(
        p, tile, g, [&](int b) { return token0 + warp_token + (b / 2) * 8 + 2 * c + b % 2; },
        [&](int b) { return make_float2(acc[i][b / 2][b % 2] + bias.x, acc[i][b / 2][b % 2 + 2] + bias.y); },
        [&](int t) { return prefill_token(p, t); });
  }
}

// Every epilogue's kernel at one shape: prepare (the shared-memory limit) or launch.
template <int kBlockTokens, int kStages, int kMinBlocks>
struct ShapeKernels {
  using L = Layout<kBlockTokens, kStages, kMinBlocks>;

  static bool matches(const PrefillShape& s) {
    return s.block_tokens == kBlockTokens && s.stages == kStages && s.blocks_per_sm == kMinBlocks;
  }
  static void prepare() {
    for (PrefillEpilogue epilogue : kPrefillEpilogues) {
      with_prefill_epilogue(epilogue, [](auto e) {
        A2D_CUDA_CHECK(cudaFuncSetAttribute(gemm_prefill_kernel<decltype(e)::value, kBlockTokens, kStages, kMinBlocks>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, L::smem_bytes));
      });
    }
  }
  static void run(const PrefillGemmParams& p, PrefillEpilogue epilogue, int splits, cudaStream_t stream) {
    const dim3 grid(ceil_div(p.rows, kBlockTokens), ceil_div(ceil_div(p.n_rows, 16), kBlockTiles), splits);
    with_prefill_epilogue(epilogue, [&](auto e) {
      launch(gemm_prefill_kernel<decltype(e)::value, kBlockTokens, kStages, kMinBlocks>, grid, dim3(kThreads),
             L::smem_bytes, stream, false, p);
    });
  }
};
// kPrefillShapes, in its order.
template <int i>
using ShapeAt = ShapeKernels<kPrefillShapes[i].block_tokens, kPrefillShapes[i].stages, kPrefillShapes[i].blocks_per_sm>;
using Shape128 = ShapeAt<0>;
using Shape64 = ShapeAt<1>;
using Shape32 = ShapeAt<2>;
static_assert(std::size(kPrefillShapes) == 3, "every shape of kPrefillShapes is built here");

bool is_built_shape(const PrefillShape& s) { return Shape128::matches(s) || Shape64::matches(s) || Shape32::matches(s); }

}  // namespace

void gemm_prefill_prepare() {
  gemm_wgmma_prepare();
  Shape128::prepare();
  Shape64::prepare();
  Shape32::prepare();
}

PrefillShape prefill_shape(int rows, bool by_rows) {
  if (!by_rows || rows > 256) return kPrefillShapes[0];
  return rows > 32 ? kPrefillShapes[1] : kPrefillShapes[2];
}

PrefillSplit plan_prefill_split(int blocks, int wave, int k, size_t floats_per_block) {
  PrefillSplit split;
  const int steps = prefill_steps(k);
  // Only where at least two splits fit in one wave: a grid that fills most of a wave already would take two.
  if (wave <= 0 || 2 * blocks > wave || steps < 2 * kPrefillMinSplitSteps) return split;
  const int wanted = std::min(wave / blocks, steps / kPrefillMinSplitSteps);
  split.steps_per_split = ceil_div(steps, wanted);
  split.splits = ceil_div(steps, split.steps_per_split);  // every split has at least one step
  if (split.splits < 2) return PrefillSplit{};
  split.partial_floats = static_cast<size_t>(split.splits) * blocks * floats_per_block;
  split.counters = blocks;
  return split;
}

PrefillSplit prefill_split(int rows, int n_rows, int k, int blocks_per_sm, int sm_count, PrefillShape shape) {
  if (!is_built_shape(shape)) throw std::invalid_argument("prefill_split: not one of kPrefillShapes");
  const int blocks = ceil_div(rows, shape.block_tokens) * ceil_div(ceil_div(n_rows, 16), kBlockTiles);
  const int wave = blocks_per_sm > 0 ? blocks_per_sm * sm_count : 0;
  return plan_prefill_split(blocks, wave, k, static_cast<size_t>(partial_quads(shape.block_tokens)) * kThreads * 4);
}

void check_prefill_epilogue(const PrefillGemmParams& p, PrefillEpilogue epilogue, const char* caller) {
  if (epilogue == PrefillEpilogue::rope_qkv && (p.head_dim % 16 != 0 || p.n_rows % p.head_dim != 0)) {
    throw std::logic_error(std::string(caller) + ": the RoPE epilogue needs whole heads of a multiple of 16 dims");
  }
}

void gemm_prefill(const PrefillGemmParams& p, PrefillEpilogue epilogue, cudaStream_t stream, PrefillShape shape) {
  if (p.k % 8 != 0) throw std::runtime_error("gemm_prefill: k must be a multiple of 8, got " + std::to_string(p.k));
  if (!is_built_shape(shape)) throw std::invalid_argument("gemm_prefill: not one of kPrefillShapes");
  if (p.rows <= 0) return;
  check_prefill_epilogue(p, epilogue, "gemm_prefill");
  const int splits = p.steps_per_split > 0 ? ceil_div(prefill_steps(p.k), p.steps_per_split) : 1;
  if (p.steps_per_split > 0 && (p.partial == nullptr || p.counters == nullptr)) {
    throw std::logic_error("gemm_prefill: a split K needs its partials and counters");
  }
  if (Shape128::matches(shape)) return Shape128::run(p, epilogue, splits, stream);
  if (Shape64::matches(shape)) return Shape64::run(p, epilogue, splits, stream);
  return Shape32::run(p, epilogue, splits, stream);
}

}  // namespace a2d::cuda
