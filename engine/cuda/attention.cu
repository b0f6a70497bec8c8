#include "attention.cuh"

#include <algorithm>
#include <type_traits>

#include "attention_tile.cuh"

namespace a2d::cuda {
namespace {

using namespace attention_tile;
static_assert(kRowsPerBlock == kAttentionRowsPerBlock, "the host cuts a forward's query rows into blocks of this size");

// Keys per split and the number of splits that hold keys; the combine kernel recomputes the same.
struct SplitPlan {
  int chunk;
  int active;
};
__device__ __forceinline__ SplitPlan plan_splits(int kv_total, int max_splits) {
  int chunk = (kv_total + max_splits - 1) / max_splits;
  chunk = max(kTileKeys, (chunk + kTileKeys - 1) / kTileKeys * kTileKeys);
  return {chunk, (kv_total + chunk - 1) / chunk};
}

// AttentionParams::early_trigger for this launch (the same answer in every block: a forward of several sequences,
// whose blocks plan their splits apart, takes short_kv as never).
__device__ __forceinline__ bool early_trigger(const AttentionParams& p, const StepState& st, const SplitPlan& plan) {
  return p.early_trigger == AttentionTrigger::always ||
         (p.early_trigger == AttentionTrigger::short_kv && st.entries <= 1 && 4 * plan.active <= p.max_splits);
}

// One KV head's keys and values in the cache of the entry's slot.
__device__ __forceinline__ size_t kv_head_offset(const AttentionParams& p, const EntryView& entry, int kv_head, int dim) {
  return entry.slot * p.kv_slot_stride + static_cast<size_t>(kv_head) * p.max_context * dim;
}

// One warp's share of the block: query rows [row0, row0 + 16) against `kKeys` keys of each tile
// starting at key offset `key_offset` within the tile. kParts warps share a row tile and split its keys. Every
// row is one of sequence `entry`'s (rows_valid: the end of its query rows), and its keys are in that one's slot.
// first_issued: the block has already issued tile 0's copy (prefetch_cached).
template <int kDim, int kParts>
__device__ void attention_rows(const AttentionParams& p, bf16* smem, const EntryView& entry, int kv_head, int split,
                               int row0, int key_part, int key_begin, int key_end, int rows_valid, int group,
                               bool first_issued) {
  constexpr int kKeys = kTileKeys / kParts;
  constexpr int kStride = kDim + kSmemPad;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int c = lane % 4;
  const StepState& st = *p.state;
  const int kv_total = entry.cached + entry.rows;

  // The two query rows of this lane and the last key position each may see.
  int limit[2];
  bool skip_masked[2];  // a row adapter's revealed row: also skips window keys that hold the mask token
  const bf16* q_row[2];
  const int window_key0 = entry.cached + entry.commit;
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + g + 8 * h;
    const bool valid = r < rows_valid;
    const int t = valid ? r / group : entry.row0;  // the token row, and its place in its sequence's forward
    const int own = t - entry.row0;
    skip_masked[h] = valid && p.revealed_rule_mask_token >= 0 && own >= entry.commit &&
                     st.tokens[t] != p.revealed_rule_mask_token;
    limit[h] = !valid ? -1
                      : (own < entry.commit || (skip_masked[h] && p.revealed_rule_causal) ? entry.cached + own : kv_total - 1);
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

  const size_t head_offset = kv_head_offset(p, entry, kv_head, kDim);
  const bf16* k_head = p.k_cache + head_offset;
  const bf16* v_head = p.v_cache + head_offset;
  auto load_tile = [&](int tile, int stage) { load_kv_tile<kDim>(smem, k_head, v_head, key_begin, key_end, tile, stage); };

  const int tiles = (key_end - key_begin + kTileKeys - 1) / kTileKeys;
  if (!first_issued) load_tile(0, 0);
  for (int tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) {
      load_tile(tile + 1, (tile + 1) % 2);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* ks = smem + (tile % 2) * 2 * kTileKeys * kStride + key_part * kKeys * kStride;
    const bf16* vs = smem + (tile % 2) * 2 * kTileKeys * kStride + kTileKeys * kStride + key_part * kKeys * kStride;
    const int key0 = key_begin + tile * kTileKeys + key_part * kKeys;

    float s[kKeys / 8][4];
    qk_scores<kKeys, kDim, kStride>(s, qa, ks, lane);
    // Scores in log2 units, -inf where the key is not visible; then the online-softmax step (attention_tile.cuh).
    // Most tiles are wholly visible to every row of the warp (all but a split's last tile, and the window's only
    // for rows that see it all): those skip the per-key test. A row past the forward's (limit -1) is never written.
    const int tile_last = key0 + kKeys - 1;
    bool whole = tile_last < key_end;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      whole = whole && (limit[h] < 0 || (tile_last <= limit[h] && (!skip_masked[h] || tile_last < window_key0)));
    }
    if (__all_sync(0xffffffffu, whole)) {
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= scale;
      }
    } else {
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          const int key = key0 + n * 8 + 2 * c + (e % 2);
          bool visible = key <= limit[h] && key < key_end;
          if (skip_masked[h] && visible && key >= window_key0) {
            visible = st.tokens[entry.row0 + key - entry.cached] != p.revealed_rule_mask_token;
          }
          const float v = visible ? s[n][e] * scale : -INFINITY;
          s[n][e] = v;
        }
      }
    }
    softmax_accumulate<kKeys, kDim, kStride>(s, m, l, o, vs, lane);
    __syncthreads();
  }
  reduce_row_sums(l);

  // Merge the key parts of this row tile through shared memory (the tile buffers are free now).
  if constexpr (kParts > 1) {
    float* merge_o = reinterpret_cast<float*>(smem);  // [kWarps][16][kDim]
    float2* merge_ml = reinterpret_cast<float2*>(merge_o + kWarps * 16 * kDim);  // [kWarps][16]
    const int warp = threadIdx.x / 32;
    float* mine = merge_o + warp * 16 * kDim;
#pragma unroll
    for (int n = 0; n < kDim / 8; ++n) {
      *reinterpret_cast<float2*>(mine + g * kDim + n * 8 + 2 * c) = make_float2(o[n][0], o[n][1]);
      *reinterpret_cast<float2*>(mine + (g + 8) * kDim + n * 8 + 2 * c) = make_float2(o[n][2], o[n][3]);
    }
    if (c == 0) {
      merge_ml[warp * 16 + g] = make_float2(m[0], l[0]);
      merge_ml[warp * 16 + g + 8] = make_float2(m[1], l[1]);
    }
    __syncthreads();
    if (key_part != 0) return;
    for (int part = 1; part < kParts; ++part) {
      const int other = warp + part * (kWarps / kParts);
      const float* theirs = merge_o + other * 16 * kDim;
      for (int h = 0; h < 2; ++h) {
        const float2 ml = merge_ml[other * 16 + g + 8 * h];
        const float m_new = fmaxf(m[h], ml.x);
        const float reference = m_new == -INFINITY ? 0.f : m_new;
        const float a = exp2f(m[h] - reference), b = exp2f(ml.x - reference);
        m[h] = m_new;
        l[h] = l[h] * a + ml.y * b;
#pragma unroll
        for (int n = 0; n < kDim / 8; ++n) {
          const float2 ov = *reinterpret_cast<const float2*>(theirs + (g + 8 * h) * kDim + n * 8 + 2 * c);
          o[n][2 * h] = o[n][2 * h] * a + ov.x * b;
          o[n][2 * h + 1] = o[n][2 * h + 1] * a + ov.y * b;
        }
      }
    }
  }

  for (int h = 0; h < 2; ++h) {
    const int r = row0 + g + 8 * h;
    if (r >= rows_valid) continue;
    const size_t slot = (static_cast<size_t>(split) * p.num_kv_heads + kv_head) * p.row_capacity + r;
    float* out = p.partial_o + slot * kDim;
#pragma unroll
    for (int n = 0; n < kDim / 8; ++n) {
      *reinterpret_cast<float2*>(out + n * 8 + 2 * c) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
    }
    if (c == 0) p.partial_ml[slot] = make_float2(m[h], l[h]);
  }
}

