// The device half of a greedy denoising step: per logits row, the argmax token (the mask token
// excluded, lowest id on ties) and its softmax probability, reduced from the per-tile partials the
// lm_head GEMM leaves. Only these two numbers per row cross to the host, not 130k logits.
#pragma once

#include "common.cuh"
#include "gemm.cuh"
#include "step_state.cuh"

namespace a2d::cuda {

struct TokenChoice {
  int token;
  float confidence;
};

struct RevealParams {
  const ArgmaxPartial* partials;  // [tiles][kMaxRows]
  int tiles;
  const StepState* state;
  TokenChoice* choices;  // [kMaxRows]
};

void reveal_argmax(const RevealParams& params, int max_rows, cudaStream_t stream, bool pdl);

}  // namespace a2d::cuda
