// Golden parity with the PyTorch reference (docs/golden-format.md): logits of fixed forwards, and
// every decode run's tokens and per-step reveal decisions.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "backend.h"
#include "batch.h"
#include "decode.h"
#include "decode_params.h"
#include "model.h"
#include "reveal.h"
#include "safetensors.h"

using namespace a2d;
using nlohmann::json;

namespace {

std::string golden_dir() {
  const char* dir = std::getenv("A2D_GOLDEN_DIR");
  if (dir == nullptr) {
    FAIL("A2D_GOLDEN_DIR is not set; run `npm run test:cpp`, which writes the golden files first");
  }
  return dir;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path << " (write it with python -m a2d_convert golden)");
  return json::parse(in);
}

DecodeParams decode_params(const json& p) {
  DecodeParams d;
  d.max_tokens = p.at("max_tokens").get<int64_t>();
  d.block_size = p.at("block_size").get<int>();
  d.threshold = p.at("threshold").get<double>();
  d.min_per_step = p.at("min_per_step").get<int>();
  d.steps = p.at("steps").get<int>();
  d.temperature = p.at("temperature").get<double>();
  d.top_p = p.at("top_p").get<double>();
  const std::string remasking = p.at("remasking"), advance = p.at("advance"), commit = p.at("commit");
  if (!parse_remasking(remasking, &d.remasking) || !parse_advance(advance, &d.advance) || !parse_commit(commit, &d.commit)) {
    throw std::runtime_error("golden run with an unknown remasking, advance or commit: " + p.dump());
  }
  const std::string order = p.value("reveal_order", "any");
  if (!parse_reveal_order(order, &d.reveal_order)) throw std::runtime_error("golden run with an unknown reveal_order: " + p.dump());
  d.seed = p.at("seed").get<uint64_t>();
  d.eos_token_ids = p.at("eos_token_ids").get<std::vector<int32_t>>();
  d.trace = true;
  return d;
}

void check_forwards(Backend& backend, const json& golden, const SafetensorsFile& tensors, double tolerance) {
  const int64_t V = backend.config().vocab_size;
  for (const json& f : golden.at("forwards")) {
    const std::string name = f.at("name");
    CAPTURE(name);
    const auto cached = f.at("cached_ids").get<std::vector<int32_t>>();
    ForwardArgs args;
    args.commit = f.at("commit_ids").get<std::vector<int32_t>>();
    args.window = f.at("window_ids").get<std::vector<int32_t>>();
    for (int32_t r = 0; r < static_cast<int32_t>(args.commit.size() + args.window.size()); ++r) {
      args.logit_rows.push_back(r);
    }
    backend.reset_cache();
    if (!cached.empty()) {
      ForwardArgs prefix;
      prefix.commit = cached;
      backend.forward(prefix, nullptr);
    }
    std::vector<float> logits(args.logit_rows.size() * V);
    backend.forward(args, logits.data());

    const TensorInfo& ref = tensors.tensors().at("logits_" + name);
    REQUIRE(ref.dtype == DType::f32);
    REQUIRE(ref.shape == std::vector<int64_t>{static_cast<int64_t>(args.logit_rows.size()), V});
    const float* want = static_cast<const float*>(tensors.data(ref));
    double diff = 0, scale = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(logits[i]) - want[i]));
      scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    }
    INFO("max |a-b| = " << diff << ", max |b| = " << scale);
    CHECK(diff / scale <= tolerance);
  }
}

// One decode run's result against the reference's tokens and trace.
void check_run(const GenerateResult& r, const json& run, double confidence_tolerance) {
  CHECK(r.tokens == run.at("token_ids").get<std::vector<int32_t>>());
  CHECK(finish_reason_name(r.finish_reason) == run.at("finish_reason").get<std::string>());
  CHECK(r.forward_passes == run.at("forward_passes").get<int64_t>());
  const json& trace = run.at("trace");
  REQUIRE(r.trace.size() == trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    CAPTURE(i);
    const json& want = trace[i];
    const TraceStep& got = r.trace[i];
    CHECK(got.forward == want.at("forward").get<int64_t>());
    CHECK(got.block_start == want.at("block_start").get<int64_t>());
    CHECK(got.step == want.at("step").get<int32_t>());
    CHECK(got.candidates == want.at("candidates").get<std::vector<int32_t>>());
    auto same = [&](const std::vector<Revealed>& got_list, const json& list) {
      REQUIRE(got_list.size() == list.size());
      for (size_t k = 0; k < list.size(); ++k) {
        CHECK(got_list[k].j == list[k][0].get<int32_t>());
        CHECK(got_list[k].token == list[k][1].get<int32_t>());
        CHECK(std::abs(got_list[k].confidence - list[k][2].get<double>()) <= confidence_tolerance);
      }
    };
    same(got.revealed, want.at("revealed"));
  }
}

