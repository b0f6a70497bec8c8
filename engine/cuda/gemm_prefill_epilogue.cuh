// The prefill GEMMs' epilogue, shared by the mma.sync kernel (gemm_prefill.cu) and the warpgroup kernel
// (gemm_wgmma.cu): both leave a thread holding weight rows g and g + 8 of a 16-row tile for the same token rows
// (the C fragment of mma.m16n8k16, and of each 16-row slab of wgmma.m64nNk16), so the RoPE pairs of the rope-pair
// row order and the gate/up pairs of the SiLU layout meet in one thread.
#pragma once

#include <type_traits>

#include "gemm_prefill.cuh"
#include "row_placement.h"

namespace a2d::cuda {

inline constexpr PrefillEpilogue kPrefillEpilogues[] = {PrefillEpilogue::store_bf16, PrefillEpilogue::silu_mul,
                                                        PrefillEpilogue::residual_add, PrefillEpilogue::rope_qkv};

// Calls f(std::integral_constant<PrefillEpilogue, epilogue>{}): the run-time epilogue as a template argument, for the
// kernels built once per epilogue.
template <typename F>
void with_prefill_epilogue(PrefillEpilogue epilogue, F&& f) {
  using Ep = PrefillEpilogue;
  switch (epilogue) {
    case Ep::store_bf16: return f(std::integral_constant<Ep, Ep::store_bf16>{});
    case Ep::silu_mul: return f(std::integral_constant<Ep, Ep::silu_mul>{});
    case Ep::residual_add: return f(std::integral_constant<Ep, Ep::residual_add>{});
    case Ep::rope_qkv: return f(std::integral_constant<Ep, Ep::rope_qkv>{});
  }
}

// The bias of rows g and g + 8 of weight tile `tile` (zeros without a bias or past the matrix).
__device__ __forceinline__ float2 prefill_tile_bias(const PrefillGemmParams& p, int tile, int g) {
  const int row0 = tile * 16 + g, row1 = row0 + 8;
  return make_float2(p.bias != nullptr && row0 < p.n_rows ? __bfloat162float(p.bias[row0]) : 0.f,
                     p.bias != nullptr && row1 < p.n_rows ? __bfloat162float(p.bias[row1]) : 0.f);
}

// What an epilogue reads before it writes a token row's two results: the residual pair (residual_add), or the
// output pointer and RoPE angle of the row (rope_qkv; out null where the row is past the forward). The reads come
// apart from the writes so that a thread's reads of many token rows are in flight at once: a store may alias any
// later load, so reads interleaved with writes wait out one memory round trip a row (a 128-token block's epilogue
// was two thirds of its GEMM's time at 160 rows).
template <PrefillEpilogue kEpilogue>
struct PrefillReads {};
template <>
struct PrefillReads<PrefillEpilogue::residual_add> {
  float r0, r1;
};
template <>
struct PrefillReads<PrefillEpilogue::rope_qkv> {
  bf16* out;
  float2 cs;
};

// Where token row t's keys, values and RoPE angle go (rope_qkv): its position in its sequence and its KV slot's
// offset; slot -1 where the row is past the forward. Read once a token row (the warpgroup kernel stages a block's
// rows in shared memory before its products), not once a weight-row pair.
struct PrefillToken {
  int slot;
  size_t slot_offset;
};
__device__ __forceinline__ PrefillToken prefill_token(const PrefillGemmParams& p, int t) {
  if (p.state == nullptr) return {p.cached + t, 0};
  if (t >= p.state->rows) return {-1, 0};
  return {row_position(*p.state, t),
          static_cast<size_t>(entry_view(*p.state, row_entry(*p.state, t)).slot) * p.kv_slot_stride};
}

// Token row t's reads for weight rows 16 tile + g and + 8 (the caller skips tiles past the matrix and tokens past
// p.rows); `token`: prefill_token(p, t), used by rope_qkv alone.
template <PrefillEpilogue kEpilogue>
__device__ __forceinline__ PrefillReads<kEpilogue> prefill_epilogue_reads(const PrefillGemmParams& p, int tile, int g, int t,
                                                                          const PrefillToken& token) {
  PrefillReads<kEpilogue> reads{};
  const int row0 = tile * 16 + g, row1 = row0 + 8;
  if constexpr (kEpilogue == PrefillEpilogue::residual_add) {
    const float* residual = p.residual + static_cast<size_t>(t) * p.out_stride;
    reads.r0 = row0 < p.n_out ? residual[row0] : 0.f;
    reads.r1 = row1 < p.n_out ? residual[row1] : 0.f;
  } else if constexpr (kEpilogue == PrefillEpilogue::rope_qkv) {
    if (token.slot < 0) return reads;
    const int first_row = tile * 16;
    const int head = first_row / p.head_dim;
    if (head < p.num_heads + p.num_kv_heads) {
      // Rows g and g + 8 are dims i = 8 pair_tile + g and i + half of one q or k head (the rope-pair order of
      // row_placement.h, in which the upload placed them).
      const int half = p.head_dim / 2;
      reads.cs = p.rope_table[static_cast<size_t>(token.slot) * half + rope_pair_dim(first_row % p.head_dim + g, half)];
      reads.out = head < p.num_heads ? p.q_out + (static_cast<size_t>(t) * p.num_heads + head) * p.head_dim
                                     : p.k_cache + token.slot_offset +
                                           (static_cast<size_t>(head - p.num_heads) * p.max_context + token.slot) * p.head_dim;
    } else {
      const int kv_head = head - p.num_heads - p.num_kv_heads;
      reads.out = p.v_cache + token.slot_offset + (static_cast<size_t>(kv_head) * p.max_context + token.slot) * p.head_dim +
                  first_row % p.head_dim / 16 * 16;
    }
  }
  return reads;
}

// Token row t's results v0 (weight row 16 tile + g) and v1 (row + 8), bias included, through the epilogue, with
// what prefill_epilogue_reads read for it.
template <PrefillEpilogue kEpilogue>
__device__ __forceinline__ void prefill_epilogue_write(const PrefillGemmParams& p, int tile, int g, int t,
                                                       const PrefillReads<kEpilogue>& reads, float v0, float v1) {
  const int row0 = tile * 16 + g, row1 = row0 + 8;  // the weight rows (output columns) of this thread
  if constexpr (kEpilogue == PrefillEpilogue::store_bf16) {
    bf16* out = p.out + static_cast<size_t>(t) * p.out_stride;
    if (row0 < p.n_out) out[row0] = __float2bfloat16(v0);
    if (row1 < p.n_out) out[row1] = __float2bfloat16(v1);
  } else if constexpr (kEpilogue == PrefillEpilogue::residual_add) {
    float* residual = p.residual + static_cast<size_t>(t) * p.out_stride;
    if (row0 < p.n_out) residual[row0] = reads.r0 + v0;
    if (row1 < p.n_out) residual[row1] = reads.r1 + v1;
  } else if constexpr (kEpilogue == PrefillEpilogue::silu_mul) {
    // Tile rows 0..7 are gate rows 8 tile + g, rows 8..15 the up rows of the same outputs.
    const int out_col = tile * 8 + g;
    if (out_col < p.n_out) {
      p.out[static_cast<size_t>(t) * p.out_stride + out_col] = __float2bfloat16(v0 / (1.f + __expf(-v0)) * v1);
    }
  } else {  // rope_qkv
    if (reads.out == nullptr) return;
    const int first_row = tile * 16;
    if (first_row / p.head_dim < p.num_heads + p.num_kv_heads) {
      const int half = p.head_dim / 2;
      const int dim = rope_pair_dim(first_row % p.head_dim + g, half);
      reads.out[dim] = __float2bfloat16(v0 * reads.cs.x - v1 * reads.cs.y);
      reads.out[dim + half] = __float2bfloat16(v1 * reads.cs.x + v0 * reads.cs.y);
    } else {
      reads.out[g] = __float2bfloat16(v0);
      reads.out[g + 8] = __float2bfloat16(v1);
    }
  }
}

// The epilogue of kCount token rows of one thread's tile rows g and g + 8: token(i) is the i-th token row (skipped
// past p.rows), value(i) its two results (float2, bias included), where(t) token row t's prefill_token (rope_qkv). The reads
// of kMaxBatch rows are issued before any of their writes (8; 4 where a thread's registers hold 128 accumulators
// and RoPE's reads would spill).
template <PrefillEpilogue kEpilogue, int kCount, int kMaxBatch = 8, typename Token, typename Value, typename Where>
__device__ __forceinline__ void prefill_epilogue_rows(const PrefillGemmParams& p, int tile, int g, Token&& token, Value&& value,
                                                      Where&& where) {
  constexpr int kBatch = kCount < kMaxBatch ? kCount : kMaxBatch;
  static_assert(kCount % kBatch == 0, "whole batches of token rows");
#pragma unroll
  for (int i0 = 0; i0 < kCount; i0 += kBatch) {
    PrefillReads<kEpilogue> reads[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int t = token(i0 + b);
      if (t < p.rows) {
        PrefillToken token_row{};
        if constexpr (kEpilogue == PrefillEpilogue::rope_qkv) token_row = where(t);
        reads[b] = prefill_epilogue_reads<kEpilogue>(p, tile, g, t, token_row);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int t = token(i0 + b);
      if (t < p.rows) {
        const float2 v = value(i0 + b);
        prefill_epilogue_write<kEpilogue>(p, tile, g, t, reads[b], v.x, v.y);
      }
    }
  }
}

}  // namespace a2d::cuda
