// Where the upload puts each stored weight row in the GEMM matrices, and the one definition of the row order
// that the fused RoPE epilogues (GemmEpilogue::rope_qkv in gemm.cu, PrefillEpilogue::rope_qkv in
// gemm_prefill.cu) read. Plain C++ (no CUDA headers), so that the host tests check it without a GPU
// (engine/tests/row_placement_test.cpp); the CUDA code includes it through weights.cuh.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define A2D_HOST_DEVICE __host__ __device__
#else
#define A2D_HOST_DEVICE
#endif

namespace a2d::cuda {

// The rope-pair row order of one q or k head of head_dim = 2 * half rows (half a multiple of 8), the contract
// between the upload and the fused RoPE: GEMM tile j of the head (its rows 16j..16j+15) holds dims 8j..8j+7
// in its rows 0..7 and dims half+8j..half+8j+7 in its rows 8..15. So the rotate-half RoPE pairs (i, i + half)
// sit in one tile, at tile rows r and r + 8, and the epilogue rotates them without leaving the tile.
//
// rope_pair_row: the upload's side, stored row r (head r / head_dim, dim r % head_dim) to its GEMM row.
A2D_HOST_DEVICE inline int64_t rope_pair_row(int64_t r, int64_t half) {
  const int64_t head = r / (2 * half), d = r % (2 * half), dd = d % half;
  return head * 2 * half + dd / 8 * 16 + (d >= half ? 8 : 0) + dd % 8;
}
// rope_pair_dim: the epilogues' side, the dim that row p of a head's rows (0 <= p < 2 * half) holds. The inverse
// of rope_pair_row within a head.
template <typename Int>
A2D_HOST_DEVICE inline Int rope_pair_dim(Int p, Int half) {
  return p / 16 * 8 + (p % 16 >= 8 ? half : 0) + p % 8;
}

// Source row r (counted from the whole tensor's first row, so a tensor can arrive in chunks of rows
// starting at source_row0) goes to destination row (r / group) * group_stride + group_offset + r % group.
// rope_half > 0 first puts the rows of each head of 2 * rope_half rows in rope-pair order (rope_pair_row).
struct RowPlacement {
  int64_t group;
  int64_t group_stride;
  int64_t group_offset;
  int64_t source_row0;
  int64_t rope_half = 0;
};

// The destination row of source row `r` (counted from the tensor's first row).
A2D_HOST_DEVICE inline int64_t placed_row(const RowPlacement& placement, int64_t r) {
  if (placement.rope_half > 0) r = rope_pair_row(r, placement.rope_half);
  return (r / placement.group) * placement.group_stride + placement.group_offset + r % placement.group;
}

inline RowPlacement contiguous_rows(int64_t first_row) { return {int64_t(1) << 40, 0, first_row, 0}; }
inline RowPlacement rope_pair_rows(int64_t first_row, int64_t half) { return {int64_t(1) << 40, 0, first_row, 0, half}; }

// The fused QKV matrix (and its bias): the q heads, then the k heads, then the v heads, each head_dim rows; q and
// k in rope-pair order when the QKV GEMM applies RoPE itself (`rope_pairs`: ModelOptions::fuse_rope where the
// shape allows), which reads a row's head as row / head_dim and its dim as rope_pair_dim(row % head_dim).
enum class QkvPart { q, k, v };
inline RowPlacement qkv_rows(QkvPart part, int64_t heads, int64_t kv_heads, int64_t head_dim, bool rope_pairs) {
  switch (part) {
    case QkvPart::q: return rope_pairs ? rope_pair_rows(0, head_dim / 2) : contiguous_rows(0);
    case QkvPart::k: return rope_pairs ? rope_pair_rows(heads * head_dim, head_dim / 2) : contiguous_rows(heads * head_dim);
    case QkvPart::v: break;
  }
  return contiguous_rows((heads + kv_heads) * head_dim);
}

// The fused gate/up matrix (GemmEpilogue::silu_mul): every 16-row tile holds 8 gate rows, then the 8 up rows of
// the same outputs.
inline RowPlacement gate_up_rows(bool up) { return {8, 16, up ? 8 : 0, 0}; }

}  // namespace a2d::cuda
