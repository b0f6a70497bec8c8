#include "backend.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "reveal.h"

namespace a2d {

int64_t resolve_max_context(const ModelConfig& config, int64_t requested) {
  const int64_t limit = config.max_position_embeddings;
  if (requested < 0) throw std::runtime_error("maxContext must be positive");
  if (requested == 0) return std::min<int64_t>(limit, 32768 + 4096);
  if (requested > limit) {
    throw std::runtime_error("maxContext " + std::to_string(requested) +
                             " exceeds the model's max_position_embeddings (" + std::to_string(limit) +
                             "); ask for at most that");
  }
  return requested;
}

StepResult Backend::step(const ForwardArgs& args, const RevealArgs* reveal) {
  return host_steps({SlotForward{0, &args, reveal}}).front();
}

int64_t Backend::slot_len(int32_t slot) const {
  if (slot != 0) throw std::logic_error("this backend has one KV cache slot");
  return cached_len();
}

void Backend::reset_slot(int32_t slot) {
  if (slot != 0) throw std::logic_error("this backend has one KV cache slot");
  reset_cache();
}

void Backend::check_batch(const std::vector<SlotForward>& batch) const {
  std::vector<bool> taken(static_cast<size_t>(max_batch()), false);
  for (const SlotForward& entry : batch) {
    if (entry.slot < 0 || entry.slot >= max_batch() || taken[entry.slot]) {
      throw std::logic_error("forward_batch: slot " + std::to_string(entry.slot) + " is not a free slot of 0.." +
                             std::to_string(max_batch() - 1));
    }
    taken[entry.slot] = true;
    const ForwardArgs& args = *entry.args;
    const int64_t n = slot_len(entry.slot);
    const int64_t T = static_cast<int64_t>(args.commit.size() + args.window.size());
    if (n + T > max_context()) {
      throw std::runtime_error("forward of " + std::to_string(T) + " tokens after " + std::to_string(n) +
                               " cached exceeds the engine's context of " + std::to_string(max_context()));
    }
    for (size_t i = 0; i < args.logit_rows.size(); ++i) {
      const int32_t row = args.logit_rows[i];
      if (row < 0 || row >= T) {
        throw std::runtime_error("logits row " + std::to_string(row) + " is outside the forward's " + std::to_string(T) +
                                 " rows");
      }
      if (i > 0 && row <= args.logit_rows[i - 1]) throw std::runtime_error("logit_rows must be ascending row indices");
    }
    if (args.anchor_row >= 0 && std::find(args.logit_rows.begin(), args.logit_rows.end(), args.anchor_row) == args.logit_rows.end()) {
      throw std::logic_error("anchor_row must be one of logit_rows");
    }
  }
}

void Backend::forward_batch(const std::vector<SlotForward>& batch, float* logits) {
  if (batch.size() != 1 || batch.front().slot != 0) {
    throw std::logic_error("this backend runs one sequence per forward (max_batch 1)");
  }
  forward(*batch.front().args, logits);
}

std::vector<StepResult> Backend::step_batch(const std::vector<SlotForward>& batch) {
  if (batch.size() == 1 && batch.front().slot == 0) return {step(*batch.front().args, batch.front().reveal)};
  return host_steps(batch);
}

std::vector<StepResult> Backend::host_steps(const std::vector<SlotForward>& batch) {
  const int32_t vocab = config_.vocab_size;
  size_t rows = 0;
  for (const SlotForward& entry : batch) rows += entry.args->logit_rows.size();
  host_logits_.resize(rows * static_cast<size_t>(vocab));
  forward_batch(batch, host_logits_.data());
  std::vector<StepResult> results(batch.size());
  size_t first = 0;  // the entry's first row in host_logits_
  for (size_t e = 0; e < batch.size(); ++e) {
    const ForwardArgs& args = *batch[e].args;
    const float* entry_logits = host_logits_.data() + first * vocab;
    first += args.logit_rows.size();
    if (host_anchors_.size() <= static_cast<size_t>(batch[e].slot)) host_anchors_.resize(batch[e].slot + 1);
    std::vector<float>& anchor = host_anchors_[batch[e].slot];
    if (args.anchor_row >= 0) {
      const auto it = std::find(args.logit_rows.begin(), args.logit_rows.end(), args.anchor_row);
      if (it == args.logit_rows.end()) throw std::logic_error("anchor_row must be one of logit_rows");
      const size_t index = static_cast<size_t>(it - args.logit_rows.begin());
      anchor.assign(entry_logits + index * vocab, entry_logits + (index + 1) * vocab);
    }
    const RevealArgs* reveal = batch[e].reveal;
    if (reveal == nullptr) continue;
    results[e] = reveal_on_host(*reveal, vocab, [&](int32_t c) {
      const int32_t source = reveal->candidate_rows[c];
      return source == kAnchorLogits ? anchor.data() : entry_logits + static_cast<size_t>(source) * vocab;
    });
  }
  return results;
}

}  // namespace a2d
