// The CPU backend's kernels for forwards of many rows (prompt chunks): a register-tiled GEMM over weight
// panels converted to fp32 once per panel, and causal attention over query-row tiles against key tiles with
// an online softmax. Both are written once over a float vector type and instantiated per instruction set
// (AVX-512, AVX2/FMA, the x86-64-v2 baseline), picked at run time: the tile shapes differ by register count,
// which one function body compiled three ways (target_clones) cannot express.
//
// This file is compiled with -ffp-contract=fast (engine/CMakeLists.txt): a * b + c becomes one FMA where the
// instruction set has it.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "cpu_kernels.h"

namespace a2d::cpu {

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
#define A2D_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#define A2D_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
#else
#define A2D_TARGET_V4
#define A2D_TARGET_V3
#endif
#define A2D_INLINE __attribute__((always_inline)) inline

using F16 = float __attribute__((vector_size(64)));
using F8 = float __attribute__((vector_size(32)));
using F4 = float __attribute__((vector_size(16)));
using I16 = int __attribute__((vector_size(64)));
using I8 = int __attribute__((vector_size(32)));
using I4 = int __attribute__((vector_size(16)));

// The integer vector of a float vector's width (comparisons yield it; exp builds exponent bits in it).
template <typename VT> struct IntVector;
template <> struct IntVector<F16> { using type = I16; };
template <> struct IntVector<F8> { using type = I8; };
template <> struct IntVector<F4> { using type = I4; };

template <typename To, typename From>
A2D_INLINE To bits_as(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "same width");
  return __builtin_bit_cast(To, from);
}

template <typename VT>
constexpr int kLanes = sizeof(VT) / sizeof(float);

