#include "decode.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

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

namespace {

bool is_eos(const DecodeParams& params, int32_t token) {
  return std::find(params.eos_token_ids.begin(), params.eos_token_ids.end(), token) !=
         params.eos_token_ids.end();
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
  // The last block's window always spans a whole block, even past max_tokens; verify's window reaches
  // B-1 positions past the last token it may confirm.
  const int64_t B = params.block_size;
  if (params.remasking == Remasking::verify && 2 * B - 1 > backend.max_window()) {
    throw std::runtime_error("invalid decoding parameter: block_size " + std::to_string(B) +
                             " with remasking 'verify' needs windows of up to " + std::to_string(2 * B - 1) +
                             " positions, and this backend runs at most " + std::to_string(backend.max_window()) +
                             "; use block_size <= " + std::to_string((backend.max_window() + 1) / 2));
  }
  const int64_t needed = static_cast<int64_t>(prompt.size()) + (params.remasking == Remasking::verify
                                                                    ? params.max_tokens + B - 1
                                                                    : (params.max_tokens + B - 1) / B * B);
  if (params.max_tokens > 0 && needed > backend.max_context()) {
    throw std::runtime_error("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                             std::to_string(params.max_tokens) + ") need " + std::to_string(needed) +
                             " positions at block size " + std::to_string(B) +
                             ", more than the engine's context of " +
                             std::to_string(backend.max_context()) +
                             "; lower max_tokens or load the model with a larger maxContext");
  }
}

// remasking "verify" (docs/decoding.md, "Verify"): the window follows the confirmed tokens: the last
// forward's drafts (at most B-1), then a block of B masks. The rows of confirmed and draft tokens read
// the positions after them in order (with a mask adapter, exactly as the base does); every draft they
// choose too is kept, the first one they do not is replaced by their choice, and the drafts after it are
// dropped. When all drafts held, the reading of the first masked position is kept too and the masked rows
// after it draft the next B-1 positions.
GenerateResult generate_verify(Backend& backend, const std::vector<int32_t>& prompt, const DecodeParams& params,
                               const BlockCallback& on_block, const std::atomic<bool>* cancel,
                               std::chrono::steady_clock::time_point started) {
  const ModelConfig& config = backend.config();
  const int32_t B = params.block_size;
  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  result.finish_reason = FinishReason::length;
  SplitMix64 rng(params.seed);
  std::vector<int32_t> pending = prompt;
  std::vector<int32_t> drafts;
  auto elapsed = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  };

  for (int64_t generated = 0; generated < params.max_tokens;) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      result.finish_reason = FinishReason::cancelled;
      result.ms = elapsed();
      return result;
    }
    const int64_t left = params.max_tokens - generated;
    if (static_cast<int64_t>(drafts.size()) > left - 1) drafts.resize(static_cast<size_t>(left - 1));
    const int32_t D = static_cast<int32_t>(drafts.size());
    // Window positions read: the chain 0..D, then the drafts D+1..wanted-1.
    const int32_t wanted = static_cast<int32_t>(std::min<int64_t>(D + B, left));

    ForwardArgs args;
    args.commit = std::move(pending);
    args.window = drafts;
    args.window.resize(static_cast<size_t>(D + B), config.mask_token_id);
    const int32_t C = static_cast<int32_t>(args.commit.size());
    RevealArgs reveal;
    for (int32_t i = 0; i < wanted; ++i) {
      args.logit_rows.push_back(C - 1 + i);
      reveal.candidates.push_back(i);
      reveal.candidate_rows.push_back(i);
    }
    reveal.greedy_from = D + 1;  // the chain of readings samples; the drafts after it are greedy
    if (params.temperature > 0.0) {
      for (int32_t i = 0; i <= D; ++i) reveal.sample_draws.push_back(rng.next_double());
    }
    reveal.min_reveal = wanted;  // every candidate's choice comes back; the rule below decides
    reveal.mask_token_id = config.mask_token_id;
    reveal.temperature = params.temperature;
    reveal.top_p = params.top_p;
    reveal.threshold = params.threshold;

    const StepResult stepped = backend.step(args, &reveal);
    const int64_t forward_index = result.forward_passes++;
    const std::vector<Revealed>& choice = stepped.revealed;  // one per candidate, ascending i

    std::vector<Revealed> confirmed;
    bool stop = false;
    for (int32_t i = 0; i <= D; ++i) {
      if (is_eos(params, choice[i].token)) {
        stop = true;
        break;
      }
      confirmed.push_back(choice[i]);
      if (i == D || choice[i].token != drafts[i]) break;
    }
    std::vector<Revealed> next_drafts;
    const int32_t kept = static_cast<int32_t>(confirmed.size());
    if (!stop && kept == D + 1) {
      for (int32_t i = kept; i < wanted; ++i) {
        if (!(choice[i].confidence > params.threshold)) break;
        next_drafts.push_back({i - kept, choice[i].token, choice[i].confidence});
        if (is_eos(params, choice[i].token)) break;
      }
    }

    std::vector<int32_t> tokens;
    for (const Revealed& r : confirmed) tokens.push_back(r.token);
    drafts.clear();
    for (const Revealed& r : next_drafts) drafts.push_back(r.token);
    if (params.trace) {
      result.trace.push_back({forward_index, result.prompt_tokens + generated, 0, std::move(reveal.candidates),
                              std::move(confirmed), std::move(next_drafts)});
    }
    result.tokens.insert(result.tokens.end(), tokens.begin(), tokens.end());
    generated += kept;
    if (on_block && !tokens.empty()) on_block(tokens, result.forward_passes);
    if (stop) {
      result.finish_reason = FinishReason::stop;
      break;
    }
    pending = std::move(tokens);
  }
  result.ms = elapsed();
  return result;
}

}  // namespace