template <int kDim>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(const AttentionParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  // The step state comes from the host before the forward, not from the previous kernel: read it
  // while that kernel finishes.
  const StepState& st = *p.state;
  const int group = p.num_heads / p.num_kv_heads;
  // This block's sequence and its first query row: one sequence's rows are cut into blocks of kRowsPerBlock;
  // several sequences' come as a list of blocks from the host, each within one sequence.
  const bool several = st.entries > 1;
  const int z = blockIdx.z;
  const bool has_block = !several || z < st.attention_blocks;
  const EntryView entry = entry_view(st, several && has_block ? st.block_entry[z] : 0);
  const int rows_valid = (entry.row0 + entry.rows) * group;
  const int kv_total = entry.cached + entry.rows;
  const SplitPlan plan = plan_splits(kv_total, p.max_splits);
  if (early_trigger(p, st, plan)) allow_next_grid();
  const int row_block = several ? (has_block ? st.block_first[z] : rows_valid) : z * kRowsPerBlock;
  const int split = blockIdx.x;
  const int key_begin = split * plan.chunk;
  const int key_end = min(key_begin + plan.chunk, kv_total);
  const int kv_head = blockIdx.y;
  const bool works = row_block < rows_valid && split < plan.active;
  // With prefetch_cached, tile 0's copy is issued before the wait where each of its keys was cached before this
  // forward.
  const bool first_issued = p.prefetch_cached && works && key_begin + kTileKeys <= entry.cached;
  if (first_issued) {
    const size_t offset = kv_head_offset(p, entry, kv_head, kDim);
    load_kv_tile<kDim>(smem, p.k_cache + offset, p.v_cache + offset, key_begin, key_end, 0, 0);
  }
  wait_for_previous_grid();
  if (!works) return;
  const int warp = threadIdx.x / 32;

  // Few query rows: where a split holds several key tiles, the idle warps take a share of each tile's keys
  // (p.split_keys); with one tile per split (KV up to about 8k) they run the empty row tiles beside the
  // others instead (results unused), which measured faster than merging the key shares (bench/NOTES.md,
  // run 44).
  const bool split_keys = p.split_keys && plan.chunk > kTileKeys;
  const int row_tiles = split_keys ? min(kWarps, (rows_valid - row_block + 15) / 16) : kWarps;
  if (row_tiles == 1) {
    attention_rows<kDim, 4>(p, smem, entry, kv_head, split, row_block, warp, key_begin, key_end, rows_valid, group,
                            first_issued);
  } else if (row_tiles == 2) {
    attention_rows<kDim, 2>(p, smem, entry, kv_head, split, row_block + 16 * (warp % 2), warp / 2, key_begin, key_end,
                            rows_valid, group, first_issued);
  } else {
    attention_rows<kDim, 1>(p, smem, entry, kv_head, split, row_block + 16 * warp, 0, key_begin, key_end, rows_valid,
                            group, first_issued);
  }
}