template <typename VT>
A2D_INLINE VT load(const float* p) {
  VT v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename VT>
A2D_INLINE void store(float* p, const VT& v) {
  std::memcpy(p, &v, sizeof v);
}
// Every lane x, as lane 0 shuffled into all of them: one broadcast (GCC 12 compiles VT{} + x as an add to zero
// and a broadcast, and the initializer {x, x, ...} as one masked broadcast per lane).
template <typename VT, size_t... kLane>
A2D_INLINE VT splat_lanes(float x, std::index_sequence<kLane...>) {
  VT v{};
  v[0] = x;
  return __builtin_shufflevector(v, v, ((void)kLane, 0)...);
}
template <typename VT>
A2D_INLINE VT splat(float x) {
  return splat_lanes<VT>(x, std::make_index_sequence<kLanes<VT>>{});
}

// exp(x) for every lane: 2^n * e^r with n = round(x / ln 2), |r| <= ln 2 / 2, e^r by its Taylor polynomial of
// degree 7 (relative error below 2e-7). Lanes below -87.3 (and -inf) give exactly 0.
template <typename VT>
A2D_INLINE VT vexp(VT x) {
  using VI = typename IntVector<VT>::type;
  const VT lo = splat<VT>(-87.3f), hi = splat<VT>(88.3f);
  const VI keep = x >= lo;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const VT magic = splat<VT>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits
  const VT shifted = x * 1.44269504088896341f + magic;
  const VT n = shifted - magic;
  const VT r = x - n * 0.693145751953125f - n * 1.42860682030941723e-6f;
  VT p = splat<VT>(1.0f / 5040);
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const VI exponent = ((bits_as<VI>(shifted) - bits_as<VI>(magic)) + 127) << 23;
  return bits_as<VT>(bits_as<VI>(p * bits_as<VT>(exponent)) & keep);
}

// ---------------------------------------------------------------------------------------------------- GEMM
//
// y = x W^T with x [M][K] taken transposed once per call, in blocks of a micro kernel's tokens (xt
// [M / tokens][K][tokens], zero-padded), so that one vector holds one k of consecutive tokens and a micro kernel
// streams one contiguous slab (a [K][M] transpose puts every k of a slab in the same cache set once M is 1024). A task converts a panel of
// kPanelRows weight rows to fp32 (row by row, no transposition) and multiplies them with the token vectors:
// per k, kPanelRows broadcast weights times kVectors token vectors into kPanelRows * kVectors accumulators,
// which stay in registers for the whole K loop.

struct GemmSpace {
  std::vector<const Projection*> outs;
  std::vector<int64_t> first_panel;  // per projection, then the total
  int64_t K = 0, M = 0;
  int64_t padded_m = 0;  // M rounded up to whole token blocks
  const float* xt = nullptr;
};

template <typename VT, int kPanelRows, int kVectors>
A2D_INLINE void gemm_micro(const float* w, int64_t K, const float* xt, int64_t ldxt, float* tile) {
  VT acc[kPanelRows][kVectors];
  for (int r = 0; r < kPanelRows; ++r) {
    for (int j = 0; j < kVectors; ++j) acc[r][j] = VT{};
  }
  for (int64_t k = 0; k < K; ++k) {
    VT x[kVectors];
    for (int j = 0; j < kVectors; ++j) x[j] = load<VT>(xt + k * ldxt + j * kLanes<VT>);
    for (int r = 0; r < kPanelRows; ++r) {
      const VT b = splat<VT>(w[r * K + k]);
      for (int j = 0; j < kVectors; ++j) acc[r][j] += b * x[j];
    }
  }
  // tile[token][r]: the rows of y this panel writes.
  for (int r = 0; r < kPanelRows; ++r) {
    for (int j = 0; j < kVectors; ++j) {
      for (int lane = 0; lane < kLanes<VT>; ++lane) tile[(j * kLanes<VT> + lane) * kPanelRows + r] = acc[r][j][lane];
    }
  }
}

// One task: panel `panel` of the projections' panel index space against tokens [m_begin, m_end) (m_begin a
// multiple of the token block).
template <typename VT, int kPanelRows, int kVectors>
A2D_INLINE void gemm_task(const GemmSpace& space, int64_t panel, int64_t m_begin, int64_t m_end) {
  constexpr int kTokens = kVectors * kLanes<VT>;
  const int64_t K = space.K;
  size_t o = 0;
  while (panel >= space.first_panel[o + 1]) ++o;
  const Projection& p = *space.outs[o];
  const int64_t N = p.W->rows();
  const int64_t n0 = (panel - space.first_panel[o]) * kPanelRows;
  const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, N - n0));
  thread_local std::vector<float> w;
  w.resize(kPanelRows * K);
  for (int r = 0; r < rows; ++r) load_row(*p.W, n0 + r, w.data() + r * K);
  std::fill(w.begin() + rows * K, w.end(), 0.0f);
  float tile[kTokens * kPanelRows];
  for (int64_t m0 = m_begin; m0 < m_end; m0 += kTokens) {
    gemm_micro<VT, kPanelRows, kVectors>(w.data(), K, space.xt + m0 * K, kTokens, tile);
    const int tokens = static_cast<int>(std::min<int64_t>(kTokens, m_end - m0));
    for (int t = 0; t < tokens; ++t) {
      float* y = p.y + (m0 + t) * N + n0;
      const float* from = tile + t * kPanelRows;
      if (p.bias != nullptr) {
        for (int r = 0; r < rows; ++r) y[r] = from[r] + p.bias[n0 + r];
      } else {
        std::memcpy(y, from, rows * sizeof(float));
      }
    }
  }
}

using GemmTask = void (*)(const GemmSpace&, int64_t panel, int64_t m_begin, int64_t m_end);

// Panels of 12 weight rows against 32 tokens (24 of 32 zmm registers), 6 x 16 (12 of 16 ymm), 6 x 8 (xmm).
A2D_TARGET_V4 void gemm_task_v4(const GemmSpace& s, int64_t panel, int64_t b, int64_t e) { gemm_task<F16, 12, 2>(s, panel, b, e); }
A2D_TARGET_V3 void gemm_task_v3(const GemmSpace& s, int64_t panel, int64_t b, int64_t e) { gemm_task<F8, 6, 2>(s, panel, b, e); }
void gemm_task_base(const GemmSpace& s, int64_t panel, int64_t b, int64_t e) { gemm_task<F4, 6, 2>(s, panel, b, e); }
constexpr int kPanelRows[3] = {12, 6, 6};
constexpr int kTokenBlock[3] = {32, 16, 8};
constexpr GemmTask kGemmTasks[3] = {gemm_task_v4, gemm_task_v3, gemm_task_base};

std::atomic<int> isa_floor{0};  // limit_many_row_isa

