#include "decode.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <string>

#include "lookup.h"
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

// A generation's result before its first forward: no tokens, finish "length" unless something ends it sooner.
GenerateResult empty_result(const std::vector<int32_t>& prompt) {
  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  result.finish_reason = FinishReason::length;
  return result;
}

// Verify and tree: appends a forward's confirmed tokens to the result and reports them to `on_block`;
// false once an EOS reading ended the generation (the finish reason is then set).
bool append_confirmed(GenerateResult& result, const std::vector<int32_t>& tokens, bool stop,
                      const BlockCallback& on_block) {
  result.tokens.insert(result.tokens.end(), tokens.begin(), tokens.end());
  if (on_block && !tokens.empty()) on_block(tokens, result.forward_passes);
  if (stop) result.finish_reason = FinishReason::stop;
  return !stop;
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
  const int64_t tree_rows = tree_window_rows(params);
  if (params.remasking == Remasking::tree && tree_rows > backend.max_window()) {
    throw std::runtime_error("invalid decoding parameter: block_size " + std::to_string(B) + " with tree_width " +
                             std::to_string(params.tree_width) + (params.lookup_ngram > 0 ? " and lookup_ngram" : "") +
                             " needs windows of up to " +
                             std::to_string(tree_rows) + " rows, and this backend runs at most " +
                             std::to_string(backend.max_window()) + "; lower tree_width or block_size");
  }
  // Verify's window reaches B-1 positions past the last token it may confirm; a tree window's rows take
  // cache slots after the commit, one each, whatever their positions.
  const int64_t needed =
      static_cast<int64_t>(prompt.size()) + (params.remasking == Remasking::verify ? params.max_tokens + B - 1
                                             : params.remasking == Remasking::tree ? params.max_tokens + tree_rows
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
  GenerateResult result = empty_result(prompt);
  SplitMix64 rng(params.seed);
  std::vector<int32_t> pending = prompt;
  LookupContext context(prompt, params.lookup_ngram);  // what lookup_ngram drafts from
  std::vector<int32_t> drafts;

  for (int64_t generated = 0; generated < params.max_tokens;) {
    if (cancelled(cancel, started, result)) return result;
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
    if (params.lookup_ngram > 0 && !stop) {
      // The context's own continuation drafts instead where the masks made no drafts (after a mismatch) or
      // guessed the same first token.
      for (const Revealed& r : confirmed) context.push(r.token);
      const std::vector<int32_t> found = context.branch(B - 1, [&](int32_t t) { return is_eos(params, t); });
      if (!found.empty() && (next_drafts.empty() || found[0] == next_drafts[0].token)) {
        next_drafts.clear();
        for (size_t i = 0; i < found.size(); ++i) next_drafts.push_back({static_cast<int32_t>(i), found[i], 0.0});
      }
    }

    std::vector<int32_t> tokens;
    for (const Revealed& r : confirmed) tokens.push_back(r.token);
    drafts.clear();
    for (const Revealed& r : next_drafts) drafts.push_back(r.token);
    if (params.trace) {
      result.trace.push_back({forward_index, result.prompt_tokens + generated, 0, std::move(reveal.candidates),
                              std::move(confirmed), std::move(next_drafts), {}});
    }
    generated += kept;
    if (!append_confirmed(result, tokens, stop, on_block)) break;
    pending = std::move(tokens);
  }
  result.ms = elapsed_ms(started);
  return result;
}

// The window of one tree forward (docs/decoding.md, "Tree"): nodes branch after branch (a prefix an
// earlier branch holds is not repeated), then a group of B masks for the root and for every node.
struct TreeWindow {
  std::vector<int32_t> parents;     // per node: the node before it in its branch, -1 for the root
  std::vector<int32_t> group_rows;  // per group (root first, then each node): its first window row
};

TreeWindow lay_out_tree(const std::vector<std::vector<int32_t>>& branches, int32_t B, int32_t mask_token_id,
                        ForwardArgs& args) {
  TreeWindow tree;
  std::vector<int32_t> depths;
  for (const std::vector<int32_t>& branch : branches) {
    int32_t parent = -1;
    for (size_t d = 0; d < branch.size(); ++d) {
      int32_t shared = -1;
      for (size_t n = 0; n < tree.parents.size() && shared < 0; ++n) {
        if (tree.parents[n] == parent && args.window[n] == branch[d]) shared = static_cast<int32_t>(n);
      }
      if (shared >= 0) {  // a prefix another branch already holds: one node for both
        parent = shared;
        continue;
      }
      const int32_t row = static_cast<int32_t>(args.window.size());
      args.window.push_back(branch[d]);
      args.window_offsets.push_back(static_cast<int32_t>(d));
      args.window_visible.push_back((parent >= 0 ? args.window_visible[parent] : 0) | (uint64_t{1} << row));
      tree.parents.push_back(parent);
      depths.push_back(static_cast<int32_t>(d) + 1);
      parent = row;
    }
  }
  const int32_t nodes = static_cast<int32_t>(tree.parents.size());
  for (int32_t owner = -1; owner < nodes; ++owner) {
    const int32_t first = static_cast<int32_t>(args.window.size());
    tree.group_rows.push_back(first);
    const uint64_t own = (B >= 64 ? ~uint64_t{0} : (uint64_t{1} << B) - 1) << first;
    const uint64_t seen = (owner >= 0 ? args.window_visible[owner] : 0) | own;
    const int32_t start = owner >= 0 ? depths[owner] : 0;
    for (int32_t j = 0; j < B; ++j) {
      args.window.push_back(mask_token_id);
      args.window_offsets.push_back(start + j);
      args.window_visible.push_back(seen);
    }
  }
  return tree;
}

// remasking "tree" (docs/decoding.md, "Tree"): verify with tree_width guesses for the first position and a
// group of masks after every draft, so that whichever draft the reading stops at, the next drafts exist.
GenerateResult generate_tree(Backend& backend, const std::vector<int32_t>& prompt, const DecodeParams& params,
                             const BlockCallback& on_block, const std::atomic<bool>* cancel,
                             std::chrono::steady_clock::time_point started) {
  const ModelConfig& config = backend.config();
  const int32_t B = params.block_size, vocab = config.vocab_size;
  GenerateResult result = empty_result(prompt);
  SplitMix64 rng(params.seed);
  std::vector<int32_t> pending = prompt;
  LookupContext context(prompt, params.lookup_ngram);  // what lookup_ngram drafts from
  std::vector<std::vector<int32_t>> branches;
  std::vector<float> logits;

  for (int64_t generated = 0; generated < params.max_tokens;) {
    if (cancelled(cancel, started, result)) return result;
    const int64_t left = params.max_tokens - generated;
    std::vector<std::vector<int32_t>> cut;
    for (std::vector<int32_t>& branch : branches) {
      if (left > 1 && !branch.empty()) {
        if (static_cast<int64_t>(branch.size()) > left - 1) branch.resize(static_cast<size_t>(left - 1));
        cut.push_back(std::move(branch));
      }
    }
    ForwardArgs args;
    args.commit = std::move(pending);
    const TreeWindow tree = lay_out_tree(cut, B, config.mask_token_id, args);
    const int32_t C = static_cast<int32_t>(args.commit.size());
    const int32_t N = static_cast<int32_t>(tree.parents.size());
    args.logit_rows.push_back(C - 1);
    for (int32_t n = 0; n < N; ++n) args.logit_rows.push_back(C + n);
    for (int32_t first : tree.group_rows) {
      for (int32_t j = 0; j + 1 < B; ++j) args.logit_rows.push_back(C + first + j);
    }
    logits.resize(args.logit_rows.size() * static_cast<size_t>(vocab));
    backend.forward(args, logits.data());
    const int64_t forward_index = result.forward_passes++;
    auto row = [&](int32_t i) { return logits.data() + static_cast<size_t>(i) * vocab; };

    std::vector<Choice> readings;
    for (int32_t i = 0; i <= N; ++i) {
      const double u = params.temperature > 0.0 ? rng.next_double() : 0.0;
      readings.push_back(choose_token(row(i), vocab, config.mask_token_id, params.temperature, params.top_p, u));
    }
    std::vector<Revealed> confirmed;
    bool stop = false;
    int32_t current = -1;  // the root
    for (;;) {
      const Choice& reading = readings[static_cast<size_t>(current + 1)];
      if (is_eos(params, reading.token)) {
        stop = true;
        break;
      }
      confirmed.push_back({static_cast<int32_t>(confirmed.size()), reading.token, reading.confidence});
      int32_t child = -1;
      for (int32_t n = 0; n < N && child < 0; ++n) {
        if (tree.parents[n] == current && args.window[n] == reading.token) child = n;
      }
      if (child < 0) break;
      current = child;
    }
    std::vector<Revealed> drafts;
    std::vector<int32_t> draft_branches;
    branches.clear();
    if (!stop && B > 1) {
      const int32_t base = N + 1 + (current + 1) * (B - 1);  // the current node's group: its guesses' rows
      std::vector<Revealed> chain;
      for (int32_t j = 1; j + 1 < B; ++j) {
        const Choice guess = choose_token(row(base + j), vocab, config.mask_token_id, 0.0, 1.0, 0.0);
        if (!(guess.confidence > params.threshold)) break;
        chain.push_back({j + 1, guess.token, guess.confidence});
        if (is_eos(params, guess.token)) break;
      }
      int32_t b = 0;
      for (const Choice& first : top_choices(row(base), vocab, config.mask_token_id, params.tree_width)) {
        if (!(first.confidence > params.threshold)) continue;
        std::vector<int32_t> branch{first.token};
        drafts.push_back({1, first.token, first.confidence});
        draft_branches.push_back(b);
        if (!is_eos(params, first.token)) {
          for (const Revealed& r : chain) {
            branch.push_back(r.token);
            drafts.push_back(r);
            draft_branches.push_back(b);
          }
        }
        branches.push_back(std::move(branch));
        ++b;
      }
      if (params.lookup_ngram > 0) {
        for (const Revealed& r : confirmed) context.push(r.token);
        std::vector<int32_t> found = context.branch(B - 1, [&](int32_t t) { return is_eos(params, t); });
        for (size_t d = 0; d < found.size(); ++d) {
          drafts.push_back({static_cast<int32_t>(d) + 1, found[d], 0.0});
          draft_branches.push_back(b);
        }
        if (!found.empty()) branches.push_back(std::move(found));
      }
    }

    std::vector<int32_t> tokens;
    for (const Revealed& r : confirmed) tokens.push_back(r.token);
    if (params.trace) {
      std::vector<int32_t> candidates(static_cast<size_t>(N + 1));
      std::iota(candidates.begin(), candidates.end(), 0);
      result.trace.push_back({forward_index, result.prompt_tokens + generated, 0, std::move(candidates),
                              std::move(confirmed), std::move(drafts), std::move(draft_branches)});
    }
    generated += static_cast<int64_t>(tokens.size());
    if (!append_confirmed(result, tokens, stop, on_block)) break;
    pending = std::move(tokens);
  }
  result.ms = elapsed_ms(started);
  return result;
}

}  // namespace

GenerateResult generate(Backend& backend, const std::vector<int32_t>& prompt, const DecodeParams& params,
                        const BlockCallback& on_block, const std::atomic<bool>* cancel) {
  check_request(backend, prompt, params);
  const auto started = std::chrono::steady_clock::now();
  backend.reset_cache();
  if (params.remasking == Remasking::verify) return generate_verify(backend, prompt, params, on_block, cancel, started);
  if (params.remasking == Remasking::tree) return generate_tree(backend, prompt, params, on_block, cancel, started);
  const ModelConfig& config = backend.config();
  const int32_t B = params.block_size;
  const bool shift = config.shift_logits;

  GenerateResult result = empty_result(prompt);
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
      if (cancelled(cancel, started, result)) return result;

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
                                std::move(stepped.revealed), {}, {}});
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
  result.ms = elapsed_ms(started);
  return result;
}

}  // namespace a2d
