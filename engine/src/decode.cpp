#include "decode.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "decode_params.h"
#include "reveal.h"

namespace a2d {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::cancelled:
      return "cancelled";
  }
  return "?";
}

int64_t positions_needed(int64_t prompt_tokens, int64_t max_tokens, int32_t block_size) {
  // The window reaches block_size - 1 positions past the last token it may reveal.
  return prompt_tokens + max_tokens + block_size - 1;
}

namespace {

bool is_eos(const DecodeParams& params, int32_t token) {
  return std::find(params.eos_token_ids.begin(), params.eos_token_ids.end(), token) !=
         params.eos_token_ids.end();
}

double elapsed_ms(std::chrono::steady_clock::time_point started) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
}

void check_request(const Backend& backend, const std::vector<int32_t>& prompt, const DecodeParams& params) {
  const ModelConfig& config = backend.config();
  validate_decode_params(params, config);
  if (prompt.empty()) throw std::runtime_error("the prompt must hold at least one token");
  for (int32_t id : prompt) {
    if (id < 0 || id >= config.vocab_size) {
      throw std::runtime_error("prompt token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                               std::to_string(config.vocab_size - 1) + ")");
    }
  }
  const int64_t needed = positions_needed(static_cast<int64_t>(prompt.size()), params.max_tokens, params.block_size);
  if (params.max_tokens > 0 && needed > backend.max_context()) {
    throw std::runtime_error("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                             std::to_string(params.max_tokens) + ") need " + std::to_string(needed) +
                             " positions at block size " + std::to_string(params.block_size) +
                             ", more than the engine's context of " + std::to_string(backend.max_context()) +
                             "; lower max_tokens or load the model with a larger maxContext");
  }
}

// The first index of a revealed EOS among the window's positions, or B.
int32_t first_revealed_eos(const DecodeParams& params, const std::vector<int32_t>& window,
                           const std::vector<bool>& revealed) {
  const int32_t B = static_cast<int32_t>(window.size());
  for (int32_t j = 0; j < B; ++j) {
    if (revealed[j] && is_eos(params, window[j])) return j;
  }
  return B;
}

}  // namespace

// The one decode loop of docs/decoding.md: a window of B positions, each denoising step one forward that
// reveals every candidate above the threshold and at least k of them by priority; the window moves on once
// wholly revealed (advance block) or past every revealed prefix (advance slide). Every committed token is
// one the denoiser's own prediction at a masked position chose.
Sequence::Sequence(const Backend& backend, std::vector<int32_t> prompt, const DecodeParams& params, BlockCallback on_block)
    : params_(params), on_block_(std::move(on_block)), rng_(params.seed) {
  check_request(backend, prompt, params);
  const ModelConfig& config = backend.config();
  mask_token_id_ = config.mask_token_id;
  shift_ = config.shift_logits;
  anchor_in_window_ = config.anchor_in_window();
  chunk_ = static_cast<size_t>(std::max<int32_t>(1, backend.prefill_chunk()));
  result_.prompt_tokens = static_cast<int64_t>(prompt.size());
  pending_commit_ = std::move(prompt);
  if (anchor_in_window_) {  // the prompt's last token opens the first window
    anchor_ = pending_commit_.back();
    pending_commit_.pop_back();
  }
  window_.assign(params.block_size, mask_token_id_);
  revealed_.assign(params.block_size, false);
}