// 0: AVX-512 (x86-64-v4), 1: AVX2/FMA (x86-64-v3), 2: the baseline.
int isa_level() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const int level = __builtin_cpu_supports("x86-64-v4") ? 0 : __builtin_cpu_supports("x86-64-v3") ? 1 : 2;
#else
  const int level = 2;
#endif
  return std::max(level, isa_floor.load(std::memory_order_relaxed));
}

// ----------------------------------------------------------------------------------------------- attention

struct CausalAttention {
  const float* q;
  const float* k_cache;
  const float* v_cache;
  int64_t n;  // cached positions before the forward
  int64_t C;  // causal rows: row r sits at n + r and sees keys 0..n + r
  int heads, kv_heads, head_dim;
  float scale;
  float* out;
  const float* k_packed;  // per KV head, per key tile: [head_dim][kTileKeys] (zero past the last key)
  int64_t key_tiles;
};

// Keys per tile: four vectors.
template <typename VT>
constexpr int kTileKeys = 4 * kLanes<VT>;

// K^T of one KV head's key tile into packed [head_dim][kTileKeys].
template <typename VT>
A2D_INLINE void pack_keys(const CausalAttention& a, int kv_head, int64_t tile, float* packed) {
  constexpr int T = kTileKeys<VT>;
  const int64_t kv_stride = static_cast<int64_t>(a.kv_heads) * a.head_dim;
  const int64_t keys = a.n + a.C;
  for (int d = 0; d < a.head_dim; ++d) {
    for (int j = 0; j < T; ++j) {
      const int64_t key = tile * T + j;
      packed[d * T + j] = key < keys ? a.k_cache[key * kv_stride + kv_head * a.head_dim + d] : 0.0f;
    }
  }
}

// The state of one micro block: kRows query rows (token, head) of one KV head, their running max m and sum l
// of the online softmax and their output rows o [kRows][head_dim] (unnormalised until the end).
template <int kRows>
struct MicroBlock {
  const float* q[kRows];
  int64_t limit[kRows];  // the last key each row sees
  int64_t last;          // the largest limit
  float m[kRows], l[kRows];
  float* o;
};

// One key tile for one micro block: the tile's scores into `p` [kRows][kTileKeys], turned into probabilities
// with the online softmax, then added into o as P V, kDims (a multiple of the lanes) output dimensions at a time.
template <typename VT, int kRows, int kDimVectors>
A2D_INLINE void attention_tile(const CausalAttention& a, int kv_head, int64_t tile, MicroBlock<kRows>& b, float* p) {
  constexpr int V = kLanes<VT>;
  constexpr int T = kTileKeys<VT>;
  constexpr int kDims = kDimVectors * V;
  const int hd = a.head_dim;
  const int64_t kv_stride = static_cast<int64_t>(a.kv_heads) * hd;
  const float* v_head = a.v_cache + static_cast<int64_t>(kv_head) * hd;
  const float* kt = a.k_packed + (static_cast<int64_t>(kv_head) * a.key_tiles + tile) * hd * T;
  float* o = b.o;
  float alpha[kRows];
  {
    // S = Q K^T for the tile.
    VT s[kRows][4];
    for (int i = 0; i < kRows; ++i) {
      for (int j = 0; j < 4; ++j) s[i][j] = VT{};
    }
    for (int d = 0; d < hd; ++d) {
      VT kv[4];
      for (int j = 0; j < 4; ++j) kv[j] = load<VT>(kt + d * T + j * V);
      for (int i = 0; i < kRows; ++i) {
        const VT q = splat<VT>(b.q[i][d]);
        for (int j = 0; j < 4; ++j) s[i][j] += q * kv[j];
      }
    }
    // Online softmax, a vector at a time: keys past a row's limit count as -inf.
    const int64_t key0 = tile * T;
    VT lane_key;
    for (int lane = 0; lane < V; ++lane) lane_key[lane] = static_cast<float>(key0 + lane);
    const VT minus_inf = splat<VT>(-INFINITY);
    for (int i = 0; i < kRows; ++i) {
      const VT limit_i = splat<VT>(static_cast<float>(b.limit[i]));  // positions are exact in fp32 below 2^24
      VT top = minus_inf;
      for (int j = 0; j < 4; ++j) {
        const VT v = s[i][j] * a.scale;
        s[i][j] = lane_key + static_cast<float>(j * V) <= limit_i ? v : minus_inf;
        top = s[i][j] > top ? s[i][j] : top;
      }
      float tile_max = -INFINITY;
      for (int lane = 0; lane < V; ++lane) tile_max = std::max(tile_max, top[lane]);
      const float m_new = std::max(b.m[i], tile_max);  // finite: every row sees key 0 in tile 0
      alpha[i] = std::exp(b.m[i] - m_new);
      b.m[i] = m_new;
      VT sum{};
      for (int j = 0; j < 4; ++j) {
        const VT e = vexp<VT>(s[i][j] - m_new);
        store(p + i * T + j * V, e);
        sum += e;
      }
      float total = 0.0f;
      for (int lane = 0; lane < V; ++lane) total += sum[lane];
      b.l[i] = b.l[i] * alpha[i] + total;
    }
  }
  // O = alpha O + P V, over the tile's keys that some row sees.
  const int64_t key0 = tile * T;
  const int keys = static_cast<int>(std::min<int64_t>(T, b.last - key0 + 1));
  for (int d0 = 0; d0 < hd; d0 += kDims) {
    VT acc[kRows][kDimVectors];
    for (int i = 0; i < kRows; ++i) {
      const VT scale = splat<VT>(alpha[i]);
      for (int j = 0; j < kDimVectors; ++j) acc[i][j] = load<VT>(o + i * hd + d0 + j * V) * scale;
    }
    for (int key = 0; key < keys; ++key) {
      const float* vrow = v_head + (key0 + key) * kv_stride + d0;
      VT v[kDimVectors];
      for (int j = 0; j < kDimVectors; ++j) v[j] = load<VT>(vrow + j * V);
      for (int i = 0; i < kRows; ++i) {
        const VT w = splat<VT>(p[i * T + key]);
        for (int j = 0; j < kDimVectors; ++j) acc[i][j] += w * v[j];
      }
    }
    for (int i = 0; i < kRows; ++i) {
      for (int j = 0; j < kDimVectors; ++j) store(o + i * hd + d0 + j * V, acc[i][j]);
    }
  }
}

