#include "reveal.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace a2d {

namespace {

// Ids of the smallest set of highest-probability tokens whose probabilities sum to >= top_p, ordered by
// probability descending (ties: lower id first). Sorting the whole vocabulary for every candidate is
// wasteful, so the head is sorted in growing chunks until it holds enough mass.
std::vector<int32_t> nucleus(const std::vector<double>& p, double top_p) {
  const int32_t n = static_cast<int32_t>(p.size());
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  auto before = [&p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
  for (int32_t head = std::min<int32_t>(n, 256);; head = std::min<int32_t>(n, head * 4)) {
    std::partial_sort(ids.begin(), ids.begin() + head, ids.end(), before);
    double cumulative = 0.0;
    for (int32_t i = 0; i < head; ++i) {
      cumulative += p[ids[i]];
      if (cumulative >= top_p) {
        ids.resize(i + 1);
        return ids;
      }
    }
    if (head == n) return ids;  // rounding left the total just below top_p: keep everything
  }
}

}  // namespace

Choice choose_token(const float* logits, int32_t vocab, int32_t mask_token_id, double temperature,
                    double top_p, double u) {
  auto logit = [&](int32_t i) {
    return i == mask_token_id ? -INFINITY : static_cast<double>(logits[i]);
  };
  int32_t best = mask_token_id == 0 ? 1 : 0;
  double max_logit = logit(best);
  for (int32_t i = 0; i < vocab; ++i) {
    if (logit(i) > max_logit) {
      max_logit = logit(i);
      best = i;
    }
  }

  if (temperature == 0.0) {
    double sum = 0.0;
    for (int32_t i = 0; i < vocab; ++i) sum += std::exp(logit(i) - max_logit);
    return {best, 1.0 / sum};
  }

  std::vector<double> p(vocab);
  double sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i) {
    p[i] = std::exp((logit(i) - max_logit) / temperature);
    sum += p[i];
  }
  for (double& x : p) x /= sum;

  std::vector<int32_t> kept;
  if (top_p < 1.0) {
    kept = nucleus(p, top_p);
    std::sort(kept.begin(), kept.end());
  } else {
    kept.resize(vocab);
    std::iota(kept.begin(), kept.end(), 0);
  }
  double kept_sum = 0.0;
  for (int32_t id : kept) kept_sum += p[id];
  const double r = u * kept_sum;
  double running = 0.0;
  int32_t token = kept.back();
  for (int32_t id : kept) {
    running += p[id];
    if (running > r) {
      token = id;
      break;
    }
  }
  return {token, p[token] / kept_sum};
}

std::vector<Choice> top_choices(const float* logits, int32_t vocab, int32_t mask_token_id, int32_t k) {
  auto logit = [&](int32_t i) {
    return i == mask_token_id ? -INFINITY : static_cast<double>(logits[i]);
  };
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int32_t n = std::min(k, vocab);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
    return logit(a) > logit(b) || (logit(a) == logit(b) && a < b);
  });
  const double max_logit = logit(order[0]);
  double sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(logit(i) - max_logit);
  std::vector<Choice> out;
  for (int32_t i = 0; i < n; ++i) out.push_back({order[i], std::exp(logit(order[i]) - max_logit) / sum});
  return out;
}

std::vector<int32_t> select_reveals(const std::vector<double>& confidences,
                                    const std::vector<double>& priorities, double threshold,
                                    int32_t min_reveal) {
  const int32_t n = static_cast<int32_t>(confidences.size());
  std::vector<bool> chosen(n, false);
  int32_t count = 0;
  for (int32_t c = 0; c < n; ++c) {
    if (confidences[c] > threshold) {
      chosen[c] = true;
      ++count;
    }
  }
  if (count < min_reveal) {
    std::vector<int32_t> rest;
    for (int32_t c = 0; c < n; ++c) {
      if (!chosen[c]) rest.push_back(c);
    }
    std::stable_sort(rest.begin(), rest.end(),
                     [&](int32_t a, int32_t b) { return priorities[a] > priorities[b]; });
    for (int32_t i = 0; i < static_cast<int32_t>(rest.size()) && count < min_reveal; ++i, ++count) {
      chosen[rest[i]] = true;
    }
  }
  std::vector<int32_t> selected;
  for (int32_t c = 0; c < n; ++c) {
    if (chosen[c]) selected.push_back(c);
  }
  return selected;
}

StepResult reveal_choices(const RevealArgs& args, const std::vector<Choice>& choices) {
  std::vector<double> confidences(choices.size());
  for (size_t c = 0; c < choices.size(); ++c) confidences[c] = choices[c].confidence;
  StepResult result;
  auto reveal = [&](int32_t c) { result.revealed.push_back({args.candidates[c], choices[c].token, choices[c].confidence}); };
  if (args.prefix_order) {
    // The first k candidates from the left, then each next one while it is adjacent and above the threshold.
    const int32_t n = static_cast<int32_t>(choices.size());
    for (int32_t c = 0; c < n; ++c) {
      if (c >= args.min_reveal && !(args.candidates[c] == args.candidates[c - 1] + 1 && confidences[c] > args.threshold)) break;
      reveal(c);
    }
    return result;
  }
  const std::vector<double>& priorities = args.priority_draws.empty() ? confidences : args.priority_draws;
  for (int32_t c : select_reveals(confidences, priorities, args.threshold, args.min_reveal)) reveal(c);
  return result;
}

StepResult reveal_on_host(const RevealArgs& args, int32_t vocab,
                          const std::function<const float*(int32_t)>& row) {
  const int32_t n = static_cast<int32_t>(args.candidates.size());
  std::vector<Choice> choices(n);
  for (int32_t c = 0; c < n; ++c) {
    const double u = args.temperature > 0.0 ? args.sample_draws.at(c) : 0.0;
    choices[c] = choose_token(row(c), vocab, args.mask_token_id, args.temperature, args.top_p, u);
  }
  return reveal_choices(args, choices);
}

}  // namespace a2d
