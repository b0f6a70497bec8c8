// The mask adapter on the GPU (docs/model-format.md, "Mask adapter"): for the rows of a forward that hold
// the mask token, t = A x of a GEMM's input rows (x exactly as the GEMM reads it: bf16 rows, or the
// residual normalised and rounded to bf16); the GEMM's epilogue then adds B t to those rows' outputs
// (GemmParams::adapter_b). Rows without the mask token get t = 0, so the epilogue adds nothing to them.
#pragma once

#include "common.cuh"
#include "step_state.cuh"

namespace a2d::cuda {

// Rank summed over the targets one GEMM carries (q, k and v share the QKV GEMM).
constexpr int kMaskAdapterMaxRank = 3 * 256;

struct MaskAdapterParams {
  const bf16* a;  // [rank][k], the targets' A stacked
  int rank;
  int k;
  const StepState* state;
  int mask_token_id;
  const bf16* x;             // bf16 input rows [rows][x_stride], or null
  const float* residual_in;  // or the fp32 residual [rows][x_stride], normalised by norm_weight
  int x_stride;
  const bf16* norm_weight;
  float norm_eps;
  float* t;  // [kMaxRows][rank]
};

void mask_adapter_down(const MaskAdapterParams& params, int max_rows, cudaStream_t stream, bool pdl);

}  // namespace a2d::cuda
