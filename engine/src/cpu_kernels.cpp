#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "safetensors.h"

// Hot loops get AVX-512 and AVX2/FMA clones chosen at load time by the dynamic loader (ifunc); the default
// clone keeps the addon running on any x86-64-v2 machine.
#if defined(__x86_64__) && defined(__GNUC__)
#define A2D_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define A2D_HOT
#endif

namespace a2d::cpu {

namespace {

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000 | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400) == 0);
    bits = sign | ((112 - e) << 23) | ((mantissa & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// f16 is rare (weights are bf16), so a table lookup keeps its path simple and branch-free.
const std::vector<float>& f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = f16_to_float(static_cast<uint16_t>(i));
    return t;
  }();
  return table;
}

// e4m3 (OCP FP8 "fn": bias 7, 3 mantissa bits, no infinities, S.1111.111 is NaN) as fp32, every code exactly.
float e4m3_to_float(uint8_t code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  const float magnitude = (code & 0x7f) == 0x7f ? NAN
                          : exponent == 0        ? std::ldexp(static_cast<float>(mantissa), -9)
                                                 : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return code & 0x80 ? -magnitude : magnitude;
}

const float* e4m3_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int i = 0; i < 256; ++i) t[i] = e4m3_to_float(static_cast<uint8_t>(i));
    return t;
  }();
  return table.data();
}

A2D_HOT void bf16_row_to_float(const uint16_t* src, int64_t n, float* dst) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(&dst[i], &bits, sizeof(float));
  }
}

void row_to_float(const Tensor& t, int64_t row, float* dst) {
  const int64_t n = t.cols();
  switch (t.dtype) {
    case DType::bf16:
      bf16_row_to_float(static_cast<const uint16_t*>(t.data) + row * n, n, dst);
      break;
    case DType::f16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + row * n;
      const float* table = f16_table().data();
      for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
      break;
    }
    case DType::f32:
      std::memcpy(dst, static_cast<const float*>(t.data) + row * n, n * sizeof(float));
      break;
    case DType::f8_e4m3: {  // value x its row's scale, one fp32 product as the reference computes it
      const uint8_t* src = static_cast<const uint8_t*>(t.data) + row * n;
      const float* table = e4m3_table();
      const float scale = t.scale[row];
      for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]] * scale;
      break;
    }
    case DType::i32:  // rejected at load
      break;
  }
}

constexpr int kTileRows = 4;   // weight rows converted together and dotted against each x row
// x rows per sweep over the weights: a denoising forward has at most 2 x 64 rows (commit + window),
// so each weight row comes from memory once; only long prefills sweep the weights again.
constexpr int64_t kTileM = 128;

inline float weight_value(float w) { return w; }
inline float weight_value(uint16_t w) { return bf16_to_float(w); }  // bf16 bits

// y[i, r] = dot(w[r], x[i]) for kX <= 4 x rows and the tile's 4 weight rows: up to sixteen independent
// accumulators hide the FMA latency, and each weight vector loaded feeds kX FMAs; rows past kX are compiled
// out. bf16 weights are widened in registers as they are loaded (the same fp32 values as a converted copy,
// so the same sums).
template <int kX, typename W>
__attribute__((always_inline)) inline void dot_rows(const W* w, const float* x, int64_t K, float* y, int64_t ldy) {
  const W *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
  const float *xa = x, *xb = x + K, *xc = x + 2 * K, *xd = x + 3 * K;
  float a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
  float c0 = 0, c1 = 0, c2 = 0, c3 = 0, d0 = 0, d1 = 0, d2 = 0, d3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3)
  for (int64_t k = 0; k < K; ++k) {
    const float v0 = weight_value(w0[k]), v1 = weight_value(w1[k]), v2 = weight_value(w2[k]), v3 = weight_value(w3[k]);
    a0 += v0 * xa[k];
    a1 += v1 * xa[k];
    a2 += v2 * xa[k];
    a3 += v3 * xa[k];
    if constexpr (kX > 1) {
      b0 += v0 * xb[k];
      b1 += v1 * xb[k];
      b2 += v2 * xb[k];
      b3 += v3 * xb[k];
    }
    if constexpr (kX > 2) {
      c0 += v0 * xc[k];
      c1 += v1 * xc[k];
      c2 += v2 * xc[k];
      c3 += v3 * xc[k];
    }
    if constexpr (kX > 3) {
      d0 += v0 * xd[k];
      d1 += v1 * xd[k];
      d2 += v2 * xd[k];
      d3 += v3 * xd[k];
    }
  }
  const float sums[4][kTileRows] = {{a0, a1, a2, a3}, {b0, b1, b2, b3}, {c0, c1, c2, c3}, {d0, d1, d2, d3}};
  for (int i = 0; i < kX; ++i) std::memcpy(y + i * ldy, sums[i], sizeof sums[i]);
}

