// The CPU backend's ops: fp32 arithmetic on weights as stored (bf16/f16/f32, or e4m3 times its row's
// scale), converted to fp32 inside the inner loops so no fp32 copy of a weight matrix is ever kept.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "model.h"
#include "thread_pool.h"

namespace a2d::cpu {

// Element i of a stored tensor as fp32.
float load_element(const Tensor& t, int64_t i);

// Row `row` of a stored matrix as fp32 (t.cols() values): the conversion every matmul applies.
void load_row(const Tensor& t, int64_t row, float* dst);

// A small stored tensor (a norm weight, a bias) as an fp32 vector; empty when absent.
std::vector<float> to_fp32(const Tensor& t);

// out[m, :] = embedding row ids[m], for m < M.
void embed(const Tensor& table, const int32_t* ids, int64_t M, float* out);

// y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for W of shape [N, K]; x is [M, K], y is [M, N].
// Row-parallel over N: each weight row is converted once per tile of x rows and reused for all of them.
void matmul(ThreadPool& pool, const float* x, int64_t M, const Tensor& W, const float* bias, float* y);

// One output of `matmuls`: y = x W^T (+ bias), y of shape [M, W.rows()].
struct Projection {
  const Tensor* W;
  const float* bias;  // may be null
  float* y;
};

// Several projections of the same x (q/k/v, gate/up) in one pass over the pool. From kManyRows x rows on it
// runs matmuls_many_rows.
void matmuls(ThreadPool& pool, const float* x, int64_t M, std::initializer_list<Projection> projections);

// matmuls over consecutive row ranges of x (ranges[i] rows each: the sequences of a batched forward), every
// range multiplied exactly as matmuls multiplies it alone (the same kernel, the same grouping of its rows), so
// that a sequence's results do not depend on what it is batched with. The few-row ranges share one pass over
// the weights: a weight tile comes from memory once and meets every range's rows while it is in the cache.
void matmuls_ranges(ThreadPool& pool, const float* x, const std::vector<int64_t>& ranges,
                    const std::vector<Projection>& projections);

// x rows from which matmuls takes the many-row GEMM (a denoising forward's few rows keep the weight-streaming
// kernel; bench/NOTES.md, "CPU prefill").
constexpr int64_t kManyRows = 32;

// The same for many x rows (prompt chunks), in cpu_prefill.cpp: each weight panel (32, 16 or 8 rows by
// instruction set) is converted to fp32 once and multiplied with x in register tiles of 12 or 6 rows.
void matmuls_many_rows(ThreadPool& pool, const float* x, int64_t M, const std::vector<Projection>& projections);

// y[m, :] = w * x[m, :] / sqrt(mean(x[m, :]^2) + eps), row length n; y may alias x.
void rmsnorm(const float* x, int64_t M, int64_t n, const float* w, double eps, float* y);

// HF "rotate half" RoPE in place on `heads` heads of size head_dim per row; row m sits at positions[m].
void rope(float* x, int64_t M, int64_t row_stride, int heads, int head_dim, const int64_t* positions,
          double theta);

// The same in two parts, so that a forward computes its rows' angles once for every layer: cos and sin
// [M][head_dim / 2] of the rows' positions, then the rotation with them.
void rope_table(const int64_t* positions, int64_t M, int head_dim, double theta, float* cos_table, float* sin_table);
void rope_rotate(float* x, int64_t M, int64_t row_stride, int heads, int head_dim, const float* cos_table,
                 const float* sin_table);

// Block-causal attention for T query rows at positions n..n+T-1 against the cache [0, n+T): row r < C
// (commit) sees positions <= n+r, a window row (r >= C) sees all n+T. q/out are [T, heads*hd]; the
// caches are [positions, kv_heads*hd]. With `revealed` (T - C flags: the window row holds a real token) and a
// row adapter's `rule` (docs/decoding.md), a window row whose flag is set sees instead positions < n+C and the
// flagged window positions: at or before it (mask), or all of them (window).
void attention(ThreadPool& pool, const float* q, const float* k_cache, const float* v_cache, int64_t n,
               int64_t C, int64_t T, int heads, int kv_heads, int head_dim, float* out,
               const std::vector<uint8_t>* revealed = nullptr, AdapterRule rule = AdapterRule::mask);

// attention's rule for the C causal rows alone (row r at n + r sees keys 0..n + r), in cpu_prefill.cpp: tiles of
// query rows (token, head of the KV head's group) against tiles of keys, with an online softmax. Returns false
// (and does nothing) where the head size is not a multiple of the vector width; attention then runs the rows
// one by one.
bool causal_attention_tiled(ThreadPool& pool, const float* q, const float* k_cache, const float* v_cache, int64_t n,
                            int64_t C, int heads, int kv_heads, int head_dim, float* out);

// Tests: run the many-row kernels no higher than instruction set `level` (0 AVX-512, 1 AVX2/FMA, 2 the
// x86-64-v2 baseline), so that every clone is checked on one machine. Returns the level now in effect.
int limit_many_row_isa(int level);

// Causal rows from which attention takes causal_attention_tiled.
constexpr int64_t kTiledAttentionRows = 16;

// The mask adapter on one projection: y[m, :] += b (a x[m, :]) for each row m in `rows`; x is [*, in]
// with row stride x_stride, y has row stride y_stride. Nothing happens when the adapter is absent.
void low_rank_add(ThreadPool& pool, const float* x, int64_t x_stride, const std::vector<int64_t>& rows,
                  const LowRank& adapter, float* y, int64_t y_stride);

// gate = silu(gate) * up, elementwise over count values (vectorised, exp to 2e-7: cpu_prefill.cpp).
void silu_mul(float* gate, const float* up, int64_t count);
void silu_mul_vector(float* gate, const float* up, int64_t count);

// y += x, elementwise.
void add(float* y, const float* x, int64_t count);

}  // namespace a2d::cpu
