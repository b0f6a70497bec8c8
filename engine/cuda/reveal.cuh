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
  // [lm_head passes][tiles][kMaxRows]: logits rows 0..kMaxRows-1 in the first pass's, then the next kMaxRows.
  const ArgmaxPartial* partials;
  int tiles;
  const StepState* state;
  TokenChoice* choices;  // [logits rows]
};

void reveal_argmax(const RevealParams& params, int max_rows, cudaStream_t stream, bool pdl);

}  // namespace a2d::cuda
