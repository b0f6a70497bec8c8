// Weight layout conversion on the device: any stored dtype (bf16, f16, f32) to bf16, with the row
// placement the kernels want (q, k, v stacked into one matrix; gate and up interleaved in groups of 8 so
// one GEMM tile holds both halves of SiLU(gate) * up) and, for GEMM weights, the tiled layout below; an FP8
// model's e4m3 GEMM weights keep their bytes, in the FP8 tiled layout, and their fp32 row scales follow the
// same row placement.
#pragma once

#include "common.cuh"
#include "row_placement.h"

namespace a2d::cuda {

enum class SourceType { bf16, f16, f32, f8_e4m3 };

// The row placements (RowPlacement, the rope-pair order the fused RoPE reads) are in row_placement.h.

// The GEMM layout: tiles of 16 rows, each a run of 32-column chunks; a chunk (16 x 32 bf16 = 1 KiB) holds
// rows 0-7 then rows 8-15, and within each half lane g * 4 + c of a warp owns the 8 columns 8c..8c+7 of
// row g. One 16-byte load per lane then reads 512 contiguous bytes per warp, and those 8 values are the
// lane's tensor-core fragment (gemm.cu). Rows pad to 16 and columns to 32 with zeros.
constexpr int64_t kTileRows = 16;
constexpr int64_t kChunkCols = 32;
__host__ __device__ inline int64_t tiled_chunks(int64_t cols) { return (cols + kChunkCols - 1) / kChunkCols; }
__host__ __device__ inline int64_t tiled_elements(int64_t rows, int64_t cols) {
  return (rows + kTileRows - 1) / kTileRows * kTileRows * tiled_chunks(cols) * kChunkCols;
}
__host__ __device__ inline int64_t tiled_index(int64_t row, int64_t col, int64_t cols) {
  const int64_t tile = row / kTileRows, r = row % kTileRows, chunk = col / kChunkCols, c = (col % kChunkCols) / 8;
  return (((tile * tiled_chunks(cols) + chunk) * 2 + r / 8) * 32 + (r % 8) * 4 + c) * 8 + col % 8;
}

// The FP8 GEMM layout: the same tiles and bytes per chunk, a chunk holding 64 columns (16 x 64 e4m3 = 1 KiB):
// rows 0-7 then rows 8-15, and within each half lane g * 4 + c owns 16 bytes of row g, the 8 columns 8c..8c+7
// and then the 8 columns 32+8c..32+8c+7. So one 16-byte load per lane reads 512 contiguous bytes per warp,
// as in the bf16 layout, and its two halves are that lane's fragments of two 32-column steps (gemm.cu).
// Rows pad to 16 and columns to 64 with zeros.
constexpr int64_t kFp8ChunkCols = 64;
__host__ __device__ inline int64_t tiled_fp8_chunks(int64_t cols) { return (cols + kFp8ChunkCols - 1) / kFp8ChunkCols; }
__host__ __device__ inline int64_t tiled_fp8_bytes(int64_t rows, int64_t cols) {
  return (rows + kTileRows - 1) / kTileRows * kTileRows * tiled_fp8_chunks(cols) * kFp8ChunkCols;
}
__host__ __device__ inline int64_t tiled_fp8_index(int64_t row, int64_t col, int64_t cols) {
  const int64_t tile = row / kTileRows, r = row % kTileRows, chunk = col / kFp8ChunkCols, in_chunk = col % kFp8ChunkCols;
  const int64_t half = in_chunk / kChunkCols, c = (in_chunk % kChunkCols) / 8;
  return (((tile * tiled_fp8_chunks(cols) + chunk) * 2 + r / 8) * 32 + (r % 8) * 4 + c) * 16 + half * 8 + col % 8;
}

// `tiled`: write the GEMM layout (destination holds tiled_elements(destination rows, cols)).
void convert_rows(const void* source, SourceType type, int64_t rows, int64_t cols, bf16* destination,
                  RowPlacement placement, bool tiled, cudaStream_t stream);
// e4m3 bytes into the FP8 GEMM layout (destination holds tiled_fp8_bytes(destination rows, cols)), and a
// matrix's fp32 row scales to the rows `placement` gives its rows.
void place_fp8_rows(const void* source, int64_t rows, int64_t cols, uint8_t* destination, RowPlacement placement,
                    cudaStream_t stream);
void place_scales(const void* source, int64_t rows, float* destination, RowPlacement placement, cudaStream_t stream);

}  // namespace a2d::cuda
