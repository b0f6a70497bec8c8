// Continuous batching on the CPU backend with tiny random models: a sequence decoded in a batch is, bit for bit,
// the sequence decoded alone, whatever joins, leaves or is cancelled beside it; prompt chunks are interleaved.
#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "backend.h"
#include "batch.h"
#include "decode.h"
#include "model.h"
#include "test_util.h"

using namespace a2d;
using namespace a2d::test;

namespace {

std::vector<int32_t> prompt_of(size_t length, int32_t salt) {
  std::vector<int32_t> prompt;
  for (size_t i = 0; i < length; ++i) prompt.push_back(static_cast<int32_t>((i * 7 + salt * 13) % 37) + 1);
  return prompt;
}

struct Request {
  std::vector<int32_t> prompt;
  DecodeParams params;
};

// Steps `batch` until `count` sequences have finished, within `max_steps` steps: the step each finished at (the
// first of these calls is step 1) and its result.
struct Finishes {
  std::map<uint64_t, int> at;
  std::map<uint64_t, GenerateResult> results;
};
Finishes step_until_finished(BatchDecoder& batch, size_t count, int max_steps) {
  Finishes done;
  for (int step = 1; done.at.size() < count; ++step) {
    for (BatchDecoder::Finished& f : batch.step()) {
      done.at[f.id] = step;
      done.results[f.id] = std::move(f.result);
    }
    REQUIRE(step < max_steps);
  }
  return done;
}

DecodeParams params_of(int64_t max_tokens, int block_size) {
  DecodeParams p;
  p.max_tokens = max_tokens;
  p.block_size = block_size;
  p.threshold = 0.5;
  p.eos_token_ids = {};
  p.trace = true;
  return p;
}

// The requests of the tests: greedy and sampled, block and slide, fused and separate, blocks of 2 to 16, a
// prompt of three chunks and one-token prompts.
std::vector<Request> mixed_requests() {
  std::vector<Request> requests;
  requests.push_back({prompt_of(9, 1), params_of(20, 4)});
  DecodeParams sampled = params_of(17, 4);
  sampled.temperature = 0.8;
  sampled.top_p = 0.9;
  sampled.seed = 7;
  requests.push_back({prompt_of(5, 2), sampled});
  DecodeParams slide = params_of(23, 8);
  slide.advance = Advance::slide;
  requests.push_back({prompt_of(30, 3), slide});
  requests.push_back({prompt_of(600, 4), params_of(12, 4)});  // 256 + 256 in chunks, the rest with the window
  DecodeParams separate = params_of(16, 2);
  separate.commit = CommitPolicy::separate;
  separate.remasking = Remasking::random;
  separate.seed = 11;
  requests.push_back({prompt_of(1, 5), separate});
  DecodeParams wide = params_of(40, 16);
  wide.steps = 4;
  wide.threshold = 1.0;
  requests.push_back({prompt_of(40, 6), wide});
  DecodeParams eos = params_of(30, 4);
  eos.eos_token_ids = {2, 5, 8};
  requests.push_back({prompt_of(12, 7), eos});
  return requests;
}

void check_same(const GenerateResult& got, const GenerateResult& want) {
  CHECK(got.tokens == want.tokens);
  CHECK(got.finish_reason == want.finish_reason);
  CHECK(got.forward_passes == want.forward_passes);
  CHECK(got.prefill_forwards == want.prefill_forwards);
  CHECK(got.steps == want.steps);
  CHECK(got.revealed == want.revealed);
  CHECK(got.topped_up == want.topped_up);
  REQUIRE(got.trace.size() == want.trace.size());
  for (size_t s = 0; s < want.trace.size(); ++s) {
    CAPTURE(s);
    CHECK(got.trace[s].candidates == want.trace[s].candidates);
    REQUIRE(got.trace[s].revealed.size() == want.trace[s].revealed.size());
    for (size_t k = 0; k < want.trace[s].revealed.size(); ++k) {
      CHECK(got.trace[s].revealed[k].j == want.trace[s].revealed[k].j);
      CHECK(got.trace[s].revealed[k].token == want.trace[s].revealed[k].token);
      CHECK(got.trace[s].revealed[k].confidence == want.trace[s].revealed[k].confidence);
    }
  }
}

TinyShape batch_shape() {
  TinyShape shape;
  shape.max_positions = 1024;
  return shape;
}

}  // namespace

