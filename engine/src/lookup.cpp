#include "lookup.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace a2d {

LookupContext::LookupContext(const std::vector<int32_t>& prompt, int ngram) : ngram_(ngram) {
  if (ngram < 0 || ngram > kMaxLookupNgram) {
    throw std::invalid_argument("lookup_ngram must be in 0.." + std::to_string(kMaxLookupNgram) + ", got " +
                                std::to_string(ngram));
  }
  latest_.resize(static_cast<size_t>(ngram));
  tokens_.reserve(prompt.size());
  for (int32_t token : prompt) push(token);
}

size_t LookupContext::GramHash::operator()(const Gram& g) const {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int32_t t : g) {
    h ^= static_cast<uint32_t>(t);
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  return static_cast<size_t>(h);
}

LookupContext::Gram LookupContext::gram(size_t first, int n) const {
  Gram g{};
  g.fill(-1);  // no token id is negative: grams of different n never collide
  std::copy_n(tokens_.begin() + static_cast<std::ptrdiff_t>(first), n, g.begin());
  return g;
}

void LookupContext::push(int32_t token) {
  tokens_.push_back(token);
  // The n-grams that end just before the new token now have a token after them.
  const size_t size = tokens_.size();
  for (int n = 1; n <= ngram_ && static_cast<size_t>(n) < size; ++n) {
    const size_t start = size - 1 - static_cast<size_t>(n);
    latest_[static_cast<size_t>(n - 1)][gram(start, n)] = static_cast<int64_t>(start);
  }
}

int64_t LookupContext::latest_match() const {
  const size_t size = tokens_.size();
  for (int n = std::min<int>(ngram_, static_cast<int>(size) - 1); n >= 1; --n) {
    const auto& index = latest_[static_cast<size_t>(n - 1)];
    const auto it = index.find(gram(size - static_cast<size_t>(n), n));
    if (it != index.end()) return it->second + n;
  }
  return -1;
}

}  // namespace a2d
