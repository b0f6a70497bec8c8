// CPU speed of the engine without Node: prefill, steady-state ms per denoising forward, tokens per
// forward. Runs on machines that have no Node, and can write a random model of a given shape first.
//   a2d_bench_cpu MODEL_DIR [--threads N] [--prompt N] [--max-tokens N] [--block-size B] [--threshold T]
//   a2d_bench_cpu --random hidden,intermediate,layers,heads,kv_heads,vocab OUT_DIR [options]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"
#include "decode.h"
#include "model.h"
#include "test_util.h"

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string model_dir, random_shape;
  int threads = 0, prompt_len = 64, repeats = 3, block_size = 0;
  int64_t max_tokens = 128;
  double threshold = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw std::runtime_error(args[i] + " needs a value");
      return args[++i];
    };
    if (args[i] == "--threads") threads = std::stoi(value());
    else if (args[i] == "--prompt") prompt_len = std::stoi(value());
    else if (args[i] == "--max-tokens") max_tokens = std::stoll(value());
    else if (args[i] == "--block-size") block_size = std::stoi(value());
    else if (args[i] == "--threshold") threshold = std::stod(value());
    else if (args[i] == "--repeats") repeats = std::stoi(value());
    else if (args[i] == "--random") random_shape = value();
    else if (model_dir.empty()) model_dir = args[i];
    else throw std::runtime_error("unexpected argument " + args[i]);
  }
  if (model_dir.empty()) throw std::runtime_error("usage: a2d_bench_cpu [--random h,i,l,heads,kv,vocab] MODEL_DIR [options]");

  if (!random_shape.empty()) {
    a2d::test::TinyShape s;
    if (std::sscanf(random_shape.c_str(), "%d,%d,%d,%d,%d,%d", &s.hidden, &s.intermediate, &s.layers, &s.heads,
                    &s.kv_heads, &s.vocab) != 6) {
      throw std::runtime_error("--random wants hidden,intermediate,layers,heads,kv_heads,vocab");
    }
    s.head_dim = s.hidden / s.heads;
    s.max_positions = 4096;
    s.weight_scale = 1.0f / static_cast<float>(s.hidden);
    a2d::test::write_random_model(model_dir, s, 1);
  }

  auto model = a2d::load_model(model_dir);
  a2d::BackendOptions options;
  options.threads = threads;
  auto backend = a2d::make_cpu_backend(*model, options);
  const a2d::ModelConfig& c = model->config;

  std::vector<int32_t> prompt(prompt_len);
  for (int i = 0; i < prompt_len; ++i) {
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
    if (prompt[i] == c.mask_token_id) prompt[i] = 1;
  }
  a2d::DecodeParams params = c.decoding;
  params.eos_token_ids.clear();
  params.max_tokens = max_tokens;
  if (block_size > 0) params.block_size = block_size;
  params.min_per_step = std::min(params.min_per_step, params.block_size);
  if (threshold >= 0) params.threshold = threshold;
  a2d::DecodeParams one_block = params;
  one_block.max_tokens = params.block_size;

  a2d::generate(*backend, prompt, one_block, nullptr, nullptr);  // page in the weights
  std::vector<double> prefill, per_forward, total;
  a2d::GenerateResult last;
  for (int r = 0; r < repeats; ++r) {
    a2d::ForwardArgs args;
    args.commit = prompt;
    backend->reset_cache();
    const double start = now_ms();
    backend->forward(args, nullptr);
    prefill.push_back(now_ms() - start);
    // A long and a one-block generation differ only in denoising forwards after the same prefill.
    const auto short_run = a2d::generate(*backend, prompt, one_block, nullptr, nullptr);
    last = a2d::generate(*backend, prompt, params, nullptr, nullptr);
    per_forward.push_back((last.ms - short_run.ms) / static_cast<double>(last.forward_passes - short_run.forward_passes));
    total.push_back(last.ms);
  }
  const double ms = median(total);
  std::printf(
      "{\"model\": \"%s\", \"parameters\": %lld, \"threads\": %d, \"prompt_tokens\": %d, \"prefill_ms\": %.2f, "
      "\"ms_per_denoising_forward\": %.3f, \"block_size\": %d, \"threshold\": %.2f, \"completion_tokens\": %zu, "
      "\"forward_passes\": %lld, \"tokens_per_forward\": %.3f, \"generate_ms\": %.1f, \"tokens_per_s\": %.1f}\n",
      model_dir.c_str(), static_cast<long long>(model->num_parameters), threads, prompt_len, median(prefill),
      median(per_forward), params.block_size, params.threshold, last.tokens.size(),
      static_cast<long long>(last.forward_passes),
      static_cast<double>(last.tokens.size()) / static_cast<double>(last.forward_passes), ms,
      static_cast<double>(last.tokens.size()) / ms * 1000.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "a2d_bench_cpu: %s\n", e.what());
    return 1;
  }
}
