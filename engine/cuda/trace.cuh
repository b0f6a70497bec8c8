// Per-block timing records of the decode GEMM kernels (gemm.cu; the wide kernel writes one a warp, each warp being
// its own tile's team) and the warpgroup GEMM (gemm_wgmma.cu), for
// finding where a forward's time goes between the weight-stream floor and the measured forward (bench/gemm_trace.py).
// The records are compiled in only with A2D_GEMM_TRACE, which the GPU harness's trace build sets
// (bench/stage-device.sh TRACE=1); every other build carries the (null) pointers in its parameters and
// not one instruction.
#pragma once

#include <cstdint>

namespace a2d::cuda {

// Times are %globaltimer nanoseconds, one clock for all SMs: the block's start, the end of its wait for
// the previous kernel, the first multiply of weights (their first loads have landed), the end of its main
// loop, the end of the warps' reduction, and the block's end (after the epilogue, or after publishing its
// split when another block of the tile runs the epilogue).
struct GemmBlockRecord {
  uint64_t start, waited, first_data, loop_done, reduced, end;
  int sm;
  int site;       // which GEMM of the forward: 4 * layer + (qkv, o, gate/up, down), 4 * layers for lm_head
  int tile;       // the output tile (the warpgroup kernel: blockIdx.y); a fused row adapter's tile i: -1 - i
  int split;      // the K split (gemm.cu's block_place; the warpgroup kernel: blockIdx.z); + 1000 when this block ran
                  // the tile's epilogue
};

// A statement that only the trace build compiles.
#if defined(A2D_GEMM_TRACE)
#define A2D_TRACE(statement) statement
#else
#define A2D_TRACE(statement)
#endif

struct GemmTrace {
  GemmBlockRecord* records = nullptr;  // null: no tracing
  unsigned* count = nullptr;           // records written (those past capacity are dropped)
  unsigned capacity = 0;
};

#if defined(A2D_GEMM_TRACE)
__device__ __forceinline__ uint64_t trace_clock() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// The clock read only once `after` has been computed (its instruction has issued): a data dependence.
__device__ __forceinline__ uint64_t trace_clock_after(float after) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "f"(after));
  return t;
}
__device__ __forceinline__ int trace_sm() {
  int sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return sm;
}
// Appends one record (dropped past capacity, or when tracing is off).
__device__ __forceinline__ void trace_write(const GemmTrace& trace, const GemmBlockRecord& record) {
  if (trace.records == nullptr) return;
  const unsigned at = atomicAdd(trace.count, 1u);
  if (at < trace.capacity) trace.records[at] = record;
}
#endif

}  // namespace a2d::cuda