// y[m, r] = dot(w[r], x[m]) for r < rows, m < M. Full weight tiles take the x rows four at a time, then the
// last one to three together; a partial tile (a matrix's last rows) takes one weight row and one x row at a
// time.
template <typename W>
__attribute__((always_inline)) inline void dot_tile_body(const W* w, int rows, const float* x, int64_t M, int64_t K,
                                                         float* y, int64_t ldy) {
  if (rows == kTileRows) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) dot_rows<4>(w, x + m * K, K, y + m * ldy, ldy);
    switch (M - m) {
      case 3: dot_rows<3>(w, x + m * K, K, y + m * ldy, ldy); break;
      case 2: dot_rows<2>(w, x + m * K, K, y + m * ldy, ldy); break;
      case 1: dot_rows<1>(w, x + m * K, K, y + m * ldy, ldy); break;
      default: break;
    }
    return;
  }
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    for (int r = 0; r < rows; ++r) {
      const W* wr = w + r * K;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t k = 0; k < K; ++k) s += weight_value(wr[k]) * xm[k];
      y[m * ldy + r] = s;
    }
  }
}

A2D_HOT void dot_tile(const float* w, int rows, const float* x, int64_t M, int64_t K, float* y, int64_t ldy) {
  dot_tile_body(w, rows, x, M, K, y, ldy);
}
A2D_HOT void dot_tile_bf16(const uint16_t* w, int rows, const float* x, int64_t M, int64_t K, float* y, int64_t ldy) {
  dot_tile_body(w, rows, x, M, K, y, ldy);
}

A2D_HOT float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

A2D_HOT void axpy(float a, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// Waking the pool costs microseconds; below this many multiply-adds per task the loop runs inline.
constexpr int64_t kMinWorkPerTask = 1 << 15;

void parallel_or_inline(ThreadPool& pool, int64_t n, int64_t work, const std::function<void(int64_t)>& fn) {
  if (work < 2 * kMinWorkPerTask) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  } else {
    pool.parallel_for(n, fn);
  }
}

}  // namespace

float load_element(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::bf16:
      return bf16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::f16:
      return f16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::f32:
      return static_cast<const float*>(t.data)[i];
    case DType::f8_e4m3:
      return e4m3_table()[static_cast<const uint8_t*>(t.data)[i]] * t.scale[i / t.cols()];
    case DType::i32:  // rejected at load
      break;
  }
  return 0.0f;
}

void load_row(const Tensor& t, int64_t row, float* dst) { row_to_float(t, row, dst); }

std::vector<float> to_fp32(const Tensor& t) {
  if (!t.present()) return {};
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = load_element(t, i);
  return out;
}

void embed(const Tensor& table, const int32_t* ids, int64_t M, float* out) {
  for (int64_t m = 0; m < M; ++m) row_to_float(table, ids[m], out + m * table.cols());
}

// Weight tiles come from memory (a model is larger than the caches), and a core that multiplies one tile
// leaves the memory idle unless it has asked for the next ones: the tile kPrefetchTiles ahead is requested
// before each multiply (12 % off a forward of the bundled model on 2 cores, bench/NOTES.md).
constexpr int64_t kPrefetchTiles = 4;

// Requests tile t (of projection `o` or a later one) of the projections' one tile index space.
void prefetch_tile(const std::vector<Projection>& outs, const std::vector<int64_t>& first_tile, int64_t t, int64_t t_end,
                   size_t o) {
  if (t >= t_end) return;
  while (t >= first_tile[o + 1]) ++o;
  const Tensor& W = *outs[o].W;
  const int64_t n0 = (t - first_tile[o]) * kTileRows;
  const int64_t rows = std::min<int64_t>(kTileRows, W.rows() - n0);
  const int64_t element = static_cast<int64_t>(dtype_size(W.dtype));
  const char* begin = static_cast<const char*>(W.data) + n0 * W.cols() * element;
  const char* end = begin + rows * W.cols() * element;
  for (const char* line = begin; line < end; line += 64) __builtin_prefetch(line, 0, 0);
}

void matmuls(ThreadPool& pool, const float* x, int64_t M, std::initializer_list<Projection> projections) {
  matmuls_ranges(pool, x, {M}, projections);
}