bool Sequence::next() {
  if (finished_) return false;
  if (!running_) {
    running_ = true;
    started_ = std::chrono::steady_clock::now();
  }
  args_ = ForwardArgs{};
  reveal_ = RevealArgs{};
  kind_ = Kind::none;
  // A long prompt goes in commit-only chunks first (the last one rides the first denoising forward), so
  // that a cancel is seen between chunks and no forward holds more rows than the backend runs well.
  if (params_.max_tokens > 0 && result_.forward_passes == 0 && pending_commit_.size() > chunk_) {
    kind_ = Kind::prefill;
    const auto end = pending_commit_.begin() + static_cast<std::ptrdiff_t>(chunk_);
    args_.commit.assign(pending_commit_.begin(), end);
    pending_commit_.erase(pending_commit_.begin(), end);
    return true;
  }
  const int32_t B = params_.block_size;
  for (;;) {
    if (generated_ >= params_.max_tokens) {
      finish(FinishReason::length);
      return false;
    }
    const int32_t limit_len = static_cast<int32_t>(std::min<int64_t>(B, params_.max_tokens - generated_));
    const int32_t relevant = std::min(limit_len, first_revealed_eos(params_, window_, revealed_));
    std::vector<int32_t> candidates;
    for (int32_t j = 0; j < relevant; ++j) {
      if (!revealed_[j]) candidates.push_back(j);
    }
    if (!candidates.empty()) {
      if (params_.commit == CommitPolicy::separate && !pending_commit_.empty()) {
        kind_ = Kind::separate_commit;
        commit_args(args_);
      } else {
        prepare_denoise(candidates);
      }
      return true;
    }
    advance();
    if (finished_) return false;
  }
}

// The anchor row: with shifted logits, window position 0 is predicted by the last committed token, whose
// logits come from the forward that commits it (unless the anchor opens the window: its row is a window row).
void Sequence::commit_args(ForwardArgs& args) {
  args.commit = std::move(pending_commit_);
  pending_commit_.clear();
  if (shift_ && !anchor_in_window_) {
    args.anchor_row = static_cast<int32_t>(args.commit.size()) - 1;
    args.logit_rows.push_back(args.anchor_row);
  }
}

void Sequence::prepare_denoise(const std::vector<int32_t>& candidates) {
  kind_ = Kind::denoise;
  ForwardArgs& args = args_;
  RevealArgs& reveal = reveal_;
  reveal.candidates = candidates;
  if (!pending_commit_.empty()) commit_args(args);
  if (anchor_in_window_) args.window.push_back(anchor_);
  args.window.insert(args.window.end(), window_.begin(), window_.end());
  const int32_t C = static_cast<int32_t>(args.commit.size());
  for (int32_t j : reveal.candidates) {
    // Position j's row: the one before it (shift), which is window row j when the anchor opens the window.
    const int32_t row = anchor_in_window_ ? C + j : shift_ ? C + j - 1 : C + j;
    if (shift_ && !anchor_in_window_ && j == 0 && C == 0) {
      reveal.candidate_rows.push_back(kAnchorLogits);
      continue;
    }
    if (std::find(args.logit_rows.begin(), args.logit_rows.end(), row) == args.logit_rows.end()) {
      args.logit_rows.push_back(row);
    }
    reveal.candidate_rows.push_back(
        static_cast<int32_t>(std::find(args.logit_rows.begin(), args.logit_rows.end(), row) - args.logit_rows.begin()));
  }

  const int32_t n = static_cast<int32_t>(reveal.candidates.size());
  if (params_.temperature > 0.0) {
    for (int32_t c = 0; c < n; ++c) reveal.sample_draws.push_back(rng_.next_double());
  }
  if (params_.remasking == Remasking::random) {
    for (int32_t c = 0; c < n; ++c) reveal.priority_draws.push_back(rng_.next_double());
  } else if (params_.remasking == Remasking::leftmost) {
    for (int32_t c = 0; c < n; ++c) reveal.priority_draws.push_back(static_cast<double>(n - c));
  }
  const int32_t k_steps = params_.steps == 0 ? 0 : (n + std::max(params_.steps - step_, 1) - 1) /
                                                       std::max(params_.steps - step_, 1);
  reveal.min_reveal = std::min(n, std::max(params_.min_per_step, k_steps));
  reveal.mask_token_id = mask_token_id_;
  reveal.temperature = params_.temperature;
  reveal.top_p = params_.top_p;
  reveal.threshold = params_.threshold;
  reveal.prefix_order = params_.reveal_order == RevealOrder::prefix;
}

