#include "attention_prefill.cuh"
#include "attention_tile.cuh"

namespace a2d::cuda {
namespace {

using namespace attention_tile;  // attention.cu's tile shapes, fragments and online softmax (one key part)


template <int kDim>
__global__ void __launch_bounds__(kWarps * 32) attention_prefill_kernel(const PrefillAttentionParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  constexpr int kStride = kDim + kSmemPad;
  const int group = p.num_heads / p.num_kv_heads;
  const int rows_valid = p.rows * group;
  // The latest rows first: they see the most keys.
  const int row_block = (gridDim.x - 1 - blockIdx.x) * kRowsPerBlock;
  const int kv_head = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int c = lane % 4;
  const int row0 = row_block + 16 * warp;
  // Keys of the block: up to its last token's position.
  const int last_token = (min(rows_valid, row_block + kRowsPerBlock) - 1) / group;
  const int key_end = p.cached + last_token + 1;

  // The two query rows of this lane and the last key each may see (-1: no row).
  int limit[2];
  const bf16* q_row[2];
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + g + 8 * h;
    const bool valid = r < rows_valid;
    const int t = valid ? r / group : 0;
    limit[h] = valid ? p.cached + t : -1;
    q_row[h] = p.q + (static_cast<size_t>(t) * p.num_heads + kv_head * group + (valid ? r % group : 0)) * kDim;
  }
  uint32_t qa[kDim / 16][4];
  load_q_fragments<kDim>(qa, q_row, limit, c);

  float o[kDim / 8][4];
#pragma unroll
  for (int n = 0; n < kDim / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  const float scale = p.scale * kLog2e;

  const size_t head_offset = static_cast<size_t>(kv_head) * p.max_context * kDim;
  const bf16* k_head = p.k_cache + head_offset;
  const bf16* v_head = p.v_cache + head_offset;
  auto load_tile = [&](int tile, int stage) { load_kv_tile<kDim>(smem, k_head, v_head, 0, key_end, tile, stage); };

  const int tiles = (key_end + kTileKeys - 1) / kTileKeys;
  load_tile(0, 0);
  for (int tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) {
      load_tile(tile + 1, (tile + 1) % 2);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* ks = smem + (tile % 2) * 2 * kTileKeys * kStride;
    const bf16* vs = ks + kTileKeys * kStride;
    const int key0 = tile * kTileKeys;

    float s[kTileKeys / 8][4];
    qk_scores<kTileKeys, kDim, kStride>(s, qa, ks, lane);
    // Scores in log2 units, -inf where the key is not visible; then the online-softmax step (attention_tile.cuh).
#pragma unroll
    for (int n = 0; n < kTileKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const int key = key0 + n * 8 + 2 * c + (e % 2);
        const float v = key <= limit[h] ? s[n][e] * scale : -INFINITY;
        s[n][e] = v;
      }
    }
    softmax_accumulate<kTileKeys, kDim, kStride>(s, m, l, o, vs, lane);
    __syncthreads();
  }
  reduce_row_sums(l);

  for (int h = 0; h < 2; ++h) {
    const int r = row0 + g + 8 * h;
    if (r >= rows_valid) continue;
    const int t = r / group;
    const int head = kv_head * group + r % group;
    bf16* out = p.out + (static_cast<size_t>(t) * p.num_heads + head) * p.head_dim;
    const float inv = 1.f / l[h];
#pragma unroll
    for (int n = 0; n < kDim / 8; ++n) {
      const int d = n * 8 + 2 * c;  // head_dim is even: d < head_dim implies d + 1 < head_dim
      if (d < p.head_dim) {
        *reinterpret_cast<uint32_t*>(out + d) = pack_bf16(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
      }
    }
  }
}

template <int kDim>
void launch_prefill(const PrefillAttentionParams& p, cudaStream_t stream) {
  const int group = p.num_heads / p.num_kv_heads;
  const dim3 grid(ceil_div(p.rows * group, kRowsPerBlock), p.num_kv_heads);
  launch(attention_prefill_kernel<kDim>, grid, dim3(kWarps * 32), smem_bytes<kDim>(), stream, false, p);
}

}  // namespace

void attention_prefill_prepare() {
  A2D_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem_bytes<32>()));
  A2D_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem_bytes<64>()));
  A2D_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem_bytes<128>()));
}

void attention_prefill(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return;
  if (p.head_dim % 2 != 0) throw std::runtime_error("attention_prefill: head_dim must be even");
  switch (p.head_dim_padded) {
    case 32: return launch_prefill<32>(p, stream);
    case 64: return launch_prefill<64>(p, stream);
    case 128: return launch_prefill<128>(p, stream);
    default:
      throw std::runtime_error("the CUDA backend supports head_dim up to 128, got " + std::to_string(p.head_dim));
  }
}

}  // namespace a2d::cuda
