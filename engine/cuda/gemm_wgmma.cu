// The prefill GEMM on Hopper's warpgroup tensor cores: out[t, n] = sum_k x[t, k] * W[n, k] with the weights in the
// tiled layout of weights.cuh, the same epilogues as gemm_prefill.cu (gemm_prefill_epilogue.cuh), and wgmma fed by
// TMA. gemm_prefill.cu's mma.sync kernel runs at 102-154 TFLOP/s at 2,048 rows on the H100 (bench/NOTES.md, run
// 118): its warps issue the loads, the fragment reads and the products themselves. Here one thread issues a stage's
// four TMA copies and two consumer warpgroups each issue four wgmma a stage.
//
// The tiled layout is a TMA tensor: a 16 x 32 chunk is 16 rows of 64 contiguous bytes (tiled_index), the chunks of
// a tile follow one another along K and the tiles along the rows, so the 4-D map {32 columns, 16 rows, chunks,
// tiles} with the box {32, 16, 1, 8} copies 128 weight rows x 32 k into shared memory as 128 rows of 64 bytes.
// That is wgmma's K-major operand in the 64-byte swizzle (8-row groups 512 bytes apart), the swizzle TMA applies
// on the way in. The token rows come the same way from a 2-D map over x (box {32, tokens}). A block: 128 weight
// rows (consumer warpgroup c: rows 64c..64c+63), kTokens token rows, 64 k a stage (two chunks), a ring of stages
// with full / empty mbarriers; wgmma.m64nNk16 with N = kTokens, accumulators in registers. A consumer warp holds
// rows g and g + 8 of its 16-row slab for tokens 8j + 2c (+1), the mma.sync C fragment, hence the shared epilogue.
//
// Few rows leave most SMs idle (a block per 128 weight rows and kTokens token rows): K then splits over grid.z
// (prefill_wgmma_split), each split leaves fp32 partials and the last to arrive adds them in split order and runs
// the epilogue, as gemm_prefill.cu does. Calls of several 64-token blocks may instead run stream-K (a separate
// instantiation, prefill_wgmma_stream_split): a wave of blocks, each an equal share of the (output block, step)
// pairs, whose ring runs on from one output block into the next while the epilogue stages past it.
//
// Built for sm_90a only (the addon also carries sm_90 code, where this kernel traps: gemm_wgmma_available() probes
// which one the driver loaded, and the engine falls back to gemm_prefill.cu without it). The engine's default
// (GemmTuning::prefill_wgmma) since bench/device-prefill-gemm.sh and prefill_check --wgmma 1 passed (run 123).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "gemm_prefill.cuh"
#include "gemm_prefill_epilogue.cuh"
#include "weights.cuh"

