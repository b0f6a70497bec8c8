// The context that lookup_ngram drafts from (docs/decoding.md, "Tree", step 4): the prompt and the tokens
// confirmed so far, indexed as it grows. For every n in 1..ngram it keeps the latest start of each n-gram that
// has a token after it, so a branch costs O(ngram + depth) per forward instead of a scan of the whole context
// (at 32k tokens that scan is tens of microseconds of host time per forward).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace a2d {

constexpr int kMaxLookupNgram = 8;  // DecodeParams::lookup_ngram is checked against it

class LookupContext {
 public:
  // ngram 0: no index (branch() is then always empty); otherwise 1..kMaxLookupNgram.
  LookupContext(const std::vector<int32_t>& prompt, int ngram);

  void push(int32_t token);

  // For n = ngram down to 1: the latest earlier occurrence of the context's last n tokens that has a token
  // after it; the (at most `depth`) tokens after it, cut after the first token `is_eos` accepts. Empty when
  // no n matches.
  template <typename IsEos>
  std::vector<int32_t> branch(int32_t depth, IsEos is_eos) const {
    const int64_t start = latest_match();
    std::vector<int32_t> found;
    if (start < 0) return found;
    for (std::size_t i = static_cast<std::size_t>(start); i < tokens_.size() && static_cast<int32_t>(found.size()) < depth; ++i) {
      found.push_back(tokens_[i]);
      if (is_eos(found.back())) break;
    }
    return found;
  }

  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  using Gram = std::array<int32_t, kMaxLookupNgram>;
  struct GramHash {
    std::size_t operator()(const Gram& g) const;
  };
  Gram gram(std::size_t first, int n) const;
  // Where the continuation of the longest matched suffix starts (the token after the match), or -1.
  int64_t latest_match() const;

  int ngram_;
  std::vector<int32_t> tokens_;
  // latest_[n - 1]: n-gram -> the latest start whose n tokens are followed by one more.
  std::vector<std::unordered_map<Gram, int64_t, GramHash>> latest_;
};

}  // namespace a2d
