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

// Several projections of the same x (q/k/v, gate/up) in one pass over the pool.
void matmuls(ThreadPool& pool, const float* x, int64_t M, std::initializer_list<Projection> projections);

// y[m, :] = w * x[m, :] / sqrt(mean(x[m, :]^2) + eps), row length n; y may alias x.
void rmsnorm(const float* x, int64_t M, int64_t n, const float* w, double eps, float* y);

// HF "rotate half" RoPE in place on `heads` heads of size head_dim per row; row m sits at positions[m].
void rope(float* x, int64_t M, int64_t row_stride, int heads, int head_dim, const int64_t* positions,
          double theta);

// Block-causal attention for T query rows at positions n..n+T-1 against the cache [0, n+T): row r < C
// (commit) sees positions <= n+r, a window row (r >= C) sees all n+T. q/out are [T, heads*hd]; the
// caches are [positions, kv_heads*hd]. With `revealed` (T - C flags, the mask adapter's rule), a window
// row whose flag is set sees instead positions < n+C and the flagged window positions at or before it.
// With `visible` (T - C bit sets, a window layout: ForwardArgs::window_visible) a window row sees
// positions < n+C and the window rows whose bits are set; it overrides `revealed`.
void attention(ThreadPool& pool, const float* q, const float* k_cache, const float* v_cache, int64_t n,
               int64_t C, int64_t T, int heads, int kv_heads, int head_dim, float* out,
               const std::vector<uint8_t>* revealed = nullptr, const std::vector<uint64_t>* visible = nullptr);

// The mask adapter on one projection: y[m, :] += b (a x[m, :]) for each row m in `rows`; x is [*, in]
// with row stride x_stride, y has row stride y_stride. Nothing happens when the adapter is absent.
void low_rank_add(ThreadPool& pool, const float* x, int64_t x_stride, const std::vector<int64_t>& rows,
                  const LowRank& adapter, float* y, int64_t y_stride);

// gate = silu(gate) * up, elementwise over count values.
void silu_mul(float* gate, const float* up, int64_t count);

// y += x, elementwise.
void add(float* y, const float* x, int64_t count);

}  // namespace a2d::cpu