namespace a2d::cuda {
namespace {

constexpr int kConsumers = 2;                       // consumer warpgroups, 64 weight rows each
constexpr int kBlockRows = 64 * kConsumers;         // weight rows a block: 8 tiles
constexpr int kThreads = 128 * (kConsumers + 1);    // warpgroup 0 produces (one thread issues the copies)
constexpr int kRowBytes = 64;                       // one 32-column chunk of a row: the 64-byte swizzle's span

template <int kTokens, bool kStreamK = false>
struct WgmmaLayout {
  static_assert(kTokens == 64 || kTokens == 128 || kTokens == 256, "wgmma N: the token rows a block");
  static constexpr int weight_chunk = kBlockRows * kRowBytes;  // 8 KiB
  static constexpr int input_chunk = kTokens * kRowBytes;
  static constexpr int stage_bytes = 2 * (weight_chunk + input_chunk);
  static constexpr int stages = 196 * 1024 / stage_bytes > 6 ? 6 : 196 * 1024 / stage_bytes;
  // The stream-K kernel (PrefillGemmParams::stream_blocks, 64-token blocks only): a block's next output block loads
  // into the ring while this one's epilogue runs, so the epilogues stage their tiles past the ring (the RoPE one's
  // is the largest: 64 token rows of 164 floats); the other kernels' epilogues stage in the ring.
  static_assert(!kStreamK || kTokens == 64, "stream-K at 64-token blocks");
  static constexpr int staging_bytes = kStreamK ? kTokens * (8 * 20 + 4) * 4 : stages * stage_bytes;
  // The ring aligned to 1 KiB, then the staging where it has its own.
  static constexpr int smem_bytes = stages * stage_bytes + 1024 + (kStreamK ? staging_bytes : 0);
  static_assert(stages >= 3, "a ring of at least three stages");
  static_assert(smem_bytes <= 227 * 1024, "a block's shared memory");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kSwizzleRepeat = 512;  // 8 rows of 64 bytes: the 8-row group stride of both operands

__device__ __forceinline__ uint32_t smem_address(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbarrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbarrier_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Spins until the barrier's phase of this parity has completed. A stage never takes seconds: past about ten a
// protocol fault traps (a CUDA error the caller sees) instead of hanging the stream.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, int parity) {
  uint32_t done = 0;
  const long long start = clock64();
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (!done && clock64() - start > 20'000'000'000LL) __trap();
  } while (!done);
}

__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// A K-major operand in the 64-byte swizzle: the start address, the 8-row group stride (512 bytes) and the swizzle
// mode (2: 64 bytes); the leading-dimension offset is unused by swizzled K-major operands (1 by convention).
__device__ __forceinline__ uint64_t operand_descriptor(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(kSwizzleRepeat >> 4) << 32) | (static_cast<uint64_t>(2) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads and writes across the asynchronous products.
template <int kCount>
__device__ __forceinline__ void fence_accumulators(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D (64 weight rows x N tokens, fp32) += A (64 x 16) * B (16 x N), both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n64(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_m64n128(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_m64n256(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(accumulate));
}

// A cluster's blocks (PrefillGemmParams::cluster_splits): every thread of every block arrives, then waits; the
// arrival releases this thread's shared-memory writes to the cluster and the wait acquires the others'.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release;\n barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ int cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return static_cast<int>(rank);
}
// The float4 at this block's shared address `local` in block `rank` of the cluster.
__device__ __forceinline__ float4 load_peer(uint32_t local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}

template <int kTokens>
__device__ __forceinline__ void wgmma_tokens(float (&d)[kTokens / 2], uint64_t a, uint64_t b) {
  if constexpr (kTokens == 64) wgmma_m64n64(d, a, b, 1);
  else if constexpr (kTokens == 128) wgmma_m64n128(d, a, b, 1);
  else wgmma_m64n256(d, a, b, 1);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <PrefillEpilogue kEpilogue, int kTokens, bool kStreamK = false>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_wgmma_kernel(const __grid_constant__ PrefillGemmParams p, const __grid_constant__ CUtensorMap weight_map,
                      const __grid_constant__ CUtensorMap input_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = WgmmaLayout<kTokens, kStreamK>;
  // Clustered splits (PrefillGemmParams::cluster_splits) at 64-token blocks only, the decode forwards' shape: the
  // larger blocks' kernels stay as they were (the cluster path costs them registers, and rope_qkv at 256 a spill).
  constexpr bool kClusters = kTokens == 64 && !kStreamK;
  A2D_TRACE(const uint64_t t_start = trace_clock());
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[L::stages], empty[L::stages];
  // Stage s: weight chunks 0 and 1 (128 rows x 64 bytes each), then input chunks 0 and 1 (kTokens rows x 64 bytes).
  const uint32_t ring = (smem_address(smem_raw) + 1023) & ~1023u;
  // Where the epilogues stage their tiles (WgmmaLayout::staging_bytes): past the ring, or the ring itself.
  unsigned char* const staging = smem_raw + (ring - smem_address(smem_raw)) + (kStreamK ? L::stages * L::stage_bytes : 0);
  const int warpgroup = threadIdx.x / 128;
  // The work as (output block, 64-k step) pairs numbered output block by output block, an output block u being
  // token block u % token_blocks of weight block u / token_blocks: this block's pairs are [begin, end). Without
  // stream-K, its output block's steps (blockIdx.x, blockIdx.y), or its split's range of them (grid.z); under
  // stream-K (PrefillGemmParams::stream_blocks) an equal share of every output block's steps in a row, so that a
  // block may end one output block, run whole ones and start another.
  const int all_steps = (p.k + 63) / 64;
  const int token_blocks = (p.rows + kTokens - 1) / kTokens;
  const long long total =
      kStreamK ? static_cast<long long>(token_blocks) * ((p.n_rows + kBlockRows - 1) / kBlockRows) * all_steps : 0;
  auto range_start = [&](int b) { return static_cast<int>(total * b / p.stream_blocks); };
  // The block whose range holds pair i.
  auto block_of = [&](int i) {
    int b = static_cast<int>(static_cast<long long>(i) * p.stream_blocks / max(total, 1LL));
    while (b + 1 < p.stream_blocks && range_start(b + 1) <= i) ++b;
    while (range_start(b) > i) --b;
    return b;
  };
  int begin, end;
  if (kStreamK) {
    begin = range_start(blockIdx.x);
    end = range_start(blockIdx.x + 1);
  } else {
    const int first_step = p.steps_per_split > 0 ? static_cast<int>(blockIdx.z) * p.steps_per_split : 0;
    const int last_step = p.steps_per_split > 0 ? min(all_steps, first_step + p.steps_per_split) : all_steps;
    begin = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x) * all_steps + first_step;
    end = begin + last_step - first_step;
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::stages; ++s) {
      mbarrier_init(smem_address(&full[s]), 1);
      mbarrier_init(smem_address(&empty[s]), kConsumers * 4);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // Where the next kernel is launched with PDL (a decode forward on these GEMMs), its blocks may be scheduled once
  // every block of this grid has been (and issued this): they take only what this grid leaves free, and their own
  // wait holds them until this grid has completed.
  allow_next_grid();

  if (warpgroup == 0) {
    if (threadIdx.x == 0) {
      // A stage's full barrier expects its weight and input bytes at once; the weights are constant, so the first
      // ring of them is copied before the previous kernel has finished (PDL), its inputs after. Ring entry r holds
      // pair begin + r.
      const int count = end - begin;
      const int ahead = min(count, L::stages);
      auto load_weights = [&](int r) {
        const int i = begin + r;
        const uint32_t bar = smem_address(&full[r % L::stages]);
        // Past the matrix, K or the rows TMA writes zeros and counts their bytes, a box wholly past K (the second
        // chunk of the last step of a K of 32 mod 64) included; skipping that box instead would put the products
        // in a branch, which serializes wgmma (ptxas C7520).
        mbarrier_expect_tx(bar, L::stage_bytes);
        const uint32_t stage = ring + (r % L::stages) * L::stage_bytes;
        const int tile0 = i / all_steps / token_blocks * (kBlockRows / 16);
#pragma unroll
        for (int c = 0; c < 2; ++c) tma_load_4d(stage + c * L::weight_chunk, &weight_map, 0, 0, 2 * (i % all_steps) + c, tile0, bar);
      };
      for (int r = 0; r < ahead; ++r) load_weights(r);
      wait_for_previous_grid();
      for (int r = 0; r < count; ++r) {
        const int slot = r % L::stages;
        if (r >= ahead) {
          mbarrier_wait(smem_address(&empty[slot]), (r / L::stages - 1) & 1);
          load_weights(r);
        }
        const int i = begin + r;
        const uint32_t bar = smem_address(&full[slot]);
        const uint32_t stage = ring + slot * L::stage_bytes;
        const int token0 = i / all_steps % token_blocks * kTokens;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int chunk = 2 * (i % all_steps) + c;
          tma_load_2d(stage + 2 * L::weight_chunk + c * L::input_chunk, &input_map, chunk * 32, token0, bar);
        }
      }
    } else {
      wait_for_previous_grid();
    }
    // A cluster's barriers count every thread of its blocks: the producers take part in both before leaving.
    if (kClusters && p.cluster_splits > 1) {
      cluster_barrier();
      cluster_barrier();
    }
    return;
  }
  // The epilogue reads the residual rows and the split counters earlier kernels wrote.
  wait_for_previous_grid();
  A2D_TRACE(const uint64_t t_waited = trace_clock());
  A2D_TRACE(uint64_t t_data = 0);
  // RoPE's token rows (their positions and KV slots) of the token block at token0, staged while the first stages
  // load: the epilogue then reads the rope table alone. A stream-K block restages them for another token block.
  __shared__ int token_slot[kEpilogue == PrefillEpilogue::rope_qkv ? kTokens : 1];
  __shared__ size_t token_offset[kEpilogue == PrefillEpilogue::rope_qkv ? kTokens : 1];
  int staged_token0 = -1;
  auto stage_tokens = [&](int token0) {
    if constexpr (kEpilogue == PrefillEpilogue::rope_qkv) {
      if (token0 == staged_token0) return;
      // The consumers only; the first barrier keeps the rows until every thread is done with the last ones.
      if (staged_token0 >= 0) asm volatile("bar.sync 1, %0;" ::"n"(128 * kConsumers) : "memory");
      for (int r = threadIdx.x - 128; r < kTokens; r += 128 * kConsumers) {
        const PrefillToken token = prefill_token(p, token0 + r);
        token_slot[r] = token.slot;
        token_offset[r] = token.slot_offset;
      }
      asm volatile("bar.sync 1, %0;" ::"n"(128 * kConsumers) : "memory");
      staged_token0 = token0;
    }
  };
  stage_tokens(begin / all_steps % token_blocks * kTokens);

  const int consumer = warpgroup - 1;
  const int warp = threadIdx.x / 32 % 4;  // this warp's 16-row slab of the consumer's 64 rows
  const int lane = threadIdx.x % 32;
  // This warp's 16-row tile of the output block (0-7).
  const int slab = consumer * 4 + warp;
  float acc[kTokens / 2];
  // A split's accumulators where an output block's splits meet, as [quad][consumer thread] float4s (a warp's stores
  // contiguous): publish() writes this thread's, add() sums one quad of another split's into acc.
  constexpr int kQuads = kTokens / 8;
  constexpr int kConsumerThreads = 128 * kConsumers;
  const int ct = threadIdx.x - 128;
  auto publish = [&](float4* to) {
#pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      to[q * kConsumerThreads + ct] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
    }
  };
  auto add = [&](int q, float4 v) {
    acc[4 * q] += v.x;
    acc[4 * q + 1] += v.y;
    acc[4 * q + 2] += v.z;
    acc[4 * q + 3] += v.w;
  };
  // The token rows whose results this block writes: all of them, or in a cluster split the quads (8 token rows
  // each) r, r + splits, ... of block r.
  const bool clustered = kClusters && p.cluster_splits > 1;
  const int own_stride = clustered ? p.cluster_splits : 1;
  const int own_quad = clustered ? cluster_rank() : 0;
  auto owns = [&](int token) { return token / 8 % own_stride == own_quad; };  // token: the block's row, 0..kTokens-1
  __shared__ int arrived;  // the output block's arrivals before this block's (split or stream-K)

  // An output block's sums once this block's steps of it are done: the splits' or stream-K's reduction, then the
  // epilogue. u: the output block, [unit_begin, unit_end) this block's pairs of it.
  auto finish = [&](int u, int unit_begin, int unit_end) {
    const int tile0 = u / token_blocks * (kBlockRows / 16);
    const int token0 = u % token_blocks * kTokens;
    A2D_TRACE(const uint64_t t_loop = trace_clock_after(acc[0]));
#if defined(A2D_GEMM_TRACE)
    // One record a unit, by the first consumer thread: `reduced` once its split is published (and, in the tile's
    // last block, every split summed), `end` after the epilogue; the record's tile is the output block's weight block
    // (blockIdx.y; under stream-K the output block), its split blockIdx.z (under stream-K the block).
    auto record = [&](uint64_t t_reduced, bool epilogue) {
      if (threadIdx.x != 128) return;
      trace_write(p.trace, GemmBlockRecord{t_start, t_waited, t_data, t_loop, t_reduced, trace_clock(), trace_sm(), p.site,
                                           kStreamK ? u : static_cast<int>(blockIdx.y),
                                           static_cast<int>(kStreamK ? blockIdx.x : blockIdx.z) + (epilogue ? 1000 : 0)});
    };
#endif
    A2D_TRACE(uint64_t t_reduced = t_loop);
    if (clustered) {
      // Each split leaves its accumulators in its own ring, free once both consumers' products are done; after the
      // cluster's barrier block r sums its quads of every tile from every split's ring in split order, and a second
      // barrier keeps each ring until every block has read it. Every consumer thread stays for the epilogue.
      asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
      publish(reinterpret_cast<float4*>(smem_raw + (ring - smem_address(smem_raw))));
      cluster_barrier();
#pragma unroll
      for (int q = 0; q < kQuads; ++q) {
        if (q % own_stride != own_quad) continue;
        acc[4 * q] = acc[4 * q + 1] = acc[4 * q + 2] = acc[4 * q + 3] = 0.f;
        for (int split = 0; split < p.cluster_splits; ++split) {
          add(q, load_peer(ring + static_cast<uint32_t>((q * kConsumerThreads + ct) * sizeof(float4)), split));
        }
      }
      A2D_TRACE(t_reduced = trace_clock_after(acc[0]));
      cluster_barrier();
    } else if (kStreamK) {
      // An output block whose steps span several blocks: each publishes its share in the global partials (two
      // places a block: its first output block's and its last's) and the last to arrive adds them in block order
      // (the same sums whichever arrives last).
      if (unit_begin != u * all_steps || unit_end != (u + 1) * all_steps) {
        auto part_of = [&](int b) {
          const int place = 2 * b + (range_start(b) / all_steps == u ? 0 : 1);
          return reinterpret_cast<float4*>(p.partial) + static_cast<size_t>(place) * kQuads * kConsumerThreads;
        };
        const int first = block_of(u * all_steps), last = block_of((u + 1) * all_steps - 1);
        publish(part_of(blockIdx.x));
        __threadfence();
        asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
        if (ct == 0) arrived = atomicAdd(&p.counters[u], 1);
        asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
        if (arrived != last - first) {
          A2D_TRACE(record(trace_clock(), false));
          return;
        }
        __threadfence();
#pragma unroll
        for (int i = 0; i < kTokens / 2; ++i) acc[i] = 0.f;
        for (int b = first; b <= last; ++b) {
          const float4* part = part_of(b);
#pragma unroll
          for (int q = 0; q < kQuads; ++q) add(q, __ldcg(part + q * kConsumerThreads + ct));
        }
        if (ct == 0) p.counters[u] = 0;
        A2D_TRACE(t_reduced = trace_clock_after(acc[0]));
      }
    } else if (p.steps_per_split > 0) {
      // Publish this split's accumulators in the global partials; the output block's last split to arrive adds every
      // split's in split order (the same sums whichever arrives last).
      const int block = u;
      const size_t blocks = static_cast<size_t>(gridDim.x) * gridDim.y;
      publish(reinterpret_cast<float4*>(p.partial) + (blockIdx.z * blocks + block) * kQuads * kConsumerThreads);
      __threadfence();
      asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");  // the consumers only: the producer is gone
      if (ct == 0) arrived = atomicAdd(&p.counters[block], 1);
      asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
      if (arrived != static_cast<int>(gridDim.z) - 1) {
        A2D_TRACE(record(trace_clock(), false));
        return;
      }
      __threadfence();
#pragma unroll
      for (int i = 0; i < kTokens / 2; ++i) acc[i] = 0.f;
      // Two splits' loads in flight at 64-token blocks (whose accumulators leave the registers for it).
#pragma unroll(kTokens == 64 ? 2 : 1)
      for (int split = 0; split < static_cast<int>(gridDim.z); ++split) {
        const float4* part = reinterpret_cast<const float4*>(p.partial) + (split * blocks + block) * kQuads * kConsumerThreads;
#pragma unroll
        for (int q = 0; q < kQuads; ++q) add(q, __ldcg(part + q * kConsumerThreads + ct));
      }
      if (ct == 0) p.counters[block] = 0;
      A2D_TRACE(t_reduced = trace_clock_after(acc[0]));
    }

    // The epilogues that go out through the ring stage each thread's products and bias there, once both consumers are
    // done with the ring: put(token, row, v0, v1) for every token of this thread, v0 and v1 the sums of weight rows
    // `row` and `row` + 8 of the warp's 16-row tile; every thread's are there after.
    auto stage_products = [&](auto&& put) {
      asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");  // every product is done with the ring
      const int row = lane / 4, pair = lane % 4;
      const float2 bias = prefill_tile_bias(p, tile0 + slab, row);
#pragma unroll
      for (int i = 0; i < kTokens / 4; ++i) {
        // acc[4j + h] is weight row `row` of token 8j + 2 pair + h, acc[4j + 2 + h] row `row` + 8.
        put(8 * (i / 2) + 2 * pair + i % 2, row, acc[4 * (i / 2) + i % 2] + bias.x, acc[4 * (i / 2) + 2 + i % 2] + bias.y);
      }
      asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
    };
    // The residual and RoPE epilogues' as fp32, [token][row_stride] with this warp's tile at slab x tile_stride.
    auto stage_sums = [&](float* staged, int row_stride, int tile_stride) {
      stage_products([&](int token, int row, float v0, float v1) {
        float* to = staged + token * row_stride + slab * tile_stride + row;
        to[0] = v0;
        to[8] = v1;
      });
    };

    stage_tokens(token0);
    if constexpr (kEpilogue == PrefillEpilogue::silu_mul) {
      // The SiLU results go out through the ring, free once both consumers' products have waited (the producer's
      // copies all landed before them) and, in a cluster split, once every block has read the sums: a [token][64
      // outputs] bf16 tile in shared memory, then the block's own token rows whole in 16-byte stores, where
      // prefill_epilogue_write's 2-byte stores scatter over 4 token rows a warp instruction.
      constexpr int kOut = kBlockRows / 2;  // a 16-row tile's 8 gate rows give 8 outputs (their up rows the other 8)
      constexpr int kStride = kOut + 8;     // bf16 a staged row: 144 bytes, 16-byte aligned, rows on other banks
      static_assert(kTokens * kStride * 2 <= L::staging_bytes, "the staged tile fits its staging");
      bf16* staged = reinterpret_cast<bf16*>(staging);
      // A tile's rows `row` and `row` + 8 are a gate row and its up row.
      stage_products([&](int token, int row, float gate, float up) {
        staged[token * kStride + slab * 8 + row] = __float2bfloat16(gate / (1.f + __expf(-gate)) * up);
      });
      constexpr int kChunks = kOut / 8;  // 16-byte chunks a staged row
      const int out0 = tile0 * 8;        // the block's first output column
      const bool vectors = p.out_stride % 8 == 0 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
      for (int j = ct; j < kTokens * kChunks; j += kConsumerThreads) {
        const int token = j / kChunks, col = out0 + j % kChunks * 8;
        if (token0 + token >= p.rows || col >= p.n_out || !owns(token)) continue;
        const bf16* from = staged + token * kStride + j % kChunks * 8;
        bf16* to = p.out + static_cast<size_t>(token0 + token) * p.out_stride + col;
        if (vectors && col + 8 <= p.n_out) {
          *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
        } else {
          for (int e = 0; e < 8 && col + e < p.n_out; ++e) to[e] = from[e];
        }
      }
      A2D_TRACE(record(t_reduced, true));
      return;
    } else if constexpr (kEpilogue == PrefillEpilogue::residual_add) {
      // The same for the residual sums: a [token][128 outputs] fp32 tile of products and bias, then whole residual
      // rows read, added to and written back in 16-byte chunks, each thread's reads of 8 chunks in flight before its
      // writes (a store may alias any later load). The same sums as prefill_epilogue_write's.
      constexpr int kStride = kBlockRows + 4;  // floats a staged row: 528 bytes, 16-byte aligned, rows on other banks
      static_assert(kTokens * kStride * 4 <= L::staging_bytes, "the staged tile fits its staging");
      float* staged = reinterpret_cast<float*>(staging);
      stage_sums(staged, kStride, 16);
      constexpr int kChunks = kBlockRows / 4;                          // 16-byte chunks a staged row
      constexpr int kPerThread = kTokens * kChunks / kConsumerThreads;  // 8, 16 or 32
      constexpr int kBatch = 8;
      static_assert(kPerThread % kBatch == 0, "whole batches of chunks");
      const int out0 = tile0 * 16;  // the block's first output column
      const bool vectors = p.out_stride % 4 == 0 && p.n_out % 4 == 0 && reinterpret_cast<uintptr_t>(p.residual) % 16 == 0;
      for (int k0 = 0; k0 < kPerThread; k0 += kBatch) {
        float4 sums[kBatch];
        bool live[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int j = ct + (k0 + b) * kConsumerThreads;
          const int token = j / kChunks, col = out0 + j % kChunks * 4;
          live[b] = token0 + token < p.rows && col < p.n_out && owns(token);
          float* at = p.residual + static_cast<size_t>(token0 + token) * p.out_stride + col;
          if (live[b] && vectors) sums[b] = *reinterpret_cast<const float4*>(at);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          if (!live[b]) continue;
          const int j = ct + (k0 + b) * kConsumerThreads;
          const int token = j / kChunks, col = out0 + j % kChunks * 4;
          const float* from = staged + token * kStride + j % kChunks * 4;
          float* at = p.residual + static_cast<size_t>(token0 + token) * p.out_stride + col;
          if (vectors) {
            const float4 v = *reinterpret_cast<const float4*>(from);
            *reinterpret_cast<float4*>(at) = make_float4(sums[b].x + v.x, sums[b].y + v.y, sums[b].z + v.z, sums[b].w + v.w);
          } else {
            for (int e = 0; e < 4 && col + e < p.n_out; ++e) at[e] += from[e];
          }
        }
      }
      A2D_TRACE(record(t_reduced, true));
      return;
    } else if constexpr (kEpilogue == PrefillEpilogue::rope_qkv) {
      // RoPE's results through the ring as well: the products and bias as a [token][8 tiles x 20] fp32 tile (a tile's
      // 16 rows, then 4 floats of padding: a quarter warp's reads of 8 tiles of one token fall on 8 bank groups),
      // then one thread a token row and 16-row tile: its 8 angles read as 4 16-byte loads (the rope-pair dims 8j..8j+7
      // of the tile are consecutive in the table), the pairs rotated, and the tile's two 8-dim halves of the head
      // stored as two 16-byte chunks, a warp's 8 tiles of a token together (for a 128-dim head: its 256-byte row of
      // q_out or of the KV slot). The values and sums of prefill_epilogue_write's, where every 16-byte access is
      // aligned.
      const bool vectors = reinterpret_cast<uintptr_t>(p.q_out) % 16 == 0 &&
                           reinterpret_cast<uintptr_t>(p.k_cache) % 16 == 0 && reinterpret_cast<uintptr_t>(p.v_cache) % 16 == 0 &&
                           reinterpret_cast<uintptr_t>(p.rope_table) % 16 == 0 && (p.state == nullptr || p.kv_slot_stride % 8 == 0);
      if (vectors) {
        constexpr int kTileStride = 20;                 // floats a staged 16-row tile
        constexpr int kStride = 8 * kTileStride + 4;   // floats a staged token row: 656 bytes, the pairs' writes on 32 banks
        static_assert(kTokens * kStride * 4 <= L::staging_bytes, "the staged tile fits its staging");
        float* staged = reinterpret_cast<float*>(staging);
        stage_sums(staged, kStride, kTileStride);
        const int n_tiles = (p.n_rows + 15) / 16, half = p.head_dim / 2;
        constexpr int kPerThread = kTokens * 8 / kConsumerThreads;  // 2, 4 or 8 (token row, tile) pairs
        constexpr int kBatch = kPerThread < 4 ? kPerThread : 4;      // whose angle reads are in flight together
#pragma unroll
        for (int k0 = 0; k0 < kPerThread; k0 += kBatch) {
          float4 cs[kBatch][4];
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            const int item = ct + (k0 + b) * kConsumerThreads, token = item / 8, tile = tile0 + item % 8;
            const int first_row = tile * 16, slot = token_slot[token];
            if (token0 + token < p.rows && owns(token) && tile < n_tiles && slot >= 0 &&
                first_row / p.head_dim < p.num_heads + p.num_kv_heads) {
              const float4* angles = reinterpret_cast<const float4*>(p.rope_table + static_cast<size_t>(slot) * half +
                                                                     first_row % p.head_dim / 16 * 8);
#pragma unroll
              for (int e = 0; e < 4; ++e) cs[b][e] = angles[e];
            }
          }
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            const int item = ct + (k0 + b) * kConsumerThreads, token = item / 8, tile = tile0 + item % 8;
            const int t = token0 + token, first_row = tile * 16, slot = token_slot[token];
            if (t >= p.rows || !owns(token) || tile >= n_tiles || slot < 0) continue;
            const float* from = staged + token * kStride + item % 8 * kTileStride;
            float v[16];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float4 x = *reinterpret_cast<const float4*>(from + 4 * e);
              v[4 * e] = x.x, v[4 * e + 1] = x.y, v[4 * e + 2] = x.z, v[4 * e + 3] = x.w;
            }
            const int head = first_row / p.head_dim;
            __align__(16) bf16 lo[8], hi[8];
            bf16* out;
            int at_lo, at_hi;  // where the two 8-dim chunks go in the head's row
            if (head < p.num_heads + p.num_kv_heads) {
              // Rows e and e + 8 of the tile are dims d + e and d + e + half of one q or k head (rope_pair_dim).
#pragma unroll
              for (int e = 0; e < 8; ++e) {
                const float4 c2 = cs[b][e / 2];
                const float c = e % 2 ? c2.z : c2.x, sn = e % 2 ? c2.w : c2.y;
                lo[e] = __float2bfloat16(v[e] * c - v[e + 8] * sn);
                hi[e] = __float2bfloat16(v[e + 8] * c + v[e] * sn);
              }
              at_lo = first_row % p.head_dim / 16 * 8;
              at_hi = at_lo + half;
              out = head < p.num_heads ? p.q_out + (static_cast<size_t>(t) * p.num_heads + head) * p.head_dim
                                       : p.k_cache + token_offset[token] +
                                             (static_cast<size_t>(head - p.num_heads) * p.max_context + slot) * p.head_dim;
            } else {
#pragma unroll
              for (int e = 0; e < 8; ++e) {
                lo[e] = __float2bfloat16(v[e]);
                hi[e] = __float2bfloat16(v[e + 8]);
              }
              at_lo = first_row % p.head_dim;
              at_hi = at_lo + 8;
              out = p.v_cache + token_offset[token] +
                    (static_cast<size_t>(head - p.num_heads - p.num_kv_heads) * p.max_context + slot) * p.head_dim;
            }
            *reinterpret_cast<uint4*>(out + at_lo) = *reinterpret_cast<const uint4*>(lo);
            *reinterpret_cast<uint4*>(out + at_hi) = *reinterpret_cast<const uint4*>(hi);
          }
        }
        A2D_TRACE(record(t_reduced, true));
        return;
      }
    }

