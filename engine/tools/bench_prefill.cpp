// Prompt processing (prefill) speed through the Backend interface, as the decode loop drives it: a prompt
// of N tokens as commit-only forwards of at most `chunk` rows, the last one asking for the logits of its
// last row. Prints prompt tokens/s per prompt length (median of --repeats), one JSON line each, then a table.
//   a2d_bench_prefill MODEL_DIR [--device cpu|cuda] [--threads N] [--tokens 1024,2560,5120] [--chunk N]
//                     [--repeats R]
//   a2d_bench_prefill --random hidden,intermediate,layers,heads,kv_heads,vocab OUT_DIR [options]
// --chunk 0 sends the whole prompt as one forward; without --chunk the backend's prefill_chunk() is used.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"
#include "model.h"
#include "test_util.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of the whole process (every thread): on a shared machine the wall time also counts other work.
double cpu_s() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + 1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  if (out.empty()) throw std::runtime_error("--tokens wants a comma-separated list of prompt lengths");
  return out;
}

struct Timing {
  double wall_s, cpu_s;
};

// Wall and CPU seconds to prefill `prompt` from an empty cache in forwards of at most `chunk` rows (0: one forward).
Timing prefill_seconds(a2d::Backend& backend, const std::vector<int32_t>& prompt, int64_t chunk, std::vector<float>& logits) {
  backend.reset_cache();
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t step = chunk > 0 ? chunk : n;
  const double start = now_s(), cpu_start = cpu_s();
  for (int64_t begin = 0; begin < n; begin += step) {
    const int64_t end = std::min(n, begin + step);
    a2d::ForwardArgs args;
    args.commit.assign(prompt.begin() + begin, prompt.begin() + end);
    if (end == n) args.logit_rows = {static_cast<int32_t>(end - begin - 1)};
    backend.forward(args, logits.data());
  }
  return {now_s() - start, cpu_s() - cpu_start};
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string model_dir, random_shape, device = "cpu";
  int threads = 0, repeats = 3;
  int64_t chunk = -1;
  std::vector<int64_t> lengths = {1024, 2560, 5120};
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw std::runtime_error(args[i] + " needs a value");
      return args[++i];
    };
    if (args[i] == "--threads") threads = std::stoi(value());
    else if (args[i] == "--device") device = value();
    else if (args[i] == "--tokens") lengths = parse_list(value());
    else if (args[i] == "--chunk") chunk = std::stoll(value());
    else if (args[i] == "--repeats") repeats = std::max(1, std::stoi(value()));
    else if (args[i] == "--random") random_shape = value();
    else if (model_dir.empty()) model_dir = args[i];
    else throw std::runtime_error("unexpected argument " + args[i]);
  }
  if (model_dir.empty()) {
    throw std::runtime_error("usage: a2d_bench_prefill [--random h,i,l,heads,kv,vocab] MODEL_DIR [--device cpu|cuda] "
                             "[--threads N] [--tokens 1024,2560,5120] [--chunk N] [--repeats R]");
  }
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  if (!random_shape.empty()) {
    a2d::test::TinyShape s;
    if (std::sscanf(random_shape.c_str(), "%d,%d,%d,%d,%d,%d", &s.hidden, &s.intermediate, &s.layers, &s.heads,
                    &s.kv_heads, &s.vocab) != 6) {
      throw std::runtime_error("--random wants hidden,intermediate,layers,heads,kv_heads,vocab");
    }
    s.head_dim = s.hidden / s.heads;
    s.max_positions = static_cast<int>(longest) + 64;
    s.weight_scale = 1.0f / static_cast<float>(s.hidden);
    a2d::test::write_random_model(model_dir, s, 1);
  }

  auto model = a2d::load_model(model_dir);
  a2d::BackendOptions options;
  options.threads = threads;
  options.max_context = longest;
  std::unique_ptr<a2d::Backend> backend;
  if (device == "cpu") {
    backend = a2d::make_cpu_backend(*model, options);
#ifdef A2D_CUDA
  } else if (device == "cuda") {
    backend = a2d::make_cuda_backend(*model, options);
#endif
  } else {
    throw std::runtime_error("--device must be cpu" + std::string(
#ifdef A2D_CUDA
                                                         " or cuda"
#else
                                                         " (this build has no CUDA backend)"
#endif
                                                         ) + ", got " + device);
  }
  if (chunk < 0) chunk = backend->prefill_chunk();
  const a2d::ModelConfig& c = model->config;
  std::vector<float> logits(c.vocab_size);

  struct Row {
    int64_t length;
    double per_s, per_cpu_s;
  };
  std::vector<Row> table;
  for (int64_t length : lengths) {
    std::vector<int32_t> prompt(length);
    for (int64_t i = 0; i < length; ++i) {
      prompt[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
      if (prompt[i] == c.mask_token_id) prompt[i] = 1;
    }
    std::vector<double> wall, cpu;
    for (int r = 0; r < repeats; ++r) {
      const Timing t = prefill_seconds(*backend, prompt, chunk, logits);
      wall.push_back(t.wall_s);
      cpu.push_back(t.cpu_s);
    }
    const double s = median(wall), c_s = median(cpu);
    table.push_back({length, length / s, length / c_s});
    std::printf("{\"model\": \"%s\", \"device\": \"%s\", \"threads\": %d, \"prompt_tokens\": %lld, \"chunk\": %lld, "
                "\"seconds\": %.4f, \"prompt_tokens_per_s\": %.1f, \"cpu_seconds\": %.4f, "
                "\"prompt_tokens_per_cpu_s\": %.1f}\n",
                model_dir.c_str(), device.c_str(), threads, static_cast<long long>(length),
                static_cast<long long>(chunk), s, length / s, c_s, length / c_s);
    std::fflush(stdout);
  }
  std::printf("\n| prompt tokens | chunk | prompt tokens/s | per CPU-second (all threads) |\n|---|---|---|---|\n");
  for (const Row& row : table) {
    std::printf("| %lld | %lld | %.1f | %.1f |\n", static_cast<long long>(row.length), static_cast<long long>(chunk),
                row.per_s, row.per_cpu_s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "a2d_bench_prefill: %s\n", e.what());
    return 1;
  }
}
