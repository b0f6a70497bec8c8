// The block-diffusion decode loop of docs/decoding.md: one function for every block size, reveal rule,
// remasking, window policy and commit policy, over any Backend.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "backend.h"
#include "reveal.h"

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

// Called on the engine thread with the completion's tokens as soon as they are final: the revealed run that starts
// the window after each step (revealed tokens never change; the block's remaining tokens follow as they are
// revealed), so a client sees a block's first tokens before the block is done.
using BlockCallback = std::function<void(const std::vector<int32_t>& tokens, int64_t forward_passes)>;

// One generation as a resumable state machine: the decode loop, paused at every forward it needs. A driver
// asks for the next forward (`next`), runs it on the sequence's own KV cache (Backend::step, or one entry of
// Backend::step_batch) and hands back what it revealed (`accept`). `generate` drives one sequence, the batch
// decoder (batch.h) many at once; both run exactly this code, so a sequence's forwards, draws and tokens are
// the same whatever it is batched with.
class Sequence {
 public:
  // Checks the request against the backend's model and context; throws std::runtime_error as generate does.
  Sequence(const Backend& backend, std::vector<int32_t> prompt, const DecodeParams& params, BlockCallback on_block = {});

  // Prepares the next forward (RNG draws included) and returns true, or returns false once the generation is
  // finished. Call it again only after `accept`.
  bool next();
  const ForwardArgs& args() const { return args_; }
  // The forward's reveal decision; null for a commit-only forward (a prompt chunk, a separate commit).
  const RevealArgs* reveal() const { return kind_ == Kind::denoise ? &reveal_ : nullptr; }
  // True when the prepared forward commits prompt tokens: one of the prompt's commit-only chunks, or the first
  // forward after them, which carries the rest of the prompt.
  bool carries_prompt() const { return kind_ != Kind::none && result_.forward_passes == 0; }
  // The prepared forward's result (empty for a commit-only forward).
  void accept(StepResult stepped);
  // Ends the generation as cancelled, between forwards.
  void cancel();

  bool finished() const { return finished_; }
  const GenerateResult& result() const { return result_; }
  GenerateResult take_result() { return std::move(result_); }

 private:
  enum class Kind { none, prefill, separate_commit, denoise };
  void commit_args(ForwardArgs& args);
  void prepare_denoise(const std::vector<int32_t>& candidates);
  void advance();
  void finish(FinishReason reason);

  DecodeParams params_;
  int32_t mask_token_id_;
  bool shift_;  // shift_logits
  bool anchor_in_window_;  // the window opens with anchor_, committed one move later (ModelConfig::anchor_in_window)
  int32_t anchor_ = -1;
  BlockCallback on_block_;
  size_t chunk_;  // the backend's prefill chunk
  std::chrono::steady_clock::time_point started_;
  bool running_ = false;  // `next` has been called
  bool finished_ = false;
  GenerateResult result_;
  SplitMix64 rng_;
  std::vector<int32_t> pending_commit_;  // tokens the next forward appends to the cache
  std::vector<int32_t> window_;
  std::vector<bool> revealed_;
  int32_t step_ = 0;         // denoising steps since the window last moved
  int32_t streamed_ = 0;     // tokens of the window already handed to on_block_ (its final revealed run)
  int64_t generated_ = 0;    // completion tokens so far
  Kind kind_ = Kind::none;   // the prepared forward
  ForwardArgs args_;
  RevealArgs reveal_;
};

// Generates a completion of `prompt` on the backend's cache (slot 0). `cancel` (may be null) is checked
// between forwards (the prompt's chunks included).
// Throws std::runtime_error on invalid parameters (validate_decode_params) or a prompt + completion
// longer than the backend's context.
GenerateResult generate(Backend& backend, const std::vector<int32_t>& prompt,
                        const DecodeParams& params, const BlockCallback& on_block,
                        const std::atomic<bool>* cancel);

}  // namespace a2d