    const int tile = tile0 + slab;
    if (tile >= (p.n_rows + 15) / 16) return;
    const int g = lane / 4, c = lane % 4;
    const float2 bias = prefill_tile_bias(p, tile, g);
    // Token row i = 2j + h: acc[4j + h] is row g of token 8j + 2c + h, acc[4j + 2 + h] row g + 8.
    constexpr int kBatch = kTokens == 256 && kEpilogue == PrefillEpilogue::rope_qkv ? 4 : 8;
    prefill_epilogue_rows<kEpilogue, kTokens / 4, kBatch>(
        p, tile, g, [&](int i) { return owns(8 * (i / 2)) ? token0 + 8 * (i / 2) + 2 * c + i % 2 : p.rows; },
        [&](int i) { return make_float2(acc[4 * (i / 2) + i % 2] + bias.x, acc[4 * (i / 2) + 2 + i % 2] + bias.y); },
        [&](int t) { return PrefillToken{token_slot[t - token0], token_offset[t - token0]}; });
    A2D_TRACE(record(t_reduced, true));
  };

  // This block's pairs of the output block of pair `i`, from i; returns the pair after them.
  auto run_unit = [&](int i) {
    const int u = i / all_steps;
    const int unit_begin = i, unit_end = min(end, (u + 1) * all_steps);
#pragma unroll
    for (int a = 0; a < kTokens / 2; ++a) acc[a] = 0.f;
    fence_accumulators(acc);
    for (; i < unit_end; ++i) {
      const int r = i - begin, slot = r % L::stages;
      mbarrier_wait(smem_address(&full[slot]), (r / L::stages) & 1);
      A2D_TRACE(if (r == 0) t_data = trace_clock());
      const uint32_t stage = ring + slot * L::stage_bytes;
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // the two 16-k halves of a 64-byte row
          const uint64_t a = operand_descriptor(stage + c * L::weight_chunk + consumer * 64 * kRowBytes + h * 32);
          const uint64_t b = operand_descriptor(stage + 2 * L::weight_chunk + c * L::input_chunk + h * 32);
          wgmma_tokens<kTokens>(acc, a, b);
        }
      }
      wgmma_commit();
      // The previous step's products are done: its slot goes back to the producer.
      wgmma_wait<1>();
      if (i > unit_begin && lane == 0) mbarrier_arrive(smem_address(&empty[(r - 1) % L::stages]));
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    // And the last step's slot, which stream-K's next output block loads into (elsewhere no one waits on it; skipping
    // the arrival there costs the 256-token store_bf16 kernel a spill).
    if (lane == 0) mbarrier_arrive(smem_address(&empty[(unit_end - 1 - begin) % L::stages]));
    finish(u, unit_begin, unit_end);
    return unit_end;
  };
  // One output block's steps, or its split's, unless this is the stream-K kernel (a block's pairs may run over
  // several output blocks): the larger blocks' kernels keep their straight line (a loop around the epilogues costs
  // them spills).
  if constexpr (kStreamK) {
    for (int i = begin; i < end;) i = run_unit(i);
  } else {
    run_unit(begin);
  }
#else
  __trap();  // sm_90 code: the kernel needs sm_90a's wgmma
#endif
}

