#include "gemm.cuh"

#include <algorithm>

namespace a2d::cuda {
namespace {

// The k-permutation that makes both operands 16-byte loads: lane (g, c) holds 8 consecutive k of its
// weight rows g and g+8 (the tiled layout of weights.cuh) and loads the same 8 k of its token row g,
// starting at chunk*32 + 8c. Those 8 values fill the fragment slots {2c, 2c+1, 2c+8, 2c+9} of two
// consecutive mma k-steps (first 4, then 4). Both operands are permuted the same way, so the dot
// product is unchanged.

template <GemmInput kInput>
__device__ __forceinline__ uint4 load_input_row(const GemmParams& p, int input_row, int k, float scale) {
  if (k >= p.k) return make_uint4(0, 0, 0, 0);
  if constexpr (kInput == GemmInput::bf16_rows) {
    return __ldg(reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(input_row) * p.x_stride + k));
  } else {
    const float4* h = reinterpret_cast<const float4*>(p.residual_in + static_cast<size_t>(input_row) * p.x_stride + k);
    const float4 h0 = __ldg(h);
    const float4 h1 = __ldg(h + 1);
    const uint4 gamma = __ldg(reinterpret_cast<const uint4*>(p.norm_weight + k));
    const float2 w0 = unpack_bf16(gamma.x), w1 = unpack_bf16(gamma.y), w2 = unpack_bf16(gamma.z),
                 w3 = unpack_bf16(gamma.w);
    return make_uint4(pack_bf16(h0.x * scale * w0.x, h0.y * scale * w0.y),
                      pack_bf16(h0.z * scale * w1.x, h0.w * scale * w1.y),
                      pack_bf16(h1.x * scale * w2.x, h1.y * scale * w2.y),
                      pack_bf16(h1.z * scale * w3.x, h1.w * scale * w3.y));
  }
}

constexpr int kChunkElements = kGemmTileRows * 32;  // one 32-column chunk of a tile: 1 KiB

// One block: one 16-row tile of the weight over its split's K range, which is contiguous in the tiled
// layout. The 8 warps take interleaved chunks; each lane keeps kLoads pairs of 16-byte weight loads in
// flight (every warp load instruction reads 512 contiguous bytes), then multiplies them with the
// matching input fragments. (A cp.async shared-memory ring measured slower: bench/NOTES.md.)
template <int kTiles, GemmInput kInput, GemmEpilogue kEpilogue, int kLoads>
__global__ void __launch_bounds__(kGemmWarps * 32) gemm_kernel(const GemmParams p) {
  constexpr int kCols = kTiles * 8;
  __shared__ float partial[kGemmWarps][kGemmTileRows][kCols + 1];
  __shared__ float row_scale[kCols];
  __shared__ bool last_block;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int c = lane % 4;
  const int tile = blockIdx.x;
  const int chunks = (p.k + 31) / 32;
  const int chunk_begin = blockIdx.y * p.chunks_per_split;
  const int chunk_end = min(chunks, chunk_begin + p.chunks_per_split);
  const bf16* tile_weights = p.weight + static_cast<size_t>(tile) * chunks * kChunkElements + lane * 8;

  uint4 wa[kLoads], wb[kLoads];
  auto load_weights = [&](int base) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int chunk = base + u * kGemmWarps + warp;
      if (chunk < chunk_end) {
        const bf16* w = tile_weights + static_cast<size_t>(chunk) * kChunkElements;
        wa[u] = load_stream16(w);
        wb[u] = load_stream16(w + kChunkElements / 2);
      } else {
        wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  // The weights do not depend on earlier kernels: start streaming them before waiting. Nor does the
  // row count: the host wrote the step state before the forward's first kernel.
  load_weights(chunk_begin);
  const int rows = kEpilogue == GemmEpilogue::logits ? p.state->logit_count : p.state->rows;
  wait_for_previous_grid();
  if (rows <= 0) return;
  auto input_row = [&](int t) { return p.use_row_map ? p.state->logit_rows[t] : t; };
  if constexpr (kInput == GemmInput::rmsnorm_residual) {
    // One warp per row: the producer's per-tile partial sums of squares, summed across the lanes.
    for (int t = warp; t < min(rows, kCols); t += kGemmWarps) {
      const int r = input_row(t);
      float sum = 0.f;
      for (int part = lane; part < p.ssq_in_parts; part += 32) sum += p.ssq_in[part * kMaxRows + r];
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (lane == 0) row_scale[t] = rsqrtf(sum / static_cast<float>(p.k) + p.norm_eps);
    }
    __syncthreads();
  }

  float acc[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int base = chunk_begin; base < chunk_end; base += kLoads * kGemmWarps) {
    if (base > chunk_begin) load_weights(base);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int chunk = base + u * kGemmWarps + warp;
      if (chunk >= chunk_end) break;
      const int k = chunk * 32 + c * 8;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        if (j * 8 >= rows) break;
        const int t = min(j * 8 + g, rows - 1);
        const float scale = kInput == GemmInput::rmsnorm_residual ? row_scale[t] : 1.f;
        const uint4 xv = load_input_row<kInput>(p, input_row(t), k, scale);
        mma_bf16_16816(acc[j], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv.x, xv.y);
        mma_bf16_16816(acc[j], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv.z, xv.w);
      }
    }
  }
  allow_next_grid();

