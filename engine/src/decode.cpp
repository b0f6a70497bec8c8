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

// True, with the result marked cancelled, once the caller asked to stop.
bool cancelled(const std::atomic<bool>* cancel, std::chrono::steady_clock::time_point started, GenerateResult& result) {
  if (cancel == nullptr || !cancel->load(std::memory_order_relaxed)) return false;
  result.finish_reason = FinishReason::cancelled;
  result.ms = elapsed_ms(started);
  return true;
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
GenerateResult generate(Backend& backend, const std::vector<int32_t>& prompt, const DecodeParams& params,
                        const BlockCallback& on_block, const std::atomic<bool>* cancel) {
  check_request(backend, prompt, params);
  const auto started = std::chrono::steady_clock::now();
  backend.reset_cache();
  const ModelConfig& config = backend.config();
  const int32_t B = params.block_size;
  const bool shift = config.shift_logits;
  const bool slide = params.advance == Advance::slide;

  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  SplitMix64 rng(params.seed);
  std::vector<int32_t> pending_commit = prompt;  // tokens the next forward appends to the cache

  // A long prompt goes in commit-only chunks first (the last one rides the first denoising forward), so
  // that a cancel is seen between chunks and no forward holds more rows than the backend runs well.
  const size_t chunk = static_cast<size_t>(std::max<int32_t>(1, backend.prefill_chunk()));
  if (params.max_tokens > 0) {
    while (pending_commit.size() > chunk) {
      if (cancelled(cancel, started, result)) return result;
      ForwardArgs args;
      args.commit.assign(pending_commit.begin(), pending_commit.begin() + static_cast<std::ptrdiff_t>(chunk));
      pending_commit.erase(pending_commit.begin(), pending_commit.begin() + static_cast<std::ptrdiff_t>(chunk));
      backend.step(args, nullptr);
      ++result.prefill_forwards;
    }
  }

  // The anchor row: with shifted logits, window position 0 is predicted by the last committed token, whose
  // logits come from the forward that commits it.
  auto commit_args = [&](ForwardArgs& args) {
    args.commit = std::move(pending_commit);
    pending_commit.clear();
    if (shift) {
      args.anchor_row = static_cast<int32_t>(args.commit.size()) - 1;
      args.logit_rows.push_back(args.anchor_row);
    }
  };

  std::vector<int32_t> window(B, config.mask_token_id);
  std::vector<bool> revealed(B, false);
  int32_t step = 0;  // denoising steps since the window last moved
  for (int64_t generated = 0; generated < params.max_tokens;) {
    const int32_t limit_len = static_cast<int32_t>(std::min<int64_t>(B, params.max_tokens - generated));
    int32_t relevant = std::min(limit_len, first_revealed_eos(params, window, revealed));

    RevealArgs reveal;
    for (int32_t j = 0; j < relevant; ++j) {
      if (!revealed[j]) reveal.candidates.push_back(j);
    }
    if (!reveal.candidates.empty()) {
      if (cancelled(cancel, started, result)) return result;
      if (params.commit == CommitPolicy::separate && !pending_commit.empty()) {
        ForwardArgs args;
        commit_args(args);
        backend.step(args, nullptr);
        ++result.forward_passes;
      }
      ForwardArgs args;
      if (!pending_commit.empty()) commit_args(args);
      args.window = window;
      const int32_t C = static_cast<int32_t>(args.commit.size());
      for (int32_t j : reveal.candidates) {
        const int32_t row = shift ? C + j - 1 : C + j;
        if (shift && j == 0 && C == 0) {
          reveal.candidate_rows.push_back(kAnchorLogits);
          continue;
        }
        if (std::find(args.logit_rows.begin(), args.logit_rows.end(), row) == args.logit_rows.end()) {
          args.logit_rows.push_back(row);
        }
        reveal.candidate_rows.push_back(
            static_cast<int32_t>(std::find(args.logit_rows.begin(), args.logit_rows.end(), row) -
                                 args.logit_rows.begin()));
      }

      const int32_t n = static_cast<int32_t>(reveal.candidates.size());
      if (params.temperature > 0.0) {
        for (int32_t c = 0; c < n; ++c) reveal.sample_draws.push_back(rng.next_double());
      }
      if (params.remasking == Remasking::random) {
        for (int32_t c = 0; c < n; ++c) reveal.priority_draws.push_back(rng.next_double());
      } else if (params.remasking == Remasking::leftmost) {
        for (int32_t c = 0; c < n; ++c) reveal.priority_draws.push_back(static_cast<double>(n - c));
      }
      const int32_t k_steps = params.steps == 0 ? 0 : (n + std::max(params.steps - step, 1) - 1) /
                                                          std::max(params.steps - step, 1);
      reveal.min_reveal = std::min(n, std::max(params.min_per_step, k_steps));
      reveal.mask_token_id = config.mask_token_id;
      reveal.temperature = params.temperature;
      reveal.top_p = params.top_p;
      reveal.threshold = params.threshold;

      StepResult stepped = backend.step(args, &reveal);
      const int64_t forward_index = result.forward_passes++;
      int32_t above = 0;
      for (const Revealed& r : stepped.revealed) {
        window[r.j] = r.token;
        revealed[r.j] = true;
        if (r.confidence > params.threshold) ++above;
      }
      ++result.steps;
      result.revealed += static_cast<int64_t>(stepped.revealed.size());
      result.topped_up += std::max(0, reveal.min_reveal - above);
      if (params.trace) {
        result.trace.push_back({forward_index, result.prompt_tokens + generated, step, std::move(reveal.candidates),
                                std::move(stepped.revealed)});
      }
      ++step;
    }

    // The revealed prefix is final: all of the window's relevant positions once no candidate is left (both
    // policies), or with advance slide whatever revealed run starts the window.
    const int32_t limit_eos = first_revealed_eos(params, window, revealed);
    relevant = std::min(limit_len, limit_eos);
    int32_t done = 0;
    while (done < relevant && revealed[done]) ++done;
    if (done < relevant && !(slide && done > 0)) continue;
    const std::vector<int32_t> finished(window.begin(), window.begin() + done);
    result.tokens.insert(result.tokens.end(), finished.begin(), finished.end());
    generated += done;
    if (on_block && !finished.empty()) on_block(finished, result.forward_passes);
    if (done == relevant && limit_eos < limit_len) {
      result.finish_reason = FinishReason::stop;
      break;
    }
    pending_commit = finished;
    window.erase(window.begin(), window.begin() + done);
    window.resize(B, config.mask_token_id);
    revealed.erase(revealed.begin(), revealed.begin() + done);
    revealed.resize(B, false);
    step = 0;
  }
  result.ms = elapsed_ms(started);
  return result;
}

}  // namespace a2d