TEST_CASE("batch: every sequence decodes as it does alone, bit for bit, while others join, leave and are cancelled") {
  for (const bool qk_norm : {false, true}) {
    CAPTURE(qk_norm);
    TinyShape shape = batch_shape();
    shape.qk_norm = qk_norm;
    auto model = load_model(write_tiny_model(qk_norm ? "batch-mixed-qwen3" : "batch-mixed", shape, 31));
    auto backend = make_cpu_backend(*model, BackendOptions{2, 0, 4});
    REQUIRE(backend->max_batch() == 4);
    const std::vector<Request> requests = mixed_requests();
    std::vector<GenerateResult> alone;
    for (const Request& r : requests) alone.push_back(generate(*backend, r.prompt, r.params, nullptr, nullptr));

    // Two copies of every request, the second copy of request 2 cancelled after its 4th block; one joins per
    // forward while a slot is free.
    BatchDecoder batch(*backend, 4);
    const size_t total = 2 * requests.size();
    const size_t cancelled_id = requests.size() + 2;
    std::atomic<bool> cancel{false};
    int blocks_of_cancelled = 0;
    std::map<uint64_t, GenerateResult> results;
    size_t added = 0;
    int steps = 0;
    while (results.size() < total) {
      if (added < total && !batch.full()) {
        const Request& r = requests[added % requests.size()];
        BlockCallback on_block;
        if (added == cancelled_id) {
          on_block = [&](const std::vector<int32_t>&, int64_t) {
            if (++blocks_of_cancelled == 4) cancel = true;
          };
        }
        batch.add(added, std::make_unique<Sequence>(*backend, r.prompt, r.params, on_block),
                  added == cancelled_id ? &cancel : nullptr);
        ++added;
      }
      for (BatchDecoder::Finished& f : batch.step()) {
        REQUIRE(f.error.empty());
        results[f.id] = std::move(f.result);
      }
      REQUIRE(++steps < 2000);
    }
    for (size_t id = 0; id < total; ++id) {
      CAPTURE(id);
      if (id == cancelled_id) {
        CHECK(results[id].finish_reason == FinishReason::cancelled);
        const auto& want = alone[id % requests.size()].tokens;
        REQUIRE(results[id].tokens.size() < want.size());
        CHECK(std::equal(results[id].tokens.begin(), results[id].tokens.end(), want.begin()));
        continue;
      }
      check_same(results[id], alone[id % requests.size()]);
    }
    CHECK(batch.running() == 0);
    CHECK(batch.capacity() == 4);
  }
}

TEST_CASE("batch: prompts go one forward's worth at a time, while the running sequences keep decoding") {
  auto model = load_model(write_tiny_model("batch-chunks", batch_shape(), 32));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0, 3});
  BatchDecoder batch(*backend, 3);
  // A short generation, then two prompts of three chunks each join at once.
  batch.add(0, std::make_unique<Sequence>(*backend, prompt_of(6, 1), params_of(24, 4)), nullptr);
  batch.step();
  DecodeParams one_a_step = params_of(4, 4);  // threshold 1: four denoising forwards each, whatever the prompt
  one_a_step.threshold = 1.0;
  batch.add(1, std::make_unique<Sequence>(*backend, prompt_of(700, 2), one_a_step), nullptr);
  batch.add(2, std::make_unique<Sequence>(*backend, prompt_of(700, 3), one_a_step), nullptr);
  auto [finished_at, results] = step_until_finished(batch, 3, 500);
  CHECK(results[1].prefill_forwards == 2);
  CHECK(results[2].prefill_forwards == 2);
  // The short one ran in every forward from its first: its forwards are the steps it spent in the batch.
  CHECK(results[0].forward_passes == finished_at[0] + 1);
  // The second long prompt waited for the first one's three prompt forwards (two chunks, then the rest with its
  // first window): its own start three forwards later, and so its end.
  CHECK(finished_at[1] == 6);  // chunks at forwards 1 and 2, the rest with the first window at 3, then 4, 5, 6
  CHECK(finished_at[2] == finished_at[1] + 3);
  CHECK(results[1].tokens == generate(*backend, prompt_of(700, 2), one_a_step, nullptr, nullptr).tokens);
  CHECK(results[2].tokens == generate(*backend, prompt_of(700, 3), one_a_step, nullptr, nullptr).tokens);
}

TEST_CASE("batch: short prompts join together up to one prefill chunk of prompt tokens per forward") {
  auto model = load_model(write_tiny_model("batch-budget", batch_shape(), 34));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0, 5});
  REQUIRE(backend->prefill_chunk() == 256);
  DecodeParams p = params_of(4, 4);
  p.threshold = 1.0;  // four forwards each
  // Four prompts of 60 tokens fit one forward (240 <= 256); a fifth waits for the next.
  BatchDecoder batch(*backend, 5);
  for (uint64_t id = 0; id < 5; ++id) batch.add(id, std::make_unique<Sequence>(*backend, prompt_of(60, id), p), nullptr);
  CHECK(step_until_finished(batch, 5, 100).at == std::map<uint64_t, int>{{0, 4}, {1, 4}, {2, 4}, {3, 4}, {4, 5}});
}