  // Split-K reduction across the 8 warps through shared memory.
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    partial[warp][g][j * 8 + 2 * c] = acc[j][0];
    partial[warp][g][j * 8 + 2 * c + 1] = acc[j][1];
    partial[warp][g + 8][j * 8 + 2 * c] = acc[j][2];
    partial[warp][g + 8][j * 8 + 2 * c + 1] = acc[j][3];
  }
  __syncthreads();
  const int active_cols = min(rows, kCols);
  for (int e = threadIdx.x; e < kGemmTileRows * active_cols; e += blockDim.x) {
    const int r = e % kGemmTileRows;
    const int t = e / kGemmTileRows;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kGemmWarps; ++w) sum += partial[w][r][t];
    partial[0][r][t] = sum;
  }

  // Split K across blocks: publish this block's tile; the last block of the tile sums all of them in
  // split order (the same result whichever block arrives last) and goes on to the epilogue.
  if (p.splits > 1) {
    float* tile_partials = p.split_partials + static_cast<size_t>(tile) * p.splits * kMaxRows * kGemmTileRows;
    float* mine = tile_partials + static_cast<size_t>(blockIdx.y) * kMaxRows * kGemmTileRows;
    for (int e = threadIdx.x; e < kGemmTileRows * active_cols; e += blockDim.x) mine[e] = partial[0][e % kGemmTileRows][e / kGemmTileRows];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last_block = atomicAdd(&p.split_counters[tile], 1u) == static_cast<unsigned>(p.splits - 1);
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    for (int e = threadIdx.x; e < kGemmTileRows * active_cols; e += blockDim.x) {
      float sum = 0.f;
      for (int split = 0; split < p.splits; ++split) sum += __ldcg(tile_partials + static_cast<size_t>(split) * kMaxRows * kGemmTileRows + e);
      partial[0][e % kGemmTileRows][e / kGemmTileRows] = sum;
    }
    if (threadIdx.x == 0) p.split_counters[tile] = 0;
  }
  if (p.bias != nullptr) {
    __syncthreads();
    for (int e = threadIdx.x; e < kGemmTileRows * active_cols; e += blockDim.x) {
      const int r = e % kGemmTileRows;
      const int row = tile * kGemmTileRows + r;
      if (row < p.n_rows) partial[0][r][e / kGemmTileRows] += __bfloat162float(p.bias[row]);
    }
  }
  __syncthreads();

  if constexpr (kEpilogue == GemmEpilogue::store_bf16) {
    for (int e = threadIdx.x; e < kGemmTileRows * active_cols; e += blockDim.x) {
      const int r = e % kGemmTileRows, t = e / kGemmTileRows;
      const int row = tile * kGemmTileRows + r;
      if (row < p.n_out) p.out[static_cast<size_t>(t) * p.out_stride + row] = __float2bfloat16(partial[0][r][t]);
    }
  } else if constexpr (kEpilogue == GemmEpilogue::silu_mul) {
    // Tile rows 0..7 are gate rows i..i+7 and rows 8..15 the up rows of the same i.
    for (int e = threadIdx.x; e < 8 * active_cols; e += blockDim.x) {
      const int r = e % 8, t = e / 8;
      const int i = tile * 8 + r;
      if (i < p.n_out) {
        const float gate = partial[0][r][t];
        const float up = partial[0][r + 8][t];
        p.out[static_cast<size_t>(t) * p.out_stride + i] = __float2bfloat16(gate / (1.f + __expf(-gate)) * up);
      }
    }
  } else if constexpr (kEpilogue == GemmEpilogue::residual_add) {
    for (int e = threadIdx.x; e < kGemmTileRows * active_cols; e += blockDim.x) {
      const int r = e % kGemmTileRows, t = e / kGemmTileRows;
      const int row = tile * kGemmTileRows + r;
      float square = 0.f;
      if (row < p.n_out) {
        float* h = p.residual_out + static_cast<size_t>(t) * p.out_stride + row;
        const float v = *h + partial[0][r][t];
        *h = v;
        square = v * v;
      }
      partial[1][r][t] = square;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < active_cols; t += blockDim.x) {
      float sum = 0.f;
#pragma unroll
      for (int r = 0; r < kGemmTileRows; ++r) sum += partial[1][r][t];
      p.ssq_out[tile * kMaxRows + t] = sum;
    }
  } else if constexpr (kEpilogue == GemmEpilogue::rope_qkv) {
    const int first_row = tile * kGemmTileRows;
    const int head = first_row / p.head_dim;
    const int j = first_row % p.head_dim / kGemmTileRows;
    const int cached = p.state->cached;
    if (head < p.num_heads + p.num_kv_heads) {
      // Tile rows r and r + 8 are the dims i = 8j + r and i + half of one q or k head.
      const int half = p.head_dim / 2;
      for (int e = threadIdx.x; e < 8 * active_cols; e += blockDim.x) {
        const int r = e % 8, t = e / 8;
        const int i = 8 * j + r;
        const int position = cached + t;
        const float x1 = partial[0][r][t], x2 = partial[0][r + 8][t];
        const float2 cs = p.rope_table[static_cast<size_t>(position) * half + i];
        bf16* out = head < p.num_heads
                        ? p.q_out + (static_cast<size_t>(t) * p.num_heads + head) * p.head_dim
                        : p.k_cache + (static_cast<size_t>(head - p.num_heads) * p.max_context + position) * p.head_dim;
        out[i] = __float2bfloat16(x1 * cs.x - x2 * cs.y);
        out[i + half] = __float2bfloat16(x2 * cs.x + x1 * cs.y);
      }
    } else {
      const int kv_head = head - p.num_heads - p.num_kv_heads;
      for (int e = threadIdx.x; e < kGemmTileRows * active_cols; e += blockDim.x) {
        const int r = e % kGemmTileRows, t = e / kGemmTileRows;
        p.v_cache[(static_cast<size_t>(kv_head) * p.max_context + cached + t) * p.head_dim + j * kGemmTileRows + r] =
            __float2bfloat16(partial[0][r][t]);
      }
    }
  } else {
    if (p.state->write_logits) {
      for (int e = threadIdx.x; e < kGemmTileRows * active_cols; e += blockDim.x) {
        const int r = e % kGemmTileRows, t = e / kGemmTileRows;
        const int row = tile * kGemmTileRows + r;
        if (row < p.n_out) p.logits[static_cast<size_t>(t) * p.out_stride + row] = partial[0][r][t];
      }
    }
    for (int t = threadIdx.x; t < active_cols; t += blockDim.x) {
      float best = -INFINITY;
      int index = -1;
      for (int r = 0; r < kGemmTileRows; ++r) {
        const int row = tile * kGemmTileRows + r;
        if (row < p.n_out && row != p.mask_token_id && partial[0][r][t] > best) {
          best = partial[0][r][t];
          index = row;
        }
      }
      float sum = 0.f;
      for (int r = 0; r < kGemmTileRows; ++r) {
        const int row = tile * kGemmTileRows + r;
        if (row < p.n_out && row != p.mask_token_id) sum += __expf(partial[0][r][t] - best);
      }
      p.argmax_out[tile * kMaxRows + t] = ArgmaxPartial{best, index < 0 ? 0.f : sum, index};
    }
  }
}

