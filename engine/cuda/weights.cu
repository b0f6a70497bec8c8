#include "weights.cuh"

#include <cuda_fp16.h>

namespace a2d::cuda {
namespace {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float(float v) { return v; }

template <typename T>
__global__ void convert_rows_kernel(const T* source, int64_t rows, int64_t cols, bf16* destination,
                                    RowPlacement placement, bool tiled) {
  const int64_t count = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = placement.source_row0 + i / cols;
    if (placement.rope_half > 0) r = rope_pair_row(r, placement.rope_half);
    const int64_t row = (r / placement.group) * placement.group_stride + placement.group_offset + r % placement.group;
    const int64_t col = i % cols;
    destination[tiled ? tiled_index(row, col, cols) : row * cols + col] = __float2bfloat16(to_float(source[i]));
  }
}

}  // namespace

void convert_rows(const void* source, SourceType type, int64_t rows, int64_t cols, bf16* destination,
                  RowPlacement placement, bool tiled, cudaStream_t stream) {
  const dim3 grid(1024), block(256);
  switch (type) {
    case SourceType::bf16:
      convert_rows_kernel<<<grid, block, 0, stream>>>(static_cast<const bf16*>(source), rows, cols, destination,
                                                      placement, tiled);
      break;
    case SourceType::f16:
      convert_rows_kernel<<<grid, block, 0, stream>>>(static_cast<const __half*>(source), rows, cols, destination,
                                                      placement, tiled);
      break;
    case SourceType::f32:
      convert_rows_kernel<<<grid, block, 0, stream>>>(static_cast<const float*>(source), rows, cols, destination,
                                                      placement, tiled);
      break;
  }
  A2D_CUDA_CHECK_LAUNCH();
}

}  // namespace a2d::cuda