// One task: tokens [t_begin, t_end) of one KV head's group, in micro blocks of kRows (token, head) rows. Key
// tiles are the outer loop, so each tile's K and V are read from memory once for all the task's micro blocks.
template <typename VT, int kRows, int kDimVectors>
A2D_INLINE void attention_rows(const CausalAttention& a, int kv_head, int64_t t_begin, int64_t t_end) {
  constexpr int T = kTileKeys<VT>;
  const int group = a.heads / a.kv_heads;
  const int hd = a.head_dim;
  const int64_t q_stride = static_cast<int64_t>(a.heads) * hd;
  const int64_t rows = (t_end - t_begin) * group;
  const int64_t blocks = (rows + kRows - 1) / kRows;
  thread_local std::vector<float> o, p;
  thread_local std::vector<MicroBlock<kRows>> state;
  o.assign(blocks * kRows * hd, 0.0f);
  p.resize(kRows * T);
  state.resize(blocks);
  int64_t last = 0;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    MicroBlock<kRows>& b = state[blk];
    b.o = o.data() + blk * kRows * hd;
    b.last = 0;
    for (int i = 0; i < kRows; ++i) {
      const int64_t r = std::min(blk * kRows + i, rows - 1);  // padding rows repeat the last; dropped at the end
      const int64_t t = t_begin + r / group;
      b.q[i] = a.q + t * q_stride + (kv_head * group + r % group) * hd;
      b.limit[i] = a.n + t;
      b.last = std::max(b.last, b.limit[i]);
      b.m[i] = -INFINITY;
      b.l[i] = 0.0f;
    }
    last = std::max(last, b.last);
  }
  for (int64_t tile = 0; tile <= last / T; ++tile) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      if (tile * T <= state[blk].last) attention_tile<VT, kRows, kDimVectors>(a, kv_head, tile, state[blk], p.data());
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const MicroBlock<kRows>& b = state[r / kRows];
    const int i = static_cast<int>(r % kRows);
    const int64_t t = t_begin + r / group;
    float* dst = a.out + t * q_stride + (kv_head * group + r % group) * hd;
    const float inv = 1.0f / b.l[i];
    for (int d = 0; d < hd; ++d) dst[d] = b.o[i * hd + d] * inv;
  }
}

