// What the decode attention (attention.cu) and the prefill attention (attention_prefill.cu) share: the tile
// shapes, the ldmatrix fragment loads, Q's fragments and the Q K^T scores of a tile, and one warp's online-softmax step
// over a tile of keys.
#pragma once

#include "common.cuh"

namespace a2d::cuda::attention_tile {

constexpr int kWarps = 4;
constexpr int kTileKeys = 64;
constexpr int kRowsPerBlock = 16 * kWarps;
constexpr int kSmemPad = 8;  // bf16 per smem row: breaks the 8-way bank conflict of ldmatrix on 2^k rows
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// Two stages of a K and a V tile of kTileKeys rows of head_dim kDim.
template <int kDim>
constexpr int smem_bytes() {
  return 2 /*stages*/ * 2 /*K, V*/ * kTileKeys * (kDim + kSmemPad) * 2;
}

// Issues the copy of tile `tile` of this block's keys [key_begin, key_end) of one KV head into stage `stage` (every
// thread of the block takes part; one commit group).
template <int kDim>
__device__ __forceinline__ void load_kv_tile(bf16* smem, const bf16* k_head, const bf16* v_head, int key_begin, int key_end,
                                             int tile, int stage) {
  constexpr int kStride = kDim + kSmemPad;
  bf16* ks = smem + stage * 2 * kTileKeys * kStride;
  bf16* vs = ks + kTileKeys * kStride;
  constexpr int kChunks = kTileKeys * kDim / 8;
  for (int e = threadIdx.x; e < kChunks; e += kWarps * 32) {
    const int key = e / (kDim / 8);
    const int col = (e % (kDim / 8)) * 8;
    const int position = key_begin + tile * kTileKeys + key;
    const bool valid = position < key_end;
    const size_t offset = static_cast<size_t>(valid ? position : 0) * kDim + col;
    cp_async16(ks + key * kStride + col, k_head + offset, valid);
    cp_async16(vs + key * kStride + col, v_head + offset, valid);
  }
  cp_async_commit();
}

// This lane's A fragments of Q for the warp's 16 query rows (rows g and g + 8: q_row[h], zeros where limit[h] < 0),
// kDim / 16 k-steps of 16 dims; c is the lane's column pair.
template <int kDim>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qa)[kDim / 16][4], const bf16* const (&q_row)[2],
                                                 const int (&limit)[2], int c) {
#pragma unroll
  for (int s = 0; s < kDim / 16; ++s) {
    for (int h = 0; h < 2; ++h) {
      const bool valid = limit[h] >= 0;
      const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q_row[h] + 16 * s + 2 * c);
      qa[s][h] = valid ? q32[0] : 0u;
      qa[s][h + 2] = valid ? q32[4] : 0u;
    }
  }
}

// S = Q K^T for the warp's 16 query rows over kKeys keys of the tile at ks (row stride kStride).
template <int kKeys, int kDim, int kStride>
__device__ __forceinline__ void qk_scores(float (&s)[kKeys / 8][4], const uint32_t (&qa)[kDim / 16][4], const bf16* ks,
                                          int lane) {
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int d = 0; d < kDim / 32; ++d) {
      uint32_t b[4];
      ldmatrix_x4(b, ks + (n * 8 + lane % 8) * kStride + 32 * d + 8 * (lane / 8));
      mma_bf16_16816(s[n], qa[2 * d][0], qa[2 * d][1], qa[2 * d][2], qa[2 * d][3], b[0], b[1]);
      mma_bf16_16816(s[n], qa[2 * d + 1][0], qa[2 * d + 1][1], qa[2 * d + 1][2], qa[2 * d + 1][3], b[2], b[3]);
    }
  }
}

// One warp's online-softmax step for its 16 query rows (this lane's rows g and g + 8: index h 0 and 1) over
// kKeys keys: s holds the scores in log2 units, -inf where a key is not visible; m, l and o are the running
// maximum, sum and output. Rescales o by the new maximum, then adds P V with V from the tile at vs (row
// stride kStride). The S accumulators of two key n-tiles are exactly the A fragment of one k-step.
template <int kKeys, int kDim, int kStride>
__device__ __forceinline__ void softmax_accumulate(float (&s)[kKeys / 8][4], float (&m)[2], float (&l)[2],
                                                   float (&o)[kDim / 8][4], const bf16* vs, int lane) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[n][e]);
  }
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    const float m_new = fmaxf(m[h], tile_max[h]);
    // A row with no visible key so far keeps m = -inf; use 0 as the reference so exp2 gives 0, not NaN.
    const float reference = m_new == -INFINITY ? 0.f : m_new;
    alpha[h] = exp2f(m[h] - reference);
    m[h] = m_new;
    l[h] *= alpha[h];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      s[n][2 * h] = exp2f(s[n][2 * h] - reference);
      s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - reference);
      l[h] += s[n][2 * h] + s[n][2 * h + 1];
    }
  }
#pragma unroll
  for (int n = 0; n < kDim / 8; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    const uint32_t a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    const uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    const uint32_t a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int dn = 0; dn < kDim / 16; ++dn) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vs + (16 * kk + lane % 8 + 8 * ((lane / 8) % 2)) * kStride + 16 * dn + 8 * (lane / 16));
      mma_bf16_16816(o[2 * dn], a0, a1, a2, a3, b[0], b[1]);
      mma_bf16_16816(o[2 * dn + 1], a0, a1, a2, a3, b[2], b[3]);
    }
  }
}

// The row sums of the four lanes that hold a row's columns.
__device__ __forceinline__ void reduce_row_sums(float (&l)[2]) {
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
}

}  // namespace a2d::cuda::attention_tile