// Whether the sm_90a code runs on this device: the addon also carries sm_90 code, whose kernels above trap.
__global__ void wgmma_probe_kernel(int* built) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *built = 1;
#else
  *built = 0;
#endif
}

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    A2D_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found));
#else
    A2D_CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found));
#endif
    if (found != cudaDriverEntryPointSuccess || function == nullptr) {
      throw std::runtime_error("gemm_prefill_wgmma: the driver has no cuTensorMapEncodeTiled (CUDA 12 or later needed)");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

void encode(CUtensorMap* map, const void* address, cuuint32_t rank, const cuuint64_t* dims, const cuuint64_t* strides,
            const cuuint32_t* box, const char* what) {
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result = encode_function()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(address), dims,
                                            strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error(std::string("gemm_prefill_wgmma: cuTensorMapEncodeTiled failed for the ") + what + " (CUresult " +
                             std::to_string(static_cast<int>(result)) + ")");
  }
}

template <int kTokens>
struct TokenKernels {
  using L = WgmmaLayout<kTokens>;
  using LS = WgmmaLayout<64, true>;  // the stream-K kernel's (64-token blocks)

  static void prepare() {
    for (PrefillEpilogue epilogue : kPrefillEpilogues) {
      with_prefill_epilogue(epilogue, [](auto e) {
        A2D_CUDA_CHECK(cudaFuncSetAttribute(gemm_wgmma_kernel<decltype(e)::value, kTokens>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, L::smem_bytes));
        if constexpr (kTokens == 64) {
          A2D_CUDA_CHECK(cudaFuncSetAttribute(gemm_wgmma_kernel<decltype(e)::value, 64, true>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, LS::smem_bytes));
        }
      });
    }
  }
  static void run(const PrefillGemmParams& p, PrefillEpilogue epilogue, const CUtensorMap& weight_map,
                  const CUtensorMap& input_map, int splits, cudaStream_t stream, bool pdl) {
    if constexpr (kTokens == 64) {
      if (p.stream_blocks > 0) {
        with_prefill_epilogue(epilogue, [&](auto e) {
          LaunchConfig launch_config(dim3(p.stream_blocks), dim3(kThreads), LS::smem_bytes, stream, pdl, 1u);
          A2D_CUDA_CHECK(cudaLaunchKernelEx(&launch_config.config, gemm_wgmma_kernel<decltype(e)::value, 64, true>, p,
                                            weight_map, input_map));
        });
        return;
      }
    }
    const dim3 grid(ceil_div(p.rows, kTokens), ceil_div(ceil_div(p.n_rows, 16), kBlockRows / 16), splits);
    with_prefill_epilogue(epilogue, [&](auto e) {
      // Each output block's splits as one cluster where the params ask (PrefillGemmParams::cluster_splits).
      LaunchConfig launch_config(grid, dim3(kThreads), L::smem_bytes, stream, pdl,
                                 p.cluster_splits > 1 ? static_cast<unsigned>(splits) : 1u);
      A2D_CUDA_CHECK(cudaLaunchKernelEx(&launch_config.config, gemm_wgmma_kernel<decltype(e)::value, kTokens>, p,
                                        weight_map, input_map));
    });
  }
  // How many clusters of `splits` blocks can be resident at once (the residual epilogue's kernel stands for all:
  // the same threads and shared memory).
  static int active_clusters(int splits) {
    const auto kernel = gemm_wgmma_kernel<PrefillEpilogue::residual_add, kTokens>;
    A2D_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::smem_bytes));
    LaunchConfig query(dim3(1, 1, splits), dim3(kThreads), L::smem_bytes, nullptr, false, static_cast<unsigned>(splits));
    int clusters = 0;
    A2D_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &query.config));
    return clusters;
  }
};