void matmuls_ranges(ThreadPool& pool, const float* x, const std::vector<int64_t>& ranges,
                    const std::vector<Projection>& outs) {
  const int64_t K = outs.front().W->cols();
  // Ranges of many rows each take the many-row GEMM on their own; the few-row ranges go through the weights
  // together below, in sweeps of at most kTileM rows that each range lies wholly inside.
  struct Range {
    int64_t first, rows;
  };
  std::vector<Range> few;
  std::vector<size_t> sweep_ends;  // per sweep, the end of its ranges in `few`
  int64_t first = 0, few_rows = 0, sweep_rows = 0;
  for (const int64_t M : ranges) {
    if (M >= kManyRows) {
      std::vector<Projection> shifted(outs);
      for (Projection& p : shifted) p.y += first * p.W->rows();
      matmuls_many_rows(pool, x + first * K, M, shifted);
    } else if (M > 0) {
      if (sweep_rows + M > kTileM) {
        sweep_ends.push_back(few.size());
        sweep_rows = 0;
      }
      few.push_back({first, M});
      few_rows += M;
      sweep_rows += M;
    }
    first += M;
  }
  if (few.empty()) return;
  sweep_ends.push_back(few.size());
  // The projections' weight tiles form one index space, so q/k/v (or gate/up) share one pool wake-up.
  std::vector<int64_t> first_tile{0};
  int64_t work = 0;
  for (const Projection& p : outs) {
    if (p.W->cols() != K) throw std::logic_error("matmuls: projections of one input must share K");
    first_tile.push_back(first_tile.back() + (p.W->rows() + kTileRows - 1) / kTileRows);
    work += few_rows * p.W->rows() * K;
  }
  const int64_t tiles = first_tile.back();
  if (tiles == 0) return;
  // Enough chunks to balance the pool (a straggler delays everyone), few enough to amortise claiming.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>({tiles, pool.size() * 8, work / kMinWorkPerTask}));
  const int64_t tiles_per_chunk = (tiles + chunks - 1) / chunks;
  pool.parallel_for(chunks, [&](int64_t chunk) {
    thread_local std::vector<float> wbuf;
    wbuf.resize(kTileRows * K);
    const int64_t t_begin = chunk * tiles_per_chunk;
    const int64_t t_end = std::min(tiles, t_begin + tiles_per_chunk);
    size_t sweep_begin = 0;
    for (const size_t sweep_end : sweep_ends) {
      size_t o = 0;
      for (int64_t t = t_begin; t < t_end; ++t) {
        while (t >= first_tile[o + 1]) ++o;
        const Projection& p = outs[o];
        const int64_t N = p.W->rows();
        const int64_t n0 = (t - first_tile[o]) * kTileRows;
        const int rows = static_cast<int>(std::min<int64_t>(kTileRows, N - n0));
        prefetch_tile(outs, first_tile, t + kPrefetchTiles, t_end, o);
        const bool bf16 = p.W->dtype == DType::bf16;
        if (!bf16) {
          for (int r = 0; r < rows; ++r) row_to_float(*p.W, n0 + r, wbuf.data() + r * K);
        }
        // Every range of the sweep against this tile, which stays in the core's cache meanwhile.
        for (size_t i = sweep_begin; i < sweep_end; ++i) {
          const int64_t m0 = few[i].first, mt = few[i].rows;
          if (bf16) {
            dot_tile_bf16(static_cast<const uint16_t*>(p.W->data) + n0 * K, rows, x + m0 * K, mt, K, p.y + m0 * N + n0, N);
          } else {
            dot_tile(wbuf.data(), rows, x + m0 * K, mt, K, p.y + m0 * N + n0, N);
          }
          if (p.bias != nullptr) {
            for (int64_t m = m0; m < m0 + mt; ++m) {
              for (int r = 0; r < rows; ++r) p.y[m * N + n0 + r] += p.bias[n0 + r];
            }
          }
        }
      }
      sweep_begin = sweep_end;
    }
  });
}

void matmul(ThreadPool& pool, const float* x, int64_t M, const Tensor& W, const float* bias, float* y) {
  matmuls(pool, x, M, {Projection{&W, bias, y}});
}

void rmsnorm(const float* x, int64_t M, int64_t n, const float* w, double eps, float* y) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * n;
    float* ym = y + m * n;
    const float mean_square = dot(xm, xm, n) / static_cast<float>(n);
    const float scale = 1.0f / std::sqrt(mean_square + static_cast<float>(eps));
    for (int64_t i = 0; i < n; ++i) ym[i] = w[i] * (xm[i] * scale);
  }
}

void rope_table(const int64_t* positions, int64_t M, int head_dim, double theta, float* cos_table, float* sin_table) {
  const int half = head_dim / 2;
  std::vector<float> inv_freq(half);
  // inv_freq and the angle in fp32, as the reference computes them.
  for (int i = 0; i < half; ++i) inv_freq[i] = 1.0f / static_cast<float>(std::pow(theta, (2.0 * i) / head_dim));
  for (int64_t m = 0; m < M; ++m) {
    const double position = static_cast<double>(positions[m]);
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(position) * inv_freq[i];
      cos_table[m * half + i] = std::cos(angle);
      sin_table[m * half + i] = std::sin(angle);
    }
  }
}