template <int kTiles, int kLoads>
void launch_gemm(const GemmParams& params, GemmInput input, GemmEpilogue epilogue, cudaStream_t stream, bool pdl) {
  const dim3 grid(ceil_div(params.n_rows, kGemmTileRows), params.splits);
  const dim3 block(kGemmWarps * 32);
  using In = GemmInput;
  using Ep = GemmEpilogue;
  if (input == In::rmsnorm_residual && epilogue == Ep::store_bf16) {
    launch(gemm_kernel<kTiles, In::rmsnorm_residual, Ep::store_bf16, kLoads>, grid, block, 0, stream, pdl, params);
  } else if (input == In::rmsnorm_residual && epilogue == Ep::silu_mul) {
    launch(gemm_kernel<kTiles, In::rmsnorm_residual, Ep::silu_mul, kLoads>, grid, block, 0, stream, pdl, params);
  } else if (input == In::rmsnorm_residual && epilogue == Ep::rope_qkv) {
    launch(gemm_kernel<kTiles, In::rmsnorm_residual, Ep::rope_qkv, kLoads>, grid, block, 0, stream, pdl, params);
  } else if (input == In::rmsnorm_residual && epilogue == Ep::logits) {
    launch(gemm_kernel<kTiles, In::rmsnorm_residual, Ep::logits, kLoads>, grid, block, 0, stream, pdl, params);
  } else if (input == In::bf16_rows && epilogue == Ep::residual_add) {
    launch(gemm_kernel<kTiles, In::bf16_rows, Ep::residual_add, kLoads>, grid, block, 0, stream, pdl, params);
  } else if (input == In::bf16_rows && epilogue == Ep::store_bf16) {
    launch(gemm_kernel<kTiles, In::bf16_rows, Ep::store_bf16, kLoads>, grid, block, 0, stream, pdl, params);
  } else {
    throw std::runtime_error("gemm: unsupported input/epilogue combination");
  }
}

}  // namespace

