// Shared pieces of the CUDA kernels: error checks that throw (the addon turns them into JS errors),
// bf16 packing, the tensor-core instruction the GEMM and attention use, and programmatic dependent
// launch (PDL), which lets the next kernel in the stream start loading weights while this one finishes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace a2d::cuda {

using bf16 = __nv_bfloat16;

[[noreturn]] inline void throw_cuda_error(cudaError_t error, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                           "): " + cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
}

#define A2D_CUDA_CHECK(call)                                                      \
  do {                                                                            \
    cudaError_t a2d_error_ = (call);                                              \
    if (a2d_error_ != cudaSuccess) {                                              \
      ::a2d::cuda::throw_cuda_error(a2d_error_, #call, __FILE__, __LINE__);       \
    }                                                                             \
  } while (0)

// Launch errors surface at the launch; faults surface at the next synchronization and are checked there.
#define A2D_CUDA_CHECK_LAUNCH() A2D_CUDA_CHECK(cudaGetLastError())

// A launch's configuration, for cudaLaunchKernelEx (and the occupancy queries that take one): the PDL attribute
// when `pdl` is set, and thread-block clusters of `cluster_z` blocks along z when that is above 1. Not copyable:
// `config.attrs` points into it.
struct LaunchConfig {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attributes[2] = {};

  LaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl, unsigned cluster_z = 1) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    unsigned count = 0;
    if (pdl) {
      attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attributes[count++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_z > 1) {
      attributes[count].id = cudaLaunchAttributeClusterDimension;
      attributes[count++].val.clusterDim = {1, 1, cluster_z};
    }
    config.attrs = attributes;
    config.numAttrs = count;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

// Launches `kernel` with the PDL attribute when `pdl` is set: the kernel may then begin before the
// previous kernel in the stream has finished, and must call `wait_for_previous_grid()` before it reads
// anything that kernel wrote.
template <typename... KernelArgs, typename... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
            Args&&... args) {
  LaunchConfig launch_config(grid, block, smem, stream, pdl);
  A2D_CUDA_CHECK(cudaLaunchKernelEx(&launch_config.config, kernel, std::forward<Args>(args)...));
}

// Every block of every kernel calls this before touching data written by earlier kernels, and before it
// exits: a grid then never completes before its predecessor, so completion stays transitive along the
// stream even when blocks return early. Without the PDL attribute it returns at once.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel's blocks be scheduled; its wait still blocks until this grid has completed.
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// 16-byte load of data read exactly once (weights): skip L1 so it keeps the activations.
__device__ __forceinline__ uint4 load_stream16(const void* pointer) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(pointer));
  return v;
}

// load_stream16 where `predicate` holds; otherwise `v` keeps its value (a predicated load, no branch).
__device__ __forceinline__ void load_stream16_if(uint4& v, const void* pointer, bool predicate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %4, 0;\n"
      " @p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%5];\n}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "r"(static_cast<int>(predicate)), "l"(pointer));
}

// 16-byte asynchronous copy global -> shared (sm_80+); src-size 0 zero-fills instead of reading.
__device__ __forceinline__ void cp_async16(void* smem, const void* global, bool valid) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(address), "l"(global), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float2 unpack_bf16(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
}

// D = A(16x16, row) * B(16x8, col) + D in fp32, bf16 inputs. Fragment layouts: PTX ISA, "mma.m16n8k16".
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  // Not volatile: a pure function of its operands, so the compiler may schedule loads around it.
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__host__ __device__ inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace a2d::cuda