// A call's output blocks (block_tokens token rows x 128 weight rows), and the floats of one block's fp32 partial.
int output_blocks(int rows, int n_rows, int block_tokens) { return ceil_div(rows, block_tokens) * ceil_div(n_rows, kBlockRows); }
size_t partial_floats(int block_tokens) { return static_cast<size_t>(128 * kConsumers) * (block_tokens / 2); }

}  // namespace

PrefillSplit prefill_wgmma_split(int rows, int n_rows, int k, int sm_count, int block_tokens) {
  return plan_prefill_split(output_blocks(rows, n_rows, block_tokens), sm_count, k, partial_floats(block_tokens));
}

PrefillSplit prefill_wgmma_cluster_split(int rows, int n_rows, int k, int sm_count, int block_tokens) {
  const PrefillSplit plain = prefill_wgmma_split(rows, n_rows, k, sm_count, block_tokens);
  if (plain.steps_per_split == 0 || block_tokens != 64) return plain;  // the kernel clusters 64-token blocks only
  const int blocks = output_blocks(rows, n_rows, block_tokens);
  const int steps = ceil_div(k, 64);
  // Resident clusters a size: one query each (the answer is the device's, for the process).
  static int resident[kMaxClusterSplits + 1] = {};
  for (int want = std::min(plain.splits, kMaxClusterSplits); want >= 2; --want) {
    PrefillSplit split;
    split.steps_per_split = ceil_div(steps, want);
    split.splits = ceil_div(steps, split.steps_per_split);
    if (split.splits < 2) continue;
    int& fits = resident[split.splits];
    if (fits == 0) {
      const int clusters = TokenKernels<64>::active_clusters(split.splits);
      fits = clusters > 0 ? clusters : -1;  // -1: none fits (asked once)
    }
    if (fits >= blocks) {
      split.cluster = true;
      return split;
    }
  }
  return plain;
}

