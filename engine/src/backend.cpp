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
  const int32_t vocab = config_.vocab_size;
  host_logits_.resize(args.logit_rows.size() * static_cast<size_t>(vocab));
  forward(args, host_logits_.data());
  if (args.anchor_row >= 0) {
    const auto it = std::find(args.logit_rows.begin(), args.logit_rows.end(), args.anchor_row);
    if (it == args.logit_rows.end()) throw std::logic_error("anchor_row must be one of logit_rows");
    const size_t index = static_cast<size_t>(it - args.logit_rows.begin());
    host_anchor_.assign(host_logits_.begin() + index * vocab, host_logits_.begin() + (index + 1) * vocab);
  }
  if (reveal == nullptr) return {};
  return reveal_on_host(*reveal, vocab, [&](int32_t c) {
    const int32_t source = reveal->candidate_rows[c];
    return source == kAnchorLogits ? host_anchor_.data()
                                   : host_logits_.data() + static_cast<size_t>(source) * vocab;
  });
}

}  // namespace a2d