GemmSplit gemm_split(int n_rows, int k, const GemmTuning& tuning) {
  const int chunks = ceil_div(k, 32);
  const int round = tuning.loads * kGemmWarps;  // chunks one block streams per round of loads
  const int rounds = ceil_div(chunks, round);
  const int tiles = ceil_div(n_rows, kGemmTileRows);
  const int splits = tuning.blocks_per_sm <= 0 ? 1 : std::min(rounds, ceil_div(tuning.blocks_per_sm * tuning.sm_count, tiles));
  if (splits <= 1) return {1, chunks};
  // Whole rounds per split, and no empty split.
  const int per_split = ceil_div(rounds, splits) * round;
  return {ceil_div(chunks, per_split), per_split};
}

template <int kLoads>
void dispatch_rows(const GemmParams& p, GemmInput input, GemmEpilogue epilogue, int max_rows, cudaStream_t stream,
                   bool pdl) {
  switch (ceil_div(max_rows, 8)) {
    case 1: return launch_gemm<1, kLoads>(p, input, epilogue, stream, pdl);
    case 2: return launch_gemm<2, kLoads>(p, input, epilogue, stream, pdl);
    case 3: return launch_gemm<3, kLoads>(p, input, epilogue, stream, pdl);
    case 4: return launch_gemm<4, kLoads>(p, input, epilogue, stream, pdl);
    case 5: return launch_gemm<5, kLoads>(p, input, epilogue, stream, pdl);
    case 6: return launch_gemm<6, kLoads>(p, input, epilogue, stream, pdl);
    case 7: return launch_gemm<7, kLoads>(p, input, epilogue, stream, pdl);
    default: return launch_gemm<8, kLoads>(p, input, epilogue, stream, pdl);
  }
}

void gemm(const GemmParams& params, GemmInput input, GemmEpilogue epilogue, int max_rows, const GemmTuning& tuning,
          cudaStream_t stream, bool pdl) {
  if (params.k % 8 != 0) throw std::runtime_error("gemm: k must be a multiple of 8, got " + std::to_string(params.k));
  if (max_rows < 1 || max_rows > kMaxRows) throw std::runtime_error("gemm: max_rows out of range");
  GemmParams p = params;
  const GemmSplit split = gemm_split(p.n_rows, p.k, tuning);
  p.splits = split.splits;
  p.chunks_per_split = split.chunks_per_split;
  if (p.splits > 1 && (p.split_partials == nullptr || p.split_counters == nullptr)) {
    throw std::logic_error("gemm: split K without scratch");
  }
  switch (tuning.loads) {
    case 4: return dispatch_rows<4>(p, input, epilogue, max_rows, stream, pdl);
    case 8: return dispatch_rows<8>(p, input, epilogue, max_rows, stream, pdl);
    default: throw std::runtime_error("gemm: loads must be 4 or 8");
  }
}

}  // namespace a2d::cuda
