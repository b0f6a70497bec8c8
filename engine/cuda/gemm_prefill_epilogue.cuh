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

// Token row t's results v0 (weight row 16 tile + g) and v1 (row + 8), bias included, through the epilogue. The
// caller skips tiles past the matrix and tokens past p.rows.
template <PrefillEpilogue kEpilogue>
__device__ __forceinline__ void prefill_epilogue(const PrefillGemmParams& p, int tile, int g, int t, float v0, float v1) {
  const int row0 = tile * 16 + g, row1 = row0 + 8;  // the weight rows (output columns) of this thread
  if constexpr (kEpilogue == PrefillEpilogue::store_bf16) {
    bf16* out = p.out + static_cast<size_t>(t) * p.out_stride;
    if (row0 < p.n_out) out[row0] = __float2bfloat16(v0);
    if (row1 < p.n_out) out[row1] = __float2bfloat16(v1);
  } else if constexpr (kEpilogue == PrefillEpilogue::residual_add) {
    float* residual = p.residual + static_cast<size_t>(t) * p.out_stride;
    if (row0 < p.n_out) residual[row0] += v0;
    if (row1 < p.n_out) residual[row1] += v1;
  } else if constexpr (kEpilogue == PrefillEpilogue::silu_mul) {
    // Tile rows 0..7 are gate rows 8 tile + g, rows 8..15 the up rows of the same outputs.
    const int out_col = tile * 8 + g;
    if (out_col < p.n_out) {
      p.out[static_cast<size_t>(t) * p.out_stride + out_col] = __float2bfloat16(v0 / (1.f + __expf(-v0)) * v1);
    }
  } else {  // rope_qkv
    const int first_row = tile * 16;
    const int head = first_row / p.head_dim;
    const int pair_tile = first_row % p.head_dim / 16;
    // The row's position (its cache row and RoPE angle) and its sequence's KV slot.
    int slot = p.cached + t;
    size_t slot_offset = 0;
    if (p.state != nullptr) {
      if (t >= p.state->rows) return;
      slot = row_position(*p.state, t);
      slot_offset = static_cast<size_t>(entry_view(*p.state, row_entry(*p.state, t)).slot) * p.kv_slot_stride;
    }
    if (head < p.num_heads + p.num_kv_heads) {
      // Rows g and g + 8 are dims i = 8 pair_tile + g and i + half of one q or k head (the rope-pair
      // order of row_placement.h, in which the upload placed them).
      const int half = p.head_dim / 2;
      const int dim = rope_pair_dim(first_row % p.head_dim + g, half);
      const float2 cs = p.rope_table[static_cast<size_t>(slot) * half + dim];
      bf16* out = head < p.num_heads
                      ? p.q_out + (static_cast<size_t>(t) * p.num_heads + head) * p.head_dim
                      : p.k_cache + slot_offset + (static_cast<size_t>(head - p.num_heads) * p.max_context + slot) * p.head_dim;
      out[dim] = __float2bfloat16(v0 * cs.x - v1 * cs.y);
      out[dim + half] = __float2bfloat16(v1 * cs.x + v0 * cs.y);
    } else {
      const int kv_head = head - p.num_heads - p.num_kv_heads;
      bf16* out = p.v_cache + slot_offset + (static_cast<size_t>(kv_head) * p.max_context + slot) * p.head_dim + pair_tile * 16;
      out[g] = __float2bfloat16(v0);
      out[g + 8] = __float2bfloat16(v1);
    }
  }
}

}  // namespace a2d::cuda
