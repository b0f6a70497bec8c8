// What the standalone GPU probes of bench/ share (stream_probe.cu, tma_probe.cu, dataflow_probe.cu,
// slice_probe.cu): the bulk copy engine's mbarrier handshake, a bf16 dot product, polling a counter that other
// blocks raise, and the timing of repeated launches.
#pragma once

#include "../engine/cuda/common.cuh"

#include <cstdint>

namespace a2d::probe {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(b)) : "memory");
}
__device__ __forceinline__ void bar_expect(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* b, unsigned parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "probe_wait:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra probe_wait;\n}" ::"r"(smem_address(b)),
      "r"(parity)
      : "memory");
}
// A ring of `stages` shared-memory stages: thread 0 initialises each stage's `full` barrier (one arrival plus the
// copy's bytes) and `empty` barrier (`consumers` arrivals), then the block synchronises.
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty, int stages, unsigned consumers) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], consumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
}
// Copies `bytes` from global memory into this block's shared memory; `b` counts them in.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(b))
               : "memory");
}

// The dot product of 8 bf16 weights with 8 bf16 inputs, in fp32.
__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&x);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(a[i]), fb = __bfloat1622float2(b[i]);
    s += fa.x * fb.x + fa.y * fb.y;
  }
  return s;
}

// Polls a counter that other blocks raise (after a __threadfence) until it reaches `target`; about a second of
// polling traps, so a wrong dependency fails the run instead of hanging it.
__device__ __forceinline__ void wait_counter(const unsigned* counter, unsigned target) {
  long long spins = 0;
  while (*reinterpret_cast<const volatile unsigned*>(counter) < target) {
    if (++spins > 400000000LL) __trap();
  }
}

// Milliseconds per call of `launch` (it enqueues one run on the default stream): one call to warm up, then the
// mean of `iterations`, launch errors and faults checked.
template <typename Launch>
float time_launches(int iterations, Launch&& launch) {
  cudaEvent_t start, stop;
  A2D_CUDA_CHECK(cudaEventCreate(&start));
  A2D_CUDA_CHECK(cudaEventCreate(&stop));
  launch();
  A2D_CUDA_CHECK(cudaGetLastError());
  A2D_CUDA_CHECK(cudaDeviceSynchronize());
  A2D_CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < iterations; ++i) launch();
  A2D_CUDA_CHECK(cudaEventRecord(stop));
  A2D_CUDA_CHECK(cudaEventSynchronize(stop));
  A2D_CUDA_CHECK(cudaGetLastError());
  float ms = 0.f;
  A2D_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  A2D_CUDA_CHECK(cudaEventDestroy(start));
  A2D_CUDA_CHECK(cudaEventDestroy(stop));
  return ms / static_cast<float>(iterations);
}

}  // namespace a2d::probe