// Output dimensions per P V pass: four vectors where the head holds them, else one.
template <typename VT, int kRows>
A2D_INLINE void attention_task(const CausalAttention& a, int kv_head, int64_t t_begin, int64_t t_end) {
  if (a.head_dim % (4 * kLanes<VT>) == 0) {
    attention_rows<VT, kRows, 4>(a, kv_head, t_begin, t_end);
  } else {
    attention_rows<VT, kRows, 1>(a, kv_head, t_begin, t_end);
  }
}

A2D_TARGET_V4 void attention_task_v4(const CausalAttention& a, int kv_head, int64_t b, int64_t e) {
  attention_task<F16, 6>(a, kv_head, b, e);
}
A2D_TARGET_V3 void attention_task_v3(const CausalAttention& a, int kv_head, int64_t b, int64_t e) {
  attention_task<F8, 3>(a, kv_head, b, e);
}
void attention_task_base(const CausalAttention& a, int kv_head, int64_t b, int64_t e) { attention_task<F4, 3>(a, kv_head, b, e); }
A2D_TARGET_V4 void pack_keys_v4(const CausalAttention& a, int kv_head, int64_t tile, float* out) { pack_keys<F16>(a, kv_head, tile, out); }
A2D_TARGET_V3 void pack_keys_v3(const CausalAttention& a, int kv_head, int64_t tile, float* out) { pack_keys<F8>(a, kv_head, tile, out); }
void pack_keys_base(const CausalAttention& a, int kv_head, int64_t tile, float* out) { pack_keys<F4>(a, kv_head, tile, out); }

using AttentionTask = void (*)(const CausalAttention&, int kv_head, int64_t t_begin, int64_t t_end);
using PackTask = void (*)(const CausalAttention&, int kv_head, int64_t tile, float* out);
constexpr AttentionTask kAttentionTasks[3] = {attention_task_v4, attention_task_v3, attention_task_base};
constexpr PackTask kPackTasks[3] = {pack_keys_v4, pack_keys_v3, pack_keys_base};

// Query rows per task: whole tokens of one KV head's group, about this many (token, head) rows.
constexpr int kTaskRows = 48;

constexpr int kAttentionLanes[3] = {16, 8, 4};

// ------------------------------------------------------------------------------------------------ SiLU

template <typename VT>
A2D_INLINE void silu_mul_range(float* gate, const float* up, int64_t count) {
  constexpr int V = kLanes<VT>;
  int64_t i = 0;
  for (; i + V <= count; i += V) {
    const VT g = load<VT>(gate + i);
    store(gate + i, g / (1.0f + vexp<VT>(-g)) * load<VT>(up + i));
  }
  for (; i < count; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}
A2D_TARGET_V4 void silu_mul_v4(float* gate, const float* up, int64_t count) { silu_mul_range<F16>(gate, up, count); }
A2D_TARGET_V3 void silu_mul_v3(float* gate, const float* up, int64_t count) { silu_mul_range<F8>(gate, up, count); }
void silu_mul_base(float* gate, const float* up, int64_t count) { silu_mul_range<F4>(gate, up, count); }

}  // namespace

int limit_many_row_isa(int level) {
  isa_floor.store(std::min(2, std::max(0, level)));
  return isa_level();
}