constexpr int kCombineThreads = 256;
constexpr int kMaxSplits = 256;

// Sum (op = add) or max over the block; every thread gets the result.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) v = kMax ? fmaxf(v, scratch[w]) : v + scratch[w];
  __syncthreads();
  return v;
}

// One block per (KV head, query row). Thread s holds slice s's (max, sum) (kMaxSplits <= threads); every
// thread sums one output dimension over a share of the slices. The first kEarly values of each share are
// requested together with the (max, sum) pairs, before the reductions, so a forward of up to kEarly x shares
// slices (KV up to 2k at head_dim 128) waits for one round trip to L2, not three.
template <int kDim>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const AttentionParams p) {
  static_assert(kMaxSplits <= kCombineThreads, "one slice per thread");
  constexpr int kShares = kCombineThreads / kDim;
  constexpr int kEarly = 16;
  __shared__ float weight[kMaxSplits];
  __shared__ float scratch[kCombineThreads / 32];
  __shared__ float parts[kCombineThreads];
  const StepState& st = *p.state;
  const int group = p.num_heads / p.num_kv_heads;
  const int kv_head = blockIdx.x;
  const int r = blockIdx.y;
  const int rows = st.rows;
  const EntryView entry = entry_view(st, r < rows * group ? row_entry(st, r / group) : 0);
  const SplitPlan plan = plan_splits(entry.cached + entry.rows, p.max_splits);
  if (early_trigger(p, st, plan)) allow_next_grid();
  wait_for_previous_grid();
  if (r >= rows * group) return;
  const size_t split_stride = static_cast<size_t>(p.num_kv_heads) * p.row_capacity;
  const size_t slot0 = static_cast<size_t>(kv_head) * p.row_capacity + r;
  const int d = threadIdx.x % kDim;
  const int share = threadIdx.x / kDim;
  auto partial = [&](int s) { return p.partial_o + (s * split_stride + slot0) * kDim + d; };

  const int mine = threadIdx.x;
  const float2 ml = mine < plan.active ? p.partial_ml[mine * split_stride + slot0] : make_float2(-INFINITY, 0.f);
  float early[kEarly];
#pragma unroll
  for (int i = 0; i < kEarly; ++i) {
    const int s = share + i * kShares;
    early[i] = s < plan.active ? *partial(s) : 0.f;
  }
  const float m_max = block_reduce<true>(ml.x, scratch);
  const float w = ml.x == -INFINITY ? 0.f : exp2f(ml.x - m_max);  // a slice with no key this row may see
  if (mine < plan.active) weight[mine] = w;
  const float total = block_reduce<false>(w * ml.y, scratch);  // its barriers also publish `weight`

  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kEarly; ++i) {
    const int s = share + i * kShares;
    if (s < plan.active) acc += weight[s] * early[i];
  }
