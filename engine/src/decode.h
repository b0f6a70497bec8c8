// The block-diffusion decode loop of docs/decoding.md: one function for every block size, reveal rule,
// remasking, window policy and commit policy, over any Backend.
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
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  FinishReason finish_reason = FinishReason::length;
  int64_t prompt_tokens = 0;
  int64_t forward_passes = 0;  // every forward but the prompt's commit-only chunks
  int64_t prefill_forwards = 0;  // the prompt's commit-only chunks before the first denoising forward
  int64_t steps = 0;      // denoising steps (forwards that revealed tokens)
  int64_t revealed = 0;   // tokens the steps revealed, those an EOS then cut off included
  int64_t topped_up = 0;  // of them, revealed by the min_per_step / schedule floor rather than the threshold
  double ms = 0.0;
  std::vector<TraceStep> trace;  // filled when params.trace
};

// Positions a generation may occupy (the prompt, max_tokens, and the window reaching block_size - 1 past the
// last token it may reveal): what the KV cache must hold. The server derives the room for max_tokens from it.
int64_t positions_needed(int64_t prompt_tokens, int64_t max_tokens, int32_t block_size);

// Called on the engine thread with the tokens each step commits to the completion.
using BlockCallback = std::function<void(const std::vector<int32_t>& tokens, int64_t forward_passes)>;

// Generates a completion of `prompt`. `cancel` (may be null) is checked between forwards (the prompt's
// chunks included).
// Throws std::runtime_error on invalid parameters (validate_decode_params) or a prompt + completion
// longer than the backend's context.
GenerateResult generate(Backend& backend, const std::vector<int32_t>& prompt,
                        const DecodeParams& params, const BlockCallback& on_block,
                        const std::atomic<bool>* cancel);

}  // namespace a2d
