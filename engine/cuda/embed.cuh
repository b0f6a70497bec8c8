// Embedding gather: the first residual rows, in fp32, and their sums of squares for layer 0's RMSNorm.
#pragma once

#include "common.cuh"
#include "step_state.cuh"

namespace a2d::cuda {

struct EmbedParams {
  const bf16* table;  // [vocab][hidden]
  int hidden;
  const StepState* state;  // tokens and row count
  float* residual;         // [rows][hidden]
  float* ssq_out;          // [1][kMaxRows]: one part, the whole row
};

void embed(const EmbedParams& params, int max_rows, cudaStream_t stream, bool pdl);

// A prompt chunk's rows (model.cuh, DeviceModel::prefill): residual[t] = table[tokens[t]] in fp32 for t < rows.
void embed_tokens(const bf16* table, int hidden, const int32_t* tokens, int rows, float* residual, cudaStream_t stream);

}  // namespace a2d::cuda
