// Weight layout conversion on the device: any stored dtype (bf16, f16, f32) to bf16, with the row
// placement the kernels want (q, k, v stacked into one matrix; gate and up interleaved in groups of 8 so
// one GEMM tile holds both halves of SiLU(gate) * up).
#pragma once

#include "common.cuh"

namespace a2d::cuda {

enum class SourceType { bf16, f16, f32 };

// Source row r (counted from the whole tensor's first row, so a tensor can arrive in chunks of rows
// starting at source_row0) goes to destination row (r / group) * group_stride + group_offset + r % group.
struct RowPlacement {
  int64_t group;
  int64_t group_stride;
  int64_t group_offset;
  int64_t source_row0;
};

inline RowPlacement contiguous_rows(int64_t first_row) { return {int64_t(1) << 40, 0, first_row, 0}; }

void convert_rows(const void* source, SourceType type, int64_t rows, int64_t cols, bf16* destination,
                  RowPlacement placement, cudaStream_t stream);

}  // namespace a2d::cuda
