#include <doctest/doctest.h>

#include <cmath>

#include "reveal.h"

using namespace a2d;

TEST_CASE("SplitMix64 matches the reference sequence") {
  SplitMix64 rng(0);
  CHECK(rng.next_u64() == 0xe220a8397b1dcdafull);
  CHECK(rng.next_u64() == 0x6e789e6aa1b965f4ull);
  SplitMix64 again(0);
  again.next_u64();
  again.next_u64();
  CHECK(again.next_double() == 0.026433771592597743);
  // The state wraps mod 2^64: from the largest seed, the first step lands on golden - 1, so the
  // second output equals the first output of seed golden - 1.
  SplitMix64 top(~0ull);
  SplitMix64 wrapped(0x9E3779B97F4A7C14ull);
  top.next_u64();
  CHECK(top.next_u64() == wrapped.next_u64());
}

TEST_CASE("choose_token at temperature 0: argmax, lowest id on ties, mask never chosen") {
  const float logits[5] = {1.0f, 3.0f, 3.0f, 9.0f, 0.0f};
  Choice c = choose_token(logits, 5, /*mask=*/3, 0.0, 1.0, 0.0);
  CHECK(c.token == 1);
  const double expected = 1.0 / (std::exp(-2.0) + 1.0 + 1.0 + std::exp(-3.0));
  CHECK(c.confidence == doctest::Approx(expected).epsilon(1e-12));
  Choice first = choose_token(logits, 5, /*mask=*/4, 0.0, 1.0, 0.0);
  CHECK(first.token == 3);
}

TEST_CASE("choose_token at temperature > 0 walks the kept ids in increasing id order") {
  // p = [0.1, 0.2, 0.3, 0.4] at T = 1.
  const float logits[5] = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f), 5.0f};
  const int mask = 4;
  CHECK(choose_token(logits, 5, mask, 1.0, 1.0, 0.05).token == 0);
  CHECK(choose_token(logits, 5, mask, 1.0, 1.0, 0.15).token == 1);
  CHECK(choose_token(logits, 5, mask, 1.0, 1.0, 0.55).token == 2);
  Choice last = choose_token(logits, 5, mask, 1.0, 1.0, 0.95);
  CHECK(last.token == 3);
  CHECK(last.confidence == doctest::Approx(0.4).epsilon(1e-6));
  // top_p 0.6 keeps {3, 2} (0.4 + 0.3 crosses 0.6); r = u * 0.7 walks ids 2 then 3.
  Choice nucleus_low = choose_token(logits, 5, mask, 1.0, 0.6, 0.40);  // r = 0.28 < 0.3
  CHECK(nucleus_low.token == 2);
  CHECK(nucleus_low.confidence == doctest::Approx(0.3 / 0.7).epsilon(1e-6));
  CHECK(choose_token(logits, 5, mask, 1.0, 0.6, 0.45).token == 3);   // r = 0.315
  // A first token that alone reaches top_p is the whole nucleus.
  Choice alone = choose_token(logits, 5, mask, 1.0, 0.35, 0.0);
  CHECK(alone.token == 3);
  CHECK(alone.confidence == doctest::Approx(1.0));
}

TEST_CASE("select_reveals: threshold, then the minimum by priority, ties to the lower index") {
  CHECK(select_reveals({0.95, 0.5, 0.91}, {0.95, 0.5, 0.91}, 0.9, 1) == std::vector<int32_t>{0, 2});
  CHECK(select_reveals({0.2, 0.5, 0.3}, {0.2, 0.5, 0.3}, 0.9, 1) == std::vector<int32_t>{1});
  CHECK(select_reveals({0.2, 0.5, 0.3}, {0.2, 0.5, 0.3}, 0.9, 2) == std::vector<int32_t>{1, 2});
  CHECK(select_reveals({0.4, 0.4, 0.4}, {0.4, 0.4, 0.4}, 0.9, 2) == std::vector<int32_t>{0, 1});
  // Strictly greater than the threshold.
  CHECK(select_reveals({0.9, 0.1}, {0.9, 0.1}, 0.9, 1) == std::vector<int32_t>{0});
  CHECK(select_reveals({0.9, 0.95}, {0.9, 0.95}, 0.9, 1) == std::vector<int32_t>{1});
  // Random priorities pick the top-up, the threshold still uses confidences.
  CHECK(select_reveals({0.95, 0.1, 0.2}, {0.0, 0.3, 0.7}, 0.9, 2) == std::vector<int32_t>{0, 2});
  // Threshold 1 reveals only the minimum (pure schedule).
  CHECK(select_reveals({1.0, 0.99}, {1.0, 0.99}, 1.0, 1) == std::vector<int32_t>{0});
}

TEST_CASE("reveal_choices: reveal_order prefix reveals the run from the left, at least k, never past a gap") {
  RevealArgs args;
  args.candidates = {0, 1, 2, 3, 5};
  args.threshold = 0.5;
  // Position 1 below the threshold, 2, 3 and 5 above it.
  const std::vector<Choice> choices = {{7, 0.3}, {8, 0.4}, {9, 0.9}, {6, 0.8}, {5, 0.9}};
  auto positions = [](const StepResult& r) {
    std::vector<int32_t> j;
    for (const Revealed& x : r.revealed) j.push_back(x.j);
    return j;
  };
  // Any order: the three above the threshold.
  CHECK(positions(reveal_choices(args, choices)) == std::vector<int32_t>{2, 3, 5});
  args.prefix_order = true;
  // Prefix: the first (k = 1), then 1 stops the run though 2 and 3 pass.
  CHECK(positions(reveal_choices(args, choices)) == std::vector<int32_t>{0});
  // k = 2 takes 0 and 1, then the run goes on through 2 and 3 and stops at the gap before 5.
  args.min_reveal = 2;
  CHECK(positions(reveal_choices(args, choices)) == std::vector<int32_t>{0, 1, 2, 3});
  // Every candidate confident: all of them up to the gap.
  args.min_reveal = 1;
  CHECK(positions(reveal_choices(args, {{1, 0.9}, {2, 0.9}, {3, 0.9}, {4, 0.9}, {5, 0.9}})) == std::vector<int32_t>{0, 1, 2, 3});
}

TEST_CASE("reveal_on_host maps candidates to rows and returns ascending block positions") {
  const float rows[2][4] = {{0.0f, 10.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.1f}};
  RevealArgs args;
  args.candidates = {1, 3};
  args.candidate_rows = {1, 0};
  args.mask_token_id = 0;
  args.threshold = 0.9;
  args.min_reveal = 1;
  StepResult r = reveal_on_host(args, 4, [&](int32_t c) { return rows[args.candidate_rows[c]]; });
  REQUIRE(r.revealed.size() == 1);
  CHECK(r.revealed[0].j == 3);
  CHECK(r.revealed[0].token == 1);
  CHECK(r.revealed[0].confidence > 0.99);
}