namespace {

// The CPU backend as a backend that runs prompt parts of `alone` rows or more as work of their own would see it
// (the CUDA backend's prefill: Backend::alone_prompt_rows); every call goes to the CPU backend.
class AloneRowsBackend final : public Backend {
 public:
  AloneRowsBackend(std::unique_ptr<Backend> inner, int32_t alone)
      : Backend(inner->config(), inner->max_context()), inner_(std::move(inner)), alone_(alone) {}
  void forward(const ForwardArgs& args, float* logits) override { inner_->forward(args, logits); }
  int64_t cached_len() const override { return inner_->cached_len(); }
  void reset_cache() override { inner_->reset_cache(); }
  StepResult step(const ForwardArgs& args, const RevealArgs* reveal) override { return inner_->step(args, reveal); }
  int32_t max_window() const override { return inner_->max_window(); }
  int32_t prefill_chunk() const override { return inner_->prefill_chunk(); }
  int32_t alone_prompt_rows() const override { return alone_; }
  int32_t max_batch() const override { return inner_->max_batch(); }
  int64_t slot_len(int32_t slot) const override { return inner_->slot_len(slot); }
  void reset_slot(int32_t slot) override { inner_->reset_slot(slot); }
  void forward_batch(const std::vector<SlotForward>& batch, float* logits) override { inner_->forward_batch(batch, logits); }
  std::vector<StepResult> step_batch(const std::vector<SlotForward>& batch) override { return inner_->step_batch(batch); }

 private:
  std::unique_ptr<Backend> inner_;
  int32_t alone_;
};

}  // namespace

TEST_CASE("batch: prompts that run work of their own join one a forward, short ones beside them") {
  auto model = load_model(write_tiny_model("batch-alone", batch_shape(), 35));
  AloneRowsBackend backend(make_cpu_backend(*model, BackendOptions{2, 0, 5}), 65);
  DecodeParams p = params_of(4, 4);
  p.threshold = 1.0;  // four forwards each
  // Three prompts of 100 tokens (over 65 rows with the window: each runs alone) and two of 20 join at once: by the
  // prompt budget alone the first forward would carry all but the third long one (240 of 256 rows); with the rule,
  // one long prompt a forward, the short ones with the first.
  BatchDecoder batch(backend, 5);
  const size_t lengths[] = {100, 100, 20, 100, 20};
  for (uint64_t id = 0; id < 5; ++id) batch.add(id, std::make_unique<Sequence>(backend, prompt_of(lengths[id], id), p), nullptr);
  auto [finished_at, results] = step_until_finished(batch, 5, 100);
  CHECK(finished_at == std::map<uint64_t, int>{{0, 4}, {1, 5}, {2, 4}, {3, 6}, {4, 4}});
  for (uint64_t id = 0; id < 5; ++id) {
    CAPTURE(id);
    check_same(results[id], generate(backend, prompt_of(lengths[id], id), p, nullptr, nullptr));
  }
}

TEST_CASE("batch: a full decoder refuses another sequence, and a backend of one slot holds one") {
  auto model = load_model(write_tiny_model("batch-full", batch_shape(), 33));
  auto one = make_cpu_backend(*model, BackendOptions{2, 0});
  CHECK(one->max_batch() == 1);
  BatchDecoder single(*one, 8);  // no more than the backend's slots
  CHECK(single.capacity() == 1);
  single.add(0, std::make_unique<Sequence>(*one, prompt_of(4, 1), params_of(8, 4)), nullptr);
  CHECK(single.full());
  CHECK_THROWS_AS(single.add(1, std::make_unique<Sequence>(*one, prompt_of(4, 1), params_of(8, 4)), nullptr),
                  std::logic_error);
  GenerateResult result;
  while (single.running() > 0) {
    for (BatchDecoder::Finished& f : single.step()) result = std::move(f.result);
  }
  check_same(result, generate(*one, prompt_of(4, 1), params_of(8, 4), nullptr, nullptr));
  CHECK_THROWS_WITH(BatchDecoder(*one, 0), doctest::Contains("maxBatch must be at least 1"));
  // The batched forward refuses a slot twice or out of range.
  auto four = make_cpu_backend(*model, BackendOptions{2, 0, 4});
  ForwardArgs args;
  args.commit = {1, 2};
  CHECK_THROWS_WITH(four->forward_batch({{1, &args, nullptr}, {1, &args, nullptr}}, nullptr),
                    doctest::Contains("slot 1 is not a free slot"));
  CHECK_THROWS_WITH(four->forward_batch({{4, &args, nullptr}}, nullptr), doctest::Contains("slot 4"));
}