void Sequence::accept(StepResult stepped) {
  const Kind kind = kind_;
  kind_ = Kind::none;
  switch (kind) {
    case Kind::none:
      throw std::logic_error("Sequence::accept without a prepared forward");
    case Kind::prefill:
      ++result_.prefill_forwards;
      return;
    case Kind::separate_commit:
      ++result_.forward_passes;
      return;
    case Kind::denoise:
      break;
  }
  const int64_t forward_index = result_.forward_passes++;
  int32_t above = 0;
  for (const Revealed& r : stepped.revealed) {
    window_[r.j] = r.token;
    revealed_[r.j] = true;
    if (r.confidence > params_.threshold) ++above;
  }
  ++result_.steps;
  result_.revealed += static_cast<int64_t>(stepped.revealed.size());
  result_.topped_up += std::max(0, reveal_.min_reveal - above);
  if (params_.trace) {
    result_.trace.push_back({forward_index, result_.prompt_tokens + generated_, step_, std::move(reveal_.candidates),
                             std::move(stepped.revealed)});
  }
  ++step_;
  advance();
}

// The revealed prefix is final: all of the window's relevant positions once no candidate is left (both
// policies), or with advance slide whatever revealed run starts the window.
void Sequence::advance() {
  const int32_t B = params_.block_size;
  const int32_t limit_len = static_cast<int32_t>(std::min<int64_t>(B, params_.max_tokens - generated_));
  const int32_t limit_eos = first_revealed_eos(params_, window_, revealed_);
  const int32_t relevant = std::min(limit_len, limit_eos);
  int32_t done = 0;
  while (done < relevant && revealed_[done]) ++done;
  // The revealed run that starts the window is final (before any revealed EOS, within max_tokens): handed out now.
  if (on_block_ && done > streamed_) {
    on_block_(std::vector<int32_t>(window_.begin() + streamed_, window_.begin() + done), result_.forward_passes);
    streamed_ = done;
  }
  if (done < relevant && !(params_.advance == Advance::slide && done > 0)) return;
  streamed_ = 0;
  const std::vector<int32_t> finished(window_.begin(), window_.begin() + done);
  result_.tokens.insert(result_.tokens.end(), finished.begin(), finished.end());
  generated_ += done;
  if (done == relevant && limit_eos < limit_len) {
    finish(FinishReason::stop);
    return;
  }
  pending_commit_ = finished;
  if (anchor_in_window_) {  // the last finished token opens the next window; the old anchor is committed
    pending_commit_.insert(pending_commit_.begin(), anchor_);
    anchor_ = pending_commit_.back();
    pending_commit_.pop_back();
  }
  window_.erase(window_.begin(), window_.begin() + done);
  window_.resize(B, mask_token_id_);
  revealed_.erase(revealed_.begin(), revealed_.begin() + done);
  revealed_.resize(B, false);
  step_ = 0;
}

void Sequence::cancel() {
  if (finished_) return;
  // What was handed out of the unfinished block is final: the result holds it too.
  result_.tokens.insert(result_.tokens.end(), window_.begin(), window_.begin() + streamed_);
  generated_ += streamed_;
  streamed_ = 0;
  finish(FinishReason::cancelled);
}

void Sequence::finish(FinishReason reason) {
  finished_ = true;
  kind_ = Kind::none;
  result_.finish_reason = reason;
  result_.ms = running_ ? elapsed_ms(started_) : 0.0;
}

GenerateResult generate(Backend& backend, const std::vector<int32_t>& prompt, const DecodeParams& params,
                        const BlockCallback& on_block, const std::atomic<bool>* cancel) {
  Sequence sequence(backend, prompt, params, on_block);
  backend.reset_cache();
  while (sequence.next()) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      sequence.cancel();
      break;
    }
    sequence.accept(backend.step(sequence.args(), sequence.reveal()));
  }
  return sequence.take_result();
}

}  // namespace a2d
