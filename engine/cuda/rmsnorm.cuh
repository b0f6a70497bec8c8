// RMSNorm of a forward's residual rows into bf16 rows, for forwards of more than 8 rows: their GEMMs then
// read one bf16 row per token instead of re-normalising the fp32 residual row at every weight chunk, which
// made the input traffic grow with the rows (bench/NOTES.md, runs 64-66). Up to 8 rows the GEMMs normalise
// at the load (gemm.cuh, GemmInput::rmsnorm_residual), saving this kernel.
#pragma once

#include "common.cuh"
#include "step_state.cuh"

namespace a2d::cuda {

struct RmsNormParams {
  const float* residual;  // [rows][hidden]
  int hidden;
  const float* ssq_in;  // [parts][kMaxRows]: the producer's partial sums of squares of each row
  int ssq_in_parts;
  const bf16* weight;  // [hidden]
  float eps;
  const StepState* state;  // the row count
  bf16* out;               // [rows][hidden]: bf16(residual * scale * weight), as the GEMMs' normalising load
};

void rmsnorm_rows(const RmsNormParams& params, int max_rows, cudaStream_t stream, bool pdl);

// The same for a prompt chunk's rows (model.cuh, DeviceModel::prefill), each row's sum of squares computed
// here from the residual: out[t] = bf16(residual[t] * scale * weight) for t < rows. `pdl`: launched with
// programmatic dependent launch (a decode forward's chain).
void rmsnorm_prefill(const float* residual, int hidden, const bf16* weight, float eps, int rows, bf16* out,
                     cudaStream_t stream, bool pdl = false);

}  // namespace a2d::cuda
