#include "reveal.cuh"

namespace a2d::cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ ArgmaxPartial merge(const ArgmaxPartial& a, const ArgmaxPartial& b) {
  if (b.index < 0) return a;
  if (a.index < 0) return b;
  const float top = fmaxf(a.max, b.max);
  ArgmaxPartial out;
  out.max = top;
  out.sum = a.sum * __expf(a.max - top) + b.sum * __expf(b.max - top);
  out.index = a.max > b.max ? a.index : (b.max > a.max ? b.index : min(a.index, b.index));
  return out;
}

__global__ void __launch_bounds__(kThreads) reveal_argmax_kernel(const RevealParams p) {
  __shared__ ArgmaxPartial warp_best[kThreads / 32];
  wait_for_previous_grid();
  const int t = blockIdx.x;
  if (t >= p.state->logit_count) return;
  // Each thread merges tiles threadIdx.x, + kThreads, ... in order; kBatch of them are requested at once (one
  // round trip to L2 per batch, not per tile).
  constexpr int kBatch = 16;
  ArgmaxPartial best{-INFINITY, 0.f, -1};
  // Logits row t's partials: its lm_head pass's [tiles][kMaxRows], column t % kMaxRows.
  const ArgmaxPartial* partials = p.partials + static_cast<size_t>(t / kMaxRows) * p.tiles * kMaxRows + t % kMaxRows;
  for (int base = threadIdx.x; base < p.tiles; base += kThreads * kBatch) {
    ArgmaxPartial batch[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int tile = base + i * kThreads;
      batch[i] = tile < p.tiles ? partials[tile * kMaxRows] : ArgmaxPartial{-INFINITY, 0.f, -1};
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) best = merge(best, batch[i]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    ArgmaxPartial other;
    other.max = __shfl_xor_sync(0xffffffffu, best.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, best.sum, offset);
    other.index = __shfl_xor_sync(0xffffffffu, best.index, offset);
    best = merge(best, other);
  }
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) best = merge(best, warp_best[w]);
    // The argmax's own term is exp(0) = 1 inside the sum.
    p.choices[t] = TokenChoice{best.index, best.index < 0 ? 0.f : 1.f / best.sum};
  }
}

}  // namespace

void reveal_argmax(const RevealParams& params, int max_rows, cudaStream_t stream, bool pdl) {
  launch(reveal_argmax_kernel, dim3(max_rows), dim3(kThreads), 0, stream, pdl, params);
}

}  // namespace a2d::cuda