std::vector<GenerateResult> check_decodes(Backend& backend, const json& golden, double confidence_tolerance) {
  std::vector<GenerateResult> results;
  for (const json& run : golden.at("decodes")) {
    const std::string name = run.at("name");
    CAPTURE(name);
    const auto prompt = run.at("prompt_ids").get<std::vector<int32_t>>();
    results.push_back(generate(backend, prompt, decode_params(run.at("params")), nullptr, nullptr));
    check_run(results.back(), run, confidence_tolerance);
  }
  return results;
}

// Every decode run of the case through one BatchDecoder of `max_batch` slots: a run joins as soon as a slot
// is free, at most one per forward, so each is batched with runs at other stages (prompt, first block, last
// block) and with other parameters. Each must match the reference and, bit for bit, its run alone.
void check_batched_decodes(Backend& backend, const json& golden, double confidence_tolerance, int32_t max_batch,
                           const std::vector<GenerateResult>& alone) {
  const json& runs = golden.at("decodes");
  BatchDecoder batch(backend, max_batch);
  std::vector<GenerateResult> results(runs.size());
  size_t next_run = 0, done = 0, forwards = 0;
  int32_t most_running = 0;
  while (done < runs.size()) {
    if (next_run < runs.size() && !batch.full()) {
      const json& run = runs[next_run];
      batch.add(next_run, std::make_unique<Sequence>(backend, run.at("prompt_ids").get<std::vector<int32_t>>(),
                                                     decode_params(run.at("params"))),
                nullptr);
      ++next_run;
    }
    most_running = std::max(most_running, batch.running());
    for (BatchDecoder::Finished& f : batch.step()) {
      REQUIRE(f.error.empty());
      results[f.id] = std::move(f.result);
      ++done;
    }
    ++forwards;
    REQUIRE(forwards < 10000);
  }
  CHECK(most_running == max_batch);
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string name = runs[i].at("name");
    CAPTURE(name);
    check_run(results[i], runs[i], confidence_tolerance);
    CHECK(results[i].tokens == alone[i].tokens);
    CHECK(results[i].forward_passes == alone[i].forward_passes);
    REQUIRE(results[i].trace.size() == alone[i].trace.size());
    for (size_t s = 0; s < alone[i].trace.size(); ++s) {
      CAPTURE(s);
      const auto& got = results[i].trace[s].revealed;
      const auto& want = alone[i].trace[s].revealed;
      REQUIRE(got.size() == want.size());
      for (size_t k = 0; k < want.size(); ++k) {
        CHECK(got[k].token == want[k].token);
        CHECK(got[k].confidence == want[k].confidence);  // exactly: the same logits, bit for bit
      }
    }
  }
}

}  // namespace

TEST_SUITE("golden") {
  TEST_CASE("golden: SplitMix64 test vectors") {
    const json rng = read_json(golden_dir() + "/rng.json");
    REQUIRE(!rng.at("splitmix64").empty());
    for (const json& v : rng.at("splitmix64")) {
      const uint64_t seed = std::stoull(v.at("seed").get<std::string>());
      CAPTURE(seed);
      SplitMix64 bits(seed), uniform(seed);
      for (const json& hex : v.at("u64")) CHECK(bits.next_u64() == std::stoull(hex.get<std::string>(), nullptr, 16));
      for (const json& u : v.at("uniform")) CHECK(uniform.next_double() == u.get<double>());
    }
  }

  TEST_CASE("golden: every case's logits and decode runs match the PyTorch reference, alone and batched") {
    const std::string dir = golden_dir();
    const json index = read_json(dir + "/index.json");
    REQUIRE(index.at("format_version") == 1);
    REQUIRE(index.at("cases").size() >= 3);
    for (const json& case_name : index.at("cases")) {
      const std::string name = case_name.get<std::string>();
      CAPTURE(name);
      const std::string case_dir = dir + "/" + name;
      const json golden = read_json(case_dir + "/golden.json");
      auto model = load_model(case_dir + "/" + golden.at("model").get<std::string>());
      auto backend = make_cpu_backend(*model, BackendOptions{2, 0, 6});
      SafetensorsFile tensors(case_dir + "/golden.safetensors");
      const json& tolerance = golden.at("tolerance");
      check_forwards(*backend, golden, tensors, tolerance.at("logits_max_rel").get<double>());
      const double confidence = tolerance.at("confidence_abs").get<double>();
      const std::vector<GenerateResult> alone = check_decodes(*backend, golden, confidence);
      check_batched_decodes(*backend, golden, confidence, 6, alone);
    }
  }
}
