#include "rope.cuh"

#include <cmath>
#include <vector>

namespace a2d::cuda {
namespace {

constexpr int kWarps = 4;
// A warp holds one head in registers: up to 32 lanes x 8 values.
constexpr int kMaxHeadDim = 256;

__global__ void __launch_bounds__(kWarps * 32) rope_kernel(const RopeParams p) {
  const int heads = p.num_heads + 2 * p.num_kv_heads;
  const int item = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int t = item / heads;
  const int head = item % heads;
  const int rows = p.state->rows;  // from the host, not from the previous kernel
  wait_for_previous_grid();
  if (t >= rows) return;
  const EntryView entry = entry_view(*p.state, row_entry(*p.state, t));
  const int position = entry.cached + t - entry.row0;  // its RoPE position and its k and v place in its slot's cache
  const int half = p.head_dim / 2;
  const bf16* in = p.qkv + static_cast<size_t>(t) * heads * p.head_dim + static_cast<size_t>(head) * p.head_dim;

  const bool is_q = head < p.num_heads;
  const bool is_v = head >= p.num_heads + p.num_kv_heads;
  bf16* out;
  if (is_q) {
    out = p.q_out + (static_cast<size_t>(t) * p.num_heads + head) * p.head_dim_padded;
  } else {
    const int kv_head = is_v ? head - p.num_heads - p.num_kv_heads : head - p.num_heads;
    bf16* cache = (is_v ? p.v_cache : p.k_cache) + entry.slot * p.kv_slot_stride;
    out = cache + (static_cast<size_t>(kv_head) * p.max_context + position) * p.head_dim_padded;
  }

  // Lane l owns the pairs (i, i + half) for i = l, l + 32, ...
  float x1[kMaxHeadDim / 64], x2[kMaxHeadDim / 64];
  float sum = 0.f;
#pragma unroll
  for (int s = 0; s < kMaxHeadDim / 64; ++s) {
    const int i = lane + 32 * s;
    x1[s] = i < half ? __bfloat162float(in[i]) : 0.f;
    x2[s] = i < half ? __bfloat162float(in[i + half]) : 0.f;
    sum += x1[s] * x1[s] + x2[s] * x2[s];
  }
  const bf16* norm = is_q ? p.q_norm : (is_v ? nullptr : p.k_norm);
  if (norm != nullptr) {
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float scale = rsqrtf(sum / static_cast<float>(p.head_dim) + p.norm_eps);
#pragma unroll
    for (int s = 0; s < kMaxHeadDim / 64; ++s) {
      const int i = lane + 32 * s;
      if (i < half) {
        x1[s] *= scale * __bfloat162float(norm[i]);
        x2[s] *= scale * __bfloat162float(norm[i + half]);
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kMaxHeadDim / 64; ++s) {
    const int i = lane + 32 * s;
    if (i >= half) continue;
    float y1 = x1[s], y2 = x2[s];
    if (!is_v) {
      const float2 cs = p.rope_table[static_cast<size_t>(position) * half + i];
      y1 = x1[s] * cs.x - x2[s] * cs.y;
      y2 = x2[s] * cs.x + x1[s] * cs.y;
    }
    out[i] = __float2bfloat16(y1);
    out[i + half] = __float2bfloat16(y2);
  }
  for (int d = p.head_dim + lane; d < p.head_dim_padded; d += 32) out[d] = __float2bfloat16(0.f);
}

__global__ void rope_table_kernel(float2* table, int max_context, int half, const float* inv_freq) {
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= static_cast<int64_t>(max_context) * half) return;
  const int position = static_cast<int>(index / half);
  const int i = static_cast<int>(index % half);
  // The angle is rounded to fp32 as in the reference; cos and sin of it are then exact to fp32.
  const float angle = static_cast<float>(position) * inv_freq[i];
  table[index] = make_float2(static_cast<float>(cos(static_cast<double>(angle))),
                             static_cast<float>(sin(static_cast<double>(angle))));
}

}  // namespace

void rope(const RopeParams& params, int max_rows, cudaStream_t stream, bool pdl) {
  if (params.head_dim % 2 != 0 || params.head_dim > kMaxHeadDim) {
    throw std::runtime_error("rope: head_dim must be even and at most " + std::to_string(kMaxHeadDim));
  }
  const int items = max_rows * (params.num_heads + 2 * params.num_kv_heads);
  launch(rope_kernel, dim3(ceil_div(items, kWarps)), dim3(kWarps * 32), 0, stream, pdl, params);
}

void fill_rope_table(float2* table, int max_context, int head_dim, double theta, cudaStream_t stream) {
  const int half = head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / head_dim));
  }
  float* device_inv = nullptr;
  A2D_CUDA_CHECK(cudaMallocAsync(&device_inv, half * sizeof(float), stream));
  A2D_CUDA_CHECK(cudaMemcpyAsync(device_inv, inv_freq.data(), half * sizeof(float), cudaMemcpyHostToDevice, stream));
  const int64_t count = static_cast<int64_t>(max_context) * half;
  rope_table_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(table, max_context, half,
                                                                                    device_inv);
  A2D_CUDA_CHECK_LAUNCH();
  A2D_CUDA_CHECK(cudaFreeAsync(device_inv, stream));
  // inv_freq must outlive the asynchronous copy.
  A2D_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace a2d::cuda