PrefillSplit prefill_wgmma_stream_split(int rows, int n_rows, int k, int sm_count, int block_tokens,
                                        const PrefillSplit& otherwise, int min_token_blocks) {
  if (block_tokens != 64 || sm_count <= 0 || rows <= 0 || ceil_div(rows, block_tokens) < min_token_blocks) return otherwise;
  const int blocks = output_blocks(rows, n_rows, block_tokens);
  const int steps = ceil_div(k, 64);
  const long long pairs = static_cast<long long>(blocks) * steps;
  if (pairs < 2LL * sm_count) return otherwise;  // every block at least two steps
  const int per_block = otherwise.steps_per_split > 0 ? otherwise.steps_per_split : steps;
  const long long waves = (static_cast<long long>(blocks) * otherwise.splits + sm_count - 1) / sm_count;
  if ((pairs + sm_count - 1) / sm_count + kStreamFixupSteps >= waves * per_block) return otherwise;
  PrefillSplit split;
  split.stream_blocks = sm_count;
  split.partial_floats = 2 * static_cast<size_t>(sm_count) * partial_floats(block_tokens);
  split.counters = blocks;
  return split;
}

bool gemm_wgmma_available() {
  static const bool available = [] {
    int device = 0, major = 0, minor = 0;
    A2D_CUDA_CHECK(cudaGetDevice(&device));
    A2D_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    A2D_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major != 9 || minor != 0) return false;  // sm_90a code runs on compute capability 9.0 alone
    int* built = nullptr;
    A2D_CUDA_CHECK(cudaMalloc(&built, sizeof(int)));
    wgmma_probe_kernel<<<1, 1>>>(built);
    A2D_CUDA_CHECK(cudaGetLastError());
    int host = 0;
    A2D_CUDA_CHECK(cudaMemcpy(&host, built, sizeof(int), cudaMemcpyDeviceToHost));
    A2D_CUDA_CHECK(cudaFree(built));
    return host == 1;
  }();
  return available;
}

