#include "weights.cuh"

#include <cuda_fp16.h>

#include <type_traits>

namespace a2d::cuda {
namespace {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float(float v) { return v; }

// A source value as the destination stores it: float types to bf16; e4m3 bytes and fp32 scales as they are.
template <typename D, typename T>
__device__ __forceinline__ D stored_as(T v) {
  if constexpr (std::is_same_v<D, T>) {
    return v;
  } else {
    return __float2bfloat16(to_float(v));
  }
}

enum class Layout { plain, tiled, tiled_fp8 };

template <typename T, typename D>
__global__ void convert_rows_kernel(const T* source, int64_t rows, int64_t cols, D* destination, RowPlacement placement,
                                    Layout layout) {
  const int64_t count = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = placed_row(placement, placement.source_row0 + i / cols);
    const int64_t col = i % cols;
    const int64_t at = layout == Layout::tiled       ? tiled_index(row, col, cols)
                       : layout == Layout::tiled_fp8 ? tiled_fp8_index(row, col, cols)
                                                     : row * cols + col;
    destination[at] = stored_as<D>(source[i]);
  }
}

}  // namespace

void convert_rows(const void* source, SourceType type, int64_t rows, int64_t cols, bf16* destination,
                  RowPlacement placement, bool tiled, cudaStream_t stream) {
  const dim3 grid(1024), block(256);
  const Layout layout = tiled ? Layout::tiled : Layout::plain;
  switch (type) {
    case SourceType::bf16:
      convert_rows_kernel<<<grid, block, 0, stream>>>(static_cast<const bf16*>(source), rows, cols, destination,
                                                      placement, layout);
      break;
    case SourceType::f16:
      convert_rows_kernel<<<grid, block, 0, stream>>>(static_cast<const __half*>(source), rows, cols, destination,
                                                      placement, layout);
      break;
    case SourceType::f32:
      convert_rows_kernel<<<grid, block, 0, stream>>>(static_cast<const float*>(source), rows, cols, destination,
                                                      placement, layout);
      break;
    case SourceType::f8_e4m3:
      throw std::runtime_error("e4m3 weights go to the FP8 layout (place_fp8_rows), not to bf16");
  }
  A2D_CUDA_CHECK_LAUNCH();
}

void place_fp8_rows(const void* source, int64_t rows, int64_t cols, uint8_t* destination, RowPlacement placement,
                    cudaStream_t stream) {
  convert_rows_kernel<<<1024, 256, 0, stream>>>(static_cast<const uint8_t*>(source), rows, cols, destination, placement,
                                                Layout::tiled_fp8);
  A2D_CUDA_CHECK_LAUNCH();
}

void place_scales(const void* source, int64_t rows, float* destination, RowPlacement placement, cudaStream_t stream) {
  convert_rows_kernel<<<256, 256, 0, stream>>>(static_cast<const float*>(source), rows, 1, destination, placement,
                                               Layout::plain);
  A2D_CUDA_CHECK_LAUNCH();
}

}  // namespace a2d::cuda
