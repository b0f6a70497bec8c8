// The CUDA upload's row placement against the row order the GEMM epilogues read (engine/cuda/row_placement.h),
// on the host: the fused RoPE rotates the pair (i, i + half) of a q or k head inside one 16-row tile, so the
// upload must put the head's dims where rope_pair_dim says they are.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "../cuda/row_placement.h"

using namespace a2d::cuda;

namespace {

struct QkvShape {
  int64_t heads, kv_heads, head_dim;
};

// The shapes the engine supports (head_dim 16..256, GQA and MHA).
const QkvShape kShapes[] = {{4, 2, 16}, {8, 2, 32}, {2, 1, 64}, {16, 8, 128}, {3, 3, 256}};

}  // namespace

TEST_CASE("row placement: the fused QKV matrix holds every q, k and v row once, where the RoPE epilogue reads it") {
  for (const QkvShape& s : kShapes) {
    CAPTURE(s.heads);
    CAPTURE(s.head_dim);
    const int64_t D = s.head_dim, half = D / 2;
    std::vector<int> seen((s.heads + 2 * s.kv_heads) * D, 0);
    const struct {
      QkvPart part;
      int64_t heads, first_head;
    } parts[] = {{QkvPart::q, s.heads, 0}, {QkvPart::k, s.kv_heads, s.heads}, {QkvPart::v, s.kv_heads, s.heads + s.kv_heads}};
    for (const auto& part : parts) {
      const RowPlacement placement = qkv_rows(part.part, s.heads, s.kv_heads, D, true);
      for (int64_t r = 0; r < part.heads * D; ++r) {
        CAPTURE(r);
        const int64_t row = placed_row(placement, r);
        REQUIRE(row >= 0);
        REQUIRE(row < static_cast<int64_t>(seen.size()));
        ++seen[row];
        // The epilogue's reading of GEMM row `row`: its head is row / head_dim; a q or k head's dims are in
        // rope-pair order, a v head's in stored order.
        CHECK(row / D == part.first_head + r / D);
        const int64_t dim = part.part == QkvPart::v ? row % D : rope_pair_dim(row % D, half);
        CHECK(dim == r % D);
      }
    }
    for (int count : seen) CHECK(count == 1);
  }
}

TEST_CASE("row placement: each RoPE pair (i, i + half) sits in one 16-row tile, at tile rows r and r + 8") {
  for (const QkvShape& s : kShapes) {
    const int64_t D = s.head_dim, half = D / 2;
    for (int64_t i = 0; i < half; ++i) {
      CAPTURE(D);
      CAPTURE(i);
      const int64_t first = rope_pair_row(i, half), second = rope_pair_row(i + half, half);
      CHECK(first / 16 == second / 16);
      CHECK(first % 16 < 8);
      CHECK(second % 16 == first % 16 + 8);
      // What the epilogue computes for tile j = first / 16, tile row r = first % 16: dims 8j + r and 8j + r + half.
      CHECK(rope_pair_dim(first, half) == first / 16 * 8 + first % 16);
      CHECK(rope_pair_dim(second, half) == rope_pair_dim(first, half) + half);
    }
  }
}

TEST_CASE("row placement: without the fused RoPE, q, k and v are stacked in stored order") {
  const QkvShape s{4, 2, 64};
  for (int64_t r = 0; r < s.heads * s.head_dim; ++r) CHECK(placed_row(qkv_rows(QkvPart::q, 4, 2, 64, false), r) == r);
  for (int64_t r = 0; r < s.kv_heads * s.head_dim; ++r) {
    CHECK(placed_row(qkv_rows(QkvPart::k, 4, 2, 64, false), r) == s.heads * s.head_dim + r);
    CHECK(placed_row(qkv_rows(QkvPart::v, 4, 2, 64, false), r) == (s.heads + s.kv_heads) * s.head_dim + r);
  }
}

TEST_CASE("row placement: gate and up interleave 8 by 8, as the SiLU epilogue reads a tile") {
  // The silu_mul epilogue: output i is tile i / 8, gate at tile row i % 8 and up at tile row 8 + i % 8.
  for (int64_t i = 0; i < 200; ++i) {
    CAPTURE(i);
    CHECK(placed_row(gate_up_rows(false), i) == i / 8 * 16 + i % 8);
    CHECK(placed_row(gate_up_rows(true), i) == i / 8 * 16 + 8 + i % 8);
  }
}
