// The host implementation of the reveal rule and the shared RNG (docs/decoding.md). Every backend's
// decisions must equal these; the CPU backend uses them directly.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend.h"

namespace a2d {

// SplitMix64, exactly as docs/decoding.md writes it; `next_double` is a double in [0, 1).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next_u64() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

struct Choice {
  int32_t token;
  double confidence;
};

// Step 1 for one candidate: the token and its confidence from one fp32 logits row. `u` is the RNG draw
// (used only when temperature > 0). The mask token is never chosen.
Choice choose_token(const float* logits, int32_t vocab, int32_t mask_token_id, double temperature,
                    double top_p, double u);

// The k greedy choices of one logits row (remasking "tree"'s guesses): by confidence descending, ties to
// the lower id; the first equals choose_token's at temperature 0, confidence included.
std::vector<Choice> top_choices(const float* logits, int32_t vocab, int32_t mask_token_id, int32_t k);

// Step 3: which candidates to reveal, as indices into the candidate list, ascending. Every candidate
// with confidence > threshold, topped up to `min_reveal` by priority (ties: lower index first).
std::vector<int32_t> select_reveals(const std::vector<double>& confidences,
                                    const std::vector<double>& priorities, double threshold,
                                    int32_t min_reveal);

// Step 3 from step 1's choices (one per candidate): select_reveals by the args' priorities, or with prefix_order
// (reveal_order "prefix") the first min_reveal candidates from the left and then each next one while it is
// adjacent to the one before it and above the threshold.
StepResult reveal_choices(const RevealArgs& args, const std::vector<Choice>& choices);

// Steps 1-3 over host logits; `row(c)` is the fp32 logits row of candidate c.
StepResult reveal_on_host(const RevealArgs& args, int32_t vocab,
                          const std::function<const float*(int32_t)>& row);

}  // namespace a2d
