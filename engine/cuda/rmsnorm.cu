#include "rmsnorm.cuh"

namespace a2d::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) rmsnorm_rows_kernel(const RmsNormParams p) {
  __shared__ float scale;
  wait_for_previous_grid();
  const int t = blockIdx.x;
  if (t >= p.state->rows) return;
  if (threadIdx.x < 32) {
    // The partial sums in the order the GEMMs' normalising load sums them (gemm.cu, rmsnorm_row_scales).
    float sum = 0.f;
    for (int part = threadIdx.x; part < p.ssq_in_parts; part += 32) sum += p.ssq_in[part * kMaxRows + t];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x == 0) scale = rsqrtf(sum / static_cast<float>(p.hidden) + p.eps);
  }
  __syncthreads();
  const float s = scale;
  const float4* h = reinterpret_cast<const float4*>(p.residual + static_cast<size_t>(t) * p.hidden);
  const uint4* gamma = reinterpret_cast<const uint4*>(p.weight);
  uint4* out = reinterpret_cast<uint4*>(p.out + static_cast<size_t>(t) * p.hidden);
  for (int i = threadIdx.x; i < p.hidden / 8; i += kThreads) {
    const float4 h0 = h[2 * i], h1 = h[2 * i + 1];
    const uint4 g = gamma[i];
    const float2 w0 = unpack_bf16(g.x), w1 = unpack_bf16(g.y), w2 = unpack_bf16(g.z), w3 = unpack_bf16(g.w);
    out[i] = make_uint4(pack_bf16(h0.x * s * w0.x, h0.y * s * w0.y), pack_bf16(h0.z * s * w1.x, h0.w * s * w1.y),
                        pack_bf16(h1.x * s * w2.x, h1.y * s * w2.y), pack_bf16(h1.z * s * w3.x, h1.w * s * w3.y));
  }
}

__global__ void __launch_bounds__(kThreads) rmsnorm_prefill_kernel(const float* residual, int hidden, const bf16* weight,
                                                                   float eps, bf16* out_rows) {
  __shared__ float warp_sums[kThreads / 32];
  allow_next_grid();  // with PDL (a decode forward on the prefill GEMMs): the next GEMM copies its weights meanwhile
  wait_for_previous_grid();
  const int t = blockIdx.x;
  const float4* h = reinterpret_cast<const float4*>(residual + static_cast<size_t>(t) * hidden);
  float sum = 0.f;
  for (int i = threadIdx.x; i < hidden / 4; i += kThreads) {
    const float4 v = h[i];
    sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  const float s = rsqrtf(total / static_cast<float>(hidden) + eps);
  const uint4* gamma = reinterpret_cast<const uint4*>(weight);
  uint4* out = reinterpret_cast<uint4*>(out_rows + static_cast<size_t>(t) * hidden);
  for (int i = threadIdx.x; i < hidden / 8; i += kThreads) {
    const float4 h0 = h[2 * i], h1 = h[2 * i + 1];
    const uint4 g = gamma[i];
    const float2 w0 = unpack_bf16(g.x), w1 = unpack_bf16(g.y), w2 = unpack_bf16(g.z), w3 = unpack_bf16(g.w);
    out[i] = make_uint4(pack_bf16(h0.x * s * w0.x, h0.y * s * w0.y), pack_bf16(h0.z * s * w1.x, h0.w * s * w1.y),
                        pack_bf16(h1.x * s * w2.x, h1.y * s * w2.y), pack_bf16(h1.z * s * w3.x, h1.w * s * w3.y));
  }
}

}  // namespace

void rmsnorm_prefill(const float* residual, int hidden, const bf16* weight, float eps, int rows, bf16* out,
                     cudaStream_t stream, bool pdl) {
  if (hidden % 8 != 0) throw std::runtime_error("rmsnorm_prefill: hidden must be a multiple of 8");
  if (rows <= 0) return;
  launch(rmsnorm_prefill_kernel, dim3(rows), dim3(kThreads), 0, stream, pdl, residual, hidden, weight, eps, out);
}

void rmsnorm_rows(const RmsNormParams& params, int max_rows, cudaStream_t stream, bool pdl) {
  if (params.hidden % 8 != 0) throw std::runtime_error("rmsnorm_rows: hidden must be a multiple of 8");
  launch(rmsnorm_rows_kernel, dim3(max_rows), dim3(kThreads), 0, stream, pdl, params);
}

}  // namespace a2d::cuda