#pragma unroll 8
  for (int s = share + kEarly * kShares; s < plan.active; s += kShares) acc += weight[s] * *partial(s);
  parts[threadIdx.x] = acc;
  __syncthreads();
  if (share != 0) return;
  for (int j = 1; j < kShares; ++j) acc += parts[j * kDim + d];
  const int t = r / group;
  const int head = kv_head * group + r % group;
  if (d < p.head_dim) p.out[(static_cast<size_t>(t) * p.num_heads + head) * p.head_dim + d] = __float2bfloat16(acc / total);
}

// Few splits (a forward of several sequences: about 2 x SMs / (KV heads x sequences) of them): one warp per (KV
// head, query row), eight rows a block. Lane s holds split s's (max, sum); each lane owns kDim / 32 output
// dimensions and requests every split's values of them at once, before the reductions, so the whole combine waits
// for one round trip to L2. The block-per-row kernel above spends 256 threads and four barriers on each row, which
// is what a single sequence's hundred-odd splits need and several sequences' handful do not.
constexpr int kWarpCombineSplits = 16;
constexpr int kWarpCombineRows = 8;

template <int kDim>
__global__ void __launch_bounds__(kWarpCombineRows * 32) combine_warp_kernel(const AttentionParams p) {
  constexpr int kPer = kDim / 32;
  const StepState& st = *p.state;
  const int group = p.num_heads / p.num_kv_heads;
  const int kv_head = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int r = blockIdx.y * kWarpCombineRows + threadIdx.x / 32;
  const bool valid = r < st.rows * group;
  const EntryView entry = entry_view(st, valid ? row_entry(st, r / group) : 0);
  const SplitPlan plan = plan_splits(entry.cached + entry.rows, p.max_splits);
  if (early_trigger(p, st, plan)) allow_next_grid();
  wait_for_previous_grid();
  if (!valid) return;
  const size_t split_stride = static_cast<size_t>(p.num_kv_heads) * p.row_capacity;
  const size_t slot0 = static_cast<size_t>(kv_head) * p.row_capacity + r;
  const float2 ml = lane < plan.active ? p.partial_ml[lane * split_stride + slot0] : make_float2(-INFINITY, 0.f);
  // Every load unconditional (a split past the active ones reads the last active one's, weighted 0 below), and all
  // of them held before the reductions, so that none waits behind another.
  float v[kWarpCombineSplits][kPer];
#pragma unroll
  for (int s = 0; s < kWarpCombineSplits; ++s) {
    const float* src = p.partial_o + (min(s, plan.active - 1) * split_stride + slot0) * kDim + kPer * lane;
    if constexpr (kPer == 4) {
      const float4 x = *reinterpret_cast<const float4*>(src);
      v[s][0] = x.x, v[s][1] = x.y, v[s][2] = x.z, v[s][3] = x.w;
    } else if constexpr (kPer == 2) {
      const float2 x = *reinterpret_cast<const float2*>(src);
      v[s][0] = x.x, v[s][1] = x.y;
    } else {
      v[s][0] = *src;
    }
  }
#pragma unroll
  for (int s = 0; s < kWarpCombineSplits; ++s) {
#pragma unroll
    for (int d = 0; d < kPer; ++d) asm volatile("" : "+f"(v[s][d]));
  }
  float m_max = ml.x;
  for (int offset = 16; offset > 0; offset /= 2) m_max = fmaxf(m_max, __shfl_xor_sync(0xffffffffu, m_max, offset));
  const float w = ml.x == -INFINITY ? 0.f : exp2f(ml.x - m_max);  // a slice with no key this row may see
  float total = w * ml.y;
  for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  float acc[kPer];
#pragma unroll
  for (int d = 0; d < kPer; ++d) acc[d] = 0.f;
#pragma unroll
  for (int s = 0; s < kWarpCombineSplits; ++s) {
    const float ws = __shfl_sync(0xffffffffu, w, s);  // 0 past the active splits
#pragma unroll
    for (int d = 0; d < kPer; ++d) acc[d] += ws * v[s][d];
  }
  const int t = r / group;
  const int head = kv_head * group + r % group;
  bf16* out = p.out + (static_cast<size_t>(t) * p.num_heads + head) * p.head_dim;
#pragma unroll
  for (int d = 0; d < kPer; ++d) {
    const int dim = kPer * lane + d;
    if (dim < p.head_dim) out[dim] = __float2bfloat16(acc[d] / total);
  }
}

