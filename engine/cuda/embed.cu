#include "embed.cuh"

namespace a2d::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) embed_kernel(const EmbedParams p) {
  __shared__ float warp_sums[kThreads / 32];
  wait_for_previous_grid();
  const int t = blockIdx.x;
  if (t >= p.state->rows) return;
  const bf16* row = p.table + static_cast<size_t>(p.state->tokens[t]) * p.hidden;
  float* out = p.residual + static_cast<size_t>(t) * p.hidden;
  float sum = 0.f;
  for (int i = threadIdx.x; i < p.hidden; i += kThreads) {
    const float v = __bfloat162float(row[i]);
    out[i] = v;
    sum += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    p.ssq_out[t] = total;
  }
}

__global__ void __launch_bounds__(kThreads) embed_tokens_kernel(const bf16* table, int hidden, const int32_t* tokens,
                                                                float* residual) {
  const int t = blockIdx.x;
  const bf16* row = table + static_cast<size_t>(tokens[t]) * hidden;
  float* out = residual + static_cast<size_t>(t) * hidden;
  for (int i = threadIdx.x; i < hidden; i += kThreads) out[i] = __bfloat162float(row[i]);
}

}  // namespace

void embed_tokens(const bf16* table, int hidden, const int32_t* tokens, int rows, float* residual, cudaStream_t stream) {
  if (rows <= 0) return;
  launch(embed_tokens_kernel, dim3(rows), dim3(kThreads), 0, stream, false, table, hidden, tokens, residual);
}

void embed(const EmbedParams& params, int max_rows, cudaStream_t stream, bool pdl) {
  launch(embed_kernel, dim3(max_rows), dim3(kThreads), 0, stream, pdl, params);
}

}  // namespace a2d::cuda
