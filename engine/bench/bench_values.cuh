// What the standalone GEMM harnesses (fp8_gemm_bench.cu, gemm_prefill_bench.cu) share: values made from integer
// operations only, so the device that fills a matrix and the host that checks it agree bit for bit, bf16 bit
// conversions on the host, and a host vector's copy on the device.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "common.cuh"

namespace a2d::bench {

__host__ __device__ inline uint64_t mix64(uint64_t z) {  // SplitMix64's finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
struct Rng {  // SplitMix64: the same inputs on every run
  uint64_t state;
  uint64_t next() { return mix64(state++); }
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
};

// Weight element i of a matrix: a bf16 of magnitude 2^-12 .. 2^-4, either sign.
__host__ __device__ inline uint16_t weight_bf16(uint64_t seed, uint64_t i) {
  const uint64_t h = mix64(seed * 0x100000001B3ull + i);
  return static_cast<uint16_t>((h & 0x8000) | ((115 + (h >> 16) % 8) << 7) | ((h >> 24) & 0x7f));
}

inline uint16_t bf16_bits(float v) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
inline float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

template <typename T>
T* device_copy(const std::vector<T>& host) {
  T* p = nullptr;
  A2D_CUDA_CHECK(cudaMalloc(&p, host.size() * sizeof(T)));
  A2D_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

}  // namespace a2d::bench