void rope_rotate(float* x, int64_t M, int64_t row_stride, int heads, int head_dim, const float* cos_table,
                 const float* sin_table) {
  const int half = head_dim / 2;
  for (int64_t m = 0; m < M; ++m) {
    const float* c = cos_table + m * half;
    const float* s = sin_table + m * half;
    for (int h = 0; h < heads; ++h) {
      float* v = x + m * row_stride + static_cast<int64_t>(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

void rope(float* x, int64_t M, int64_t row_stride, int heads, int head_dim, const int64_t* positions,
          double theta) {
  std::vector<float> cos_table(M * (head_dim / 2)), sin_table(M * (head_dim / 2));
  rope_table(positions, M, head_dim, theta, cos_table.data(), sin_table.data());
  rope_rotate(x, M, row_stride, heads, head_dim, cos_table.data(), sin_table.data());
}

void attention(ThreadPool& pool, const float* q, const float* k_cache, const float* v_cache, int64_t n,
               int64_t C, int64_t T, int heads, int kv_heads, int head_dim, float* out,
               const std::vector<uint8_t>* revealed, AdapterRule rule) {
  const int64_t q_stride = static_cast<int64_t>(heads) * head_dim;
  const int64_t kv_stride = static_cast<int64_t>(kv_heads) * head_dim;
  const int group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // The causal rows in tiles where there are many; the window rows (and few causal rows) one by one.
  const int64_t first = C >= kTiledAttentionRows &&
                                causal_attention_tiled(pool, q, k_cache, v_cache, n, C, heads, kv_heads, head_dim, out)
                            ? C
                            : 0;
  const int64_t work = (T - first) * heads * (n + T) * head_dim * 2;
  parallel_or_inline(pool, (T - first) * heads, work, [&](int64_t task) {
    const int64_t r = first + task / heads;
    const int h = static_cast<int>(task % heads);
    const bool revealed_row = revealed != nullptr && r >= C && (*revealed)[r - C] != 0;
    const bool causal_revealed = revealed_row && rule == AdapterRule::mask;
    const int64_t keys = r < C || causal_revealed ? n + r + 1 : n + T;
    // A revealed row skips the masked window positions (before it, under the mask rule).
    auto sees = [&](int64_t p) { return p < n + C || !revealed_row || (*revealed)[p - n - C] != 0; };
    const float* qh = q + r * q_stride + static_cast<int64_t>(h) * head_dim;
    const int64_t kv_offset = static_cast<int64_t>(h / group) * head_dim;
    thread_local std::vector<float> scores;
    scores.resize(keys);
    float max_score = -INFINITY;
    for (int64_t p = 0; p < keys; ++p) {
      scores[p] = sees(p) ? dot(qh, k_cache + p * kv_stride + kv_offset, head_dim) * scale : -INFINITY;
      max_score = std::max(max_score, scores[p]);
    }
    float sum = 0.0f;
    for (int64_t p = 0; p < keys; ++p) {
      scores[p] = sees(p) ? std::exp(scores[p] - max_score) : 0.0f;
      sum += scores[p];
    }
    float* o = out + r * q_stride + static_cast<int64_t>(h) * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    for (int64_t p = 0; p < keys; ++p) {
      if (sees(p)) axpy(scores[p] / sum, v_cache + p * kv_stride + kv_offset, o, head_dim);
    }
  });
}

void low_rank_add(ThreadPool& pool, const float* x, int64_t x_stride, const std::vector<int64_t>& rows,
                  const LowRank& adapter, float* y, int64_t y_stride) {
  if (!adapter.present() || rows.empty()) return;
  const int64_t m = static_cast<int64_t>(rows.size());
  const int64_t rank = adapter.a.rows(), in = adapter.a.cols(), out = adapter.b.rows();
  // Gather the rows, then two ordinary matmuls: t = x a^T [m, rank], delta = t b^T [m, out].
  thread_local std::vector<float> gathered, t, delta;
  gathered.resize(m * in);
  t.resize(m * rank);
  delta.resize(m * out);
  for (int64_t i = 0; i < m; ++i) std::copy(x + rows[i] * x_stride, x + rows[i] * x_stride + in, gathered.data() + i * in);
  matmul(pool, gathered.data(), m, adapter.a, nullptr, t.data());
  matmul(pool, t.data(), m, adapter.b, nullptr, delta.data());
  for (int64_t i = 0; i < m; ++i) add(y + rows[i] * y_stride, delta.data() + i * out, out);
}

void silu_mul(float* gate, const float* up, int64_t count) { silu_mul_vector(gate, up, count); }

void add(float* y, const float* x, int64_t count) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

}  // namespace a2d::cpu
