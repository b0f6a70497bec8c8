// e4m3 weights in the GEMM's inner loop. Hopper's tensor cores multiply bf16 by bf16 or e4m3 by e4m3, not
// e4m3 by bf16, so a weight-only FP8 GEMM turns each weight fragment into bf16 before its mma. Nothing is
// rounded there: every finite e4m3 value (3 mantissa bits, exponents 2^-9 .. 2^8) is a bf16 value, so the
// GEMM multiplies exactly the stored values and leaves the per-row scale to its epilogue.
//
// Two ways to do it, chosen at compile time (A2D_FP8_CONVERT, for engine/bench/fp8_gemm_bench.cu to time
// both; the engine builds the default):
// - cvt (default): the hardware conversion of an e4m3 pair to an f16 pair (cvt.rn.f16x2.e4m3x2, sm_89 and
//   up), then f16 -> f32 -> bf16, which is exact for these values: four instructions per pair.
// - shift: the bits moved into bf16 (sign to bit 15, exponent and mantissa to bits 10..4), which reads as
//   the value x 2^-120 (bf16's exponent bias is 127, e4m3's 7; the subnormals of both line up), then one
//   bf16x2 multiply by 2^120: also four instructions per pair, on the integer and FMA pipes instead of the
//   conversion pipe, and exact only if that multiply keeps bf16 subnormals (the harness checks every code).
#pragma once

#include <cuda_fp8.h>

#include "common.cuh"

namespace a2d::cuda {

enum class Fp8Convert { cvt, shift };
#if !defined(A2D_FP8_CONVERT)
#define A2D_FP8_CONVERT cvt
#endif
constexpr Fp8Convert kFp8Convert = Fp8Convert::A2D_FP8_CONVERT;

// The e4m3 pair in bytes 2h and 2h + 1 of `four` as one bf16x2 word (the lower byte in the low half).
template <Fp8Convert kHow = kFp8Convert>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t four, int h) {
  if constexpr (kHow == Fp8Convert::cvt) {
    const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(four >> (16 * h)), __NV_E4M3);
    const float2 f = __half22float2(__half2(pair));
    return pack_bf16(f.x, f.y);
  } else {
    const uint32_t spread = __byte_perm(four, 0, h == 0 ? 0x1404 : 0x3424);  // bytes [0, b_lo, 0, b_hi]
    const uint32_t bits = (spread & 0x80008000u) | ((spread >> 4) & 0x07f007f0u);
    const __nv_bfloat162 scaled = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits),
                                          __nv_bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80)));  // 2^120
    return *reinterpret_cast<const uint32_t*>(&scaled);
  }
}

// Eight e4m3 values (lo: the first four, hi: the last four) as the uint4 of bf16 pairs a bf16 fragment holds.
template <Fp8Convert kHow = kFp8Convert>
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint32_t lo, uint32_t hi) {
  return make_uint4(e4m3x2_to_bf16x2<kHow>(lo, 0), e4m3x2_to_bf16x2<kHow>(lo, 1), e4m3x2_to_bf16x2<kHow>(hi, 0),
                    e4m3x2_to_bf16x2<kHow>(hi, 1));
}

}  // namespace a2d::cuda