void gemm_wgmma_prepare() {
  gemm_wgmma_available();  // the probe at load, not at the first prefill
  TokenKernels<64>::prepare();
  TokenKernels<128>::prepare();
  TokenKernels<256>::prepare();
}

void gemm_prefill_wgmma(const PrefillGemmParams& p, PrefillEpilogue epilogue, cudaStream_t stream, int block_tokens,
                        bool pdl) {
  if (p.rows <= 0) return;
  if (!gemm_wgmma_available()) {
    throw std::runtime_error("gemm_prefill_wgmma: this device or build has no sm_90a code (H100/H200 only); "
                             "turn GemmTuning::prefill_wgmma off");
  }
  if (p.x_stride < p.k) throw std::logic_error("gemm_prefill_wgmma: the input row stride is shorter than k");
  if (p.k % 8 != 0 || p.x_stride % 8 != 0 || reinterpret_cast<uintptr_t>(p.x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.weight) % 16 != 0) {
    throw std::runtime_error("gemm_prefill_wgmma: k and the input row stride must be multiples of 8 and both operands "
                             "16-byte aligned (TMA), got k " + std::to_string(p.k) + ", stride " + std::to_string(p.x_stride));
  }
  const int splits = p.steps_per_split > 0 ? ceil_div(ceil_div(p.k, 64), p.steps_per_split) : 1;
  if (p.cluster_splits > 1 && (p.cluster_splits != splits || splits > kMaxClusterSplits || block_tokens != 64)) {
    throw std::logic_error("gemm_prefill_wgmma: a clustered split takes every split of a 64-token output block in one "
                           "cluster of at most " + std::to_string(kMaxClusterSplits) + " (got " +
                           std::to_string(p.cluster_splits) + " of " + std::to_string(splits) + " splits, " +
                           std::to_string(block_tokens) + "-token blocks)");
  }
  if (p.stream_blocks > 0 && (block_tokens != 64 || p.steps_per_split > 0 || p.cluster_splits > 1)) {
    throw std::logic_error("gemm_prefill_wgmma: stream-K runs 64-token blocks with no other split (got " +
                           std::to_string(block_tokens) + "-token blocks, " + std::to_string(splits) + " splits)");
  }
  if ((p.stream_blocks > 0 || (p.steps_per_split > 0 && p.cluster_splits <= 1)) &&
      (p.partial == nullptr || p.counters == nullptr)) {
    throw std::logic_error("gemm_prefill_wgmma: a split K or stream-K needs its partials and counters");
  }
  check_prefill_epilogue(p, epilogue, "gemm_prefill_wgmma");
  // The tiled weights: {32 columns, 16 rows, chunks, tiles}; strides in bytes of dims 1-3.
  const cuuint64_t chunks = tiled_chunks(p.k), tiles = (p.n_rows + 15) / 16;
  const cuuint64_t weight_dims[4] = {32, 16, chunks, tiles};
  const cuuint64_t weight_strides[3] = {kRowBytes, 16 * kRowBytes, chunks * 16 * kRowBytes};
  const cuuint32_t weight_box[4] = {32, 16, 1, kBlockRows / 16};
  CUtensorMap weight_map, input_map;
  encode(&weight_map, p.weight, 4, weight_dims, weight_strides, weight_box, "weights");
  const cuuint64_t input_dims[2] = {static_cast<cuuint64_t>(p.k), static_cast<cuuint64_t>(p.rows)};
  const cuuint64_t input_strides[1] = {static_cast<cuuint64_t>(p.x_stride) * sizeof(bf16)};
  const cuuint32_t input_box[2] = {32, static_cast<cuuint32_t>(block_tokens)};
  encode(&input_map, p.x, 2, input_dims, input_strides, input_box, "inputs");
  switch (block_tokens) {
    case 64: return TokenKernels<64>::run(p, epilogue, weight_map, input_map, splits, stream, pdl);
    case 128: return TokenKernels<128>::run(p, epilogue, weight_map, input_map, splits, stream, pdl);
    case 256: return TokenKernels<256>::run(p, epilogue, weight_map, input_map, splits, stream, pdl);
    default: throw std::invalid_argument("gemm_prefill_wgmma: block tokens must be 64, 128 or 256, got " + std::to_string(block_tokens));
  }
}

}  // namespace a2d::cuda
