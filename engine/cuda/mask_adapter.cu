#include "mask_adapter.cuh"

namespace a2d::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// One block per row: the RMSNorm scale (for a residual input), then each warp a share of the rank.
__global__ void __launch_bounds__(kThreads) mask_adapter_kernel(const MaskAdapterParams p) {
  __shared__ float warp_sums[kWarps];
  wait_for_previous_grid();
  const int row = blockIdx.x;
  const StepState& st = *p.state;
  if (row >= st.rows) return;
  float* t = p.t + static_cast<size_t>(row) * p.rank;
  if (row < st.commit || st.tokens[row] != p.mask_token_id) {
    for (int i = threadIdx.x; i < p.rank; i += kThreads) t[i] = 0.f;
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // One of the two inputs is given (MaskAdapterParams): offset only that one.
  const float* residual = p.residual_in != nullptr ? p.residual_in + static_cast<size_t>(row) * p.x_stride : nullptr;
  const bf16* x = p.x != nullptr ? p.x + static_cast<size_t>(row) * p.x_stride : nullptr;
  float scale = 1.f;
  if (residual != nullptr) {
    float sum = 0.f;
    for (int k = threadIdx.x; k < p.k; k += kThreads) sum += residual[k] * residual[k];
    sum = warp_sum(sum);
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
    scale = rsqrtf(total / static_cast<float>(p.k) + p.norm_eps);
  }
  for (int i = warp; i < p.rank; i += kWarps) {
    const bf16* a = p.a + static_cast<size_t>(i) * p.k;
    float sum = 0.f;
    for (int k = lane; k < p.k; k += 32) {
      // The input value exactly as the GEMM multiplies it (gemm.cu, load_input_row).
      const float v = residual != nullptr
                          ? __bfloat162float(__float2bfloat16(residual[k] * scale * __bfloat162float(p.norm_weight[k])))
                          : __bfloat162float(x[k]);
      sum += __bfloat162float(a[k]) * v;
    }
    sum = warp_sum(sum);
    if (lane == 0) t[i] = sum;
  }
}

}  // namespace

void mask_adapter_down(const MaskAdapterParams& params, int max_rows, cudaStream_t stream, bool pdl) {
  launch(mask_adapter_kernel, dim3(max_rows), dim3(kThreads), 0, stream, pdl, params);
}

}  // namespace a2d::cuda
