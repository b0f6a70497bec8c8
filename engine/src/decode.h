// The block-diffusion decode loop of docs/decoding.md: one function for every block size, reveal rule,
// remasking and commit policy, over any Backend.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "backend.h"

namespace a2d {

enum class FinishReason { stop, length, cancelled };

const char* finish_reason_name(FinishReason reason);

struct TraceStep {
  int64_t forward;      // index of the forward pass (docs/golden-format.md)
  int64_t block_start;  // absolute position of the block's first token
  int32_t step;         // 0-based step within the block
  std::vector<int32_t> candidates;
  std::vector<Revealed> revealed;
  std::vector<Revealed> drafts;  // remasking "verify"/"tree": the drafts this forward made, j relative to the next window
  std::vector<int32_t> draft_branches;  // remasking "tree": each draft's branch (its j is then its depth)
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  FinishReason finish_reason = FinishReason::length;
  int64_t prompt_tokens = 0;
  int64_t forward_passes = 0;
  double ms = 0.0;
  std::vector<TraceStep> trace;  // filled when params.trace
};

// Called on the engine thread with the tokens a finished block appends to the completion.
using BlockCallback = std::function<void(const std::vector<int32_t>& tokens, int64_t forward_passes)>;

// Generates a completion of `prompt`. `cancel` (may be null) is checked between denoising steps.
// Throws std::runtime_error on invalid parameters (validate_decode_params) or a prompt + completion
// longer than the backend's context.
GenerateResult generate(Backend& backend, const std::vector<int32_t>& prompt,
                        const DecodeParams& params, const BlockCallback& on_block,
                        const std::atomic<bool>* cancel);

}  // namespace a2d