// Blocks of query rows for up to max_rows rows of up to max_entries sequences: each sequence's rows cut at most one
// block more than the rows alone.
int attention_row_blocks(int max_rows, int group, int max_entries) {
  return ceil_div(max_rows * group, kRowsPerBlock) + (max_entries > 1 ? max_entries : 0);
}

// Calls go(std::integral_constant<int, D>{}) for the kernels' head dimension D (32, 64 or 128).
template <typename Go>
void by_head_dim(const AttentionParams& p, Go&& go) {
  switch (p.head_dim_padded) {
    case 32: return go(std::integral_constant<int, 32>{});
    case 64: return go(std::integral_constant<int, 64>{});
    case 128: return go(std::integral_constant<int, 128>{});
    default:
      throw std::runtime_error("the CUDA backend supports head_dim up to 128, got " + std::to_string(p.head_dim));
  }
}

}  // namespace

void attention_prepare() {
  // Above 48 KiB of dynamic shared memory a kernel must opt in; done once, outside any graph capture.
  A2D_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem_bytes<32>()));
  A2D_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem_bytes<64>()));
  A2D_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem_bytes<128>()));
}

int attention_max_splits(int max_rows, int max_entries, int num_heads, int num_kv_heads, int sm_count, bool typical_blocks) {
  const int group = num_heads / num_kv_heads;
  const int row_blocks = typical_blocks && max_entries > 1 ? std::max(ceil_div(max_rows * group, kRowsPerBlock), max_entries)
                                                           : attention_row_blocks(max_rows, group, max_entries);
  const int splits = 2 * sm_count / (num_kv_heads * row_blocks);
  return splits < 1 ? 1 : (splits > 256 ? 256 : splits);
}

void attention(const AttentionParams& p, int max_rows, int max_entries, cudaStream_t stream, bool pdl) {
  if (p.row_capacity < max_rows * (p.num_heads / p.num_kv_heads)) throw std::runtime_error("attention: row capacity");
  if (max_entries > 1 && attention_row_blocks(max_rows, p.num_heads / p.num_kv_heads, max_entries) > kMaxAttentionBlocks) {
    throw std::runtime_error("attention: more blocks of query rows than the step state lists");
  }
  const dim3 grid(p.max_splits, p.num_kv_heads, attention_row_blocks(max_rows, p.num_heads / p.num_kv_heads, max_entries));
  by_head_dim(p, [&](auto dim) {
    constexpr int kDim = decltype(dim)::value;
    launch(attention_kernel<kDim>, grid, dim3(kWarps * 32), smem_bytes<kDim>(), stream, pdl, p);
  });
}

void attention_combine(const AttentionParams& p, int max_rows, cudaStream_t stream, bool pdl) {
  if (p.max_splits > kMaxSplits) throw std::runtime_error("attention: too many KV splits");
  const int query_rows = max_rows * (p.num_heads / p.num_kv_heads);
  const bool warp = p.warp_combine && p.max_splits <= kWarpCombineSplits;
  by_head_dim(p, [&](auto dim) {
    constexpr int kDim = decltype(dim)::value;
    if (warp) {
      launch(combine_warp_kernel<kDim>, dim3(p.num_kv_heads, ceil_div(query_rows, kWarpCombineRows)),
             dim3(kWarpCombineRows * 32), 0, stream, pdl, p);
    } else {
      launch(combine_kernel<kDim>, dim3(p.num_kv_heads, query_rows), dim3(kCombineThreads), 0, stream, pdl, p);
    }
  });
}

}  // namespace a2d::cuda