GenerateResult generate(Backend& backend, const std::vector<int32_t>& prompt, const DecodeParams& params,
                        const BlockCallback& on_block, const std::atomic<bool>* cancel) {
  check_request(backend, prompt, params);
  const auto started = std::chrono::steady_clock::now();
  backend.reset_cache();
  if (params.remasking == Remasking::verify) return generate_verify(backend, prompt, params, on_block, cancel, started);
  const ModelConfig& config = backend.config();
  const int32_t B = params.block_size;
  const bool shift = config.shift_logits;

  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  result.finish_reason = FinishReason::length;
  SplitMix64 rng(params.seed);
  std::vector<int32_t> pending_commit = prompt;  // tokens the next forward appends to the cache

  // The anchor row: with shifted logits, block position 0 is predicted by the last committed token,
  // whose logits come from the forward that commits it.
  auto commit_args = [&](ForwardArgs& args) {
    args.commit = std::move(pending_commit);
    pending_commit.clear();
    if (shift) {
      args.anchor_row = static_cast<int32_t>(args.commit.size()) - 1;
      args.logit_rows.push_back(args.anchor_row);
    }
  };

  for (int64_t generated = 0; generated < params.max_tokens;) {
    const int64_t block_start = result.prompt_tokens + generated;
    const int32_t limit_len = static_cast<int32_t>(std::min<int64_t>(B, params.max_tokens - generated));
    int32_t limit_eos = B;
    std::vector<int32_t> block(B, config.mask_token_id);

    if (params.commit == CommitPolicy::separate) {
      ForwardArgs args;
      commit_args(args);
      backend.step(args, nullptr);
      ++result.forward_passes;
    }

    for (int32_t step = 0;; ++step) {
      RevealArgs reveal;
      for (int32_t j = 0; j < std::min(limit_len, limit_eos); ++j) {
        if (block[j] == config.mask_token_id) reveal.candidates.push_back(j);
      }
      if (reveal.candidates.empty()) break;
      if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
        result.finish_reason = FinishReason::cancelled;
        result.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
        return result;
      }

      ForwardArgs args;
      if (!pending_commit.empty()) commit_args(args);
      args.window = block;
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
      for (const Revealed& r : stepped.revealed) {
        block[r.j] = r.token;
        if (is_eos(params, r.token)) limit_eos = std::min(limit_eos, r.j);
      }
      if (params.trace) {
        result.trace.push_back({forward_index, block_start, step, std::move(reveal.candidates),
                                std::move(stepped.revealed), {}});
      }
    }

    const int32_t kept = std::min(limit_len, limit_eos);
    const std::vector<int32_t> finished(block.begin(), block.begin() + kept);
    result.tokens.insert(result.tokens.end(), finished.begin(), finished.end());
    generated += kept;
    if (on_block) on_block(finished, result.forward_passes);
    if (limit_eos < limit_len) {
      result.finish_reason = FinishReason::stop;
      break;
    }
    pending_commit = block;
  }
  result.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace a2d