void matmuls_many_rows(ThreadPool& pool, const float* x, int64_t M, const std::vector<Projection>& projections) {
  if (M == 0 || projections.size() == 0) return;
  const int level = isa_level();
  const int64_t block = kTokenBlock[level], panel_rows = kPanelRows[level];
  GemmSpace space;
  space.K = projections.begin()->W->cols();
  space.M = M;
  space.first_panel.push_back(0);
  for (const Projection& p : projections) {
    if (p.W->cols() != space.K) throw std::logic_error("matmuls: projections of one input must share K");
    space.outs.push_back(&p);
    space.first_panel.push_back(space.first_panel.back() + (p.W->rows() + panel_rows - 1) / panel_rows);
  }
  const int64_t panels = space.first_panel.back(), K = space.K;
  if (panels == 0) return;
  // x transposed, in row blocks over the pool.
  space.padded_m = (M + block - 1) / block * block;
  thread_local std::vector<float> xt;
  xt.resize(K * space.padded_m);
  float* xt_data = xt.data();  // the caller's buffer (a worker's thread_local would be its own)
  space.xt = xt_data;
  const int64_t k_parts = std::min<int64_t>(K, 4 * static_cast<int64_t>(pool.size()));
  pool.parallel_for(k_parts, [&](int64_t part) {
    const int64_t k_begin = K * part / k_parts, k_end = K * (part + 1) / k_parts;
    for (int64_t m0 = 0; m0 < space.padded_m; m0 += block) {
      float* slab = xt_data + m0 * K;
      const int64_t tokens = std::max<int64_t>(0, std::min(block, M - m0));
      for (int64_t k = k_begin; k < k_end; ++k) {
        for (int64_t t = 0; t < tokens; ++t) slab[k * block + t] = x[(m0 + t) * K + k];
        std::fill(slab + k * block + tokens, slab + (k + 1) * block, 0.0f);
      }
    }
  });
  // Tasks: (token range, panel) pairs. A range holds at most kTaskTokens tokens, so that its slab of xt stays in
  // a core's L2 while consecutive tasks take the next panels; more ranges when the panels alone are too few
  // to balance the pool.
  constexpr int64_t kTaskTokens = 256;
  const int64_t blocks = space.padded_m / block;
  const int64_t want = 4 * static_cast<int64_t>(pool.size());
  const int64_t parts = std::min<int64_t>(
      blocks, std::max((blocks * block + kTaskTokens - 1) / kTaskTokens, (want + panels - 1) / panels));
  const int64_t blocks_per_part = (blocks + parts - 1) / parts;
  const GemmTask task = kGemmTasks[level];
  pool.parallel_for(panels * parts, [&](int64_t index) {
    const int64_t part = index / panels, panel = index % panels;
    const int64_t m_begin = part * blocks_per_part * block, m_end = std::min(M, m_begin + blocks_per_part * block);
    if (m_begin < m_end) task(space, panel, m_begin, m_end);
  });
}

bool causal_attention_tiled(ThreadPool& pool, const float* q, const float* k_cache, const float* v_cache, int64_t n,
                            int64_t C, int heads, int kv_heads, int head_dim, float* out) {
  const int level = isa_level();
  if (C <= 0 || head_dim % kAttentionLanes[level] != 0) return false;
  CausalAttention a{q, k_cache, v_cache, n, C, heads, kv_heads, head_dim,
                    1.0f / std::sqrt(static_cast<float>(head_dim)), out, nullptr, 0};
  const int64_t tile_keys = 4 * kAttentionLanes[level];
  a.key_tiles = (n + C + tile_keys - 1) / tile_keys;
  thread_local std::vector<float> k_packed;
  k_packed.resize(static_cast<size_t>(kv_heads) * a.key_tiles * head_dim * tile_keys);
  float* packed = k_packed.data();  // the caller's buffer (a worker's thread_local would be its own)
  a.k_packed = packed;
  // K^T of every key tile of every KV head, once per forward.
  const int64_t tile_floats = head_dim * tile_keys;
  pool.parallel_for(static_cast<int64_t>(kv_heads) * a.key_tiles, [&](int64_t task) {
    kPackTasks[level](a, static_cast<int>(task / a.key_tiles), task % a.key_tiles, packed + task * tile_floats);
  });
  const int group = heads / kv_heads;
  const int64_t tokens_per_task = std::max<int64_t>(1, kTaskRows / group);
  const int64_t token_blocks = (C + tokens_per_task - 1) / tokens_per_task;
  // The last tokens see the most keys: they go first, so the pool ends on short tasks.
  pool.parallel_for(kv_heads * token_blocks, [&](int64_t task) {
    const int64_t block = token_blocks - 1 - task / kv_heads;
    const int64_t t_begin = block * tokens_per_task;
    kAttentionTasks[level](a, static_cast<int>(task % kv_heads), t_begin, std::min(C, t_begin + tokens_per_task));
  });
  return true;
}

void silu_mul_vector(float* gate, const float* up, int64_t count) {
  switch (isa_level()) {
    case 0: return silu_mul_v4(gate, up, count);
    case 1: return silu_mul_v3(gate, up, count);
    default: return silu_mul_base(gate, up, count);
  }
}

}  // namespace a2d::cpu
