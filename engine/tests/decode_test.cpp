// Model-free tests of the CPU backend and the decode loop on tiny random models written by the test.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "backend.h"
#include "cpu_kernels.h"
#include "decode.h"
#include "lookup.h"
#include "reveal.h"
#include "model.h"
#include "test_util.h"

using namespace a2d;
using namespace a2d::test;

namespace {

// A plain, single-threaded, double-precision forward over the whole sequence with the block-causal
// mask written out, to check the optimised backend against.
std::vector<double> naive_logits(const Model& model, const std::vector<int32_t>& tokens, int64_t commit_rows) {
  const ModelConfig& c = model.config;
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c.hidden_size, hd = c.head_dim;
  auto w = [](const Tensor& t, int64_t i) { return static_cast<double>(cpu::load_element(t, i)); };
  auto matvec = [&](const Tensor& W, const Tensor& bias, const std::vector<double>& x) {
    std::vector<double> y(W.rows(), 0.0);
    for (int64_t n = 0; n < W.rows(); ++n) {
      for (int64_t k = 0; k < W.cols(); ++k) y[n] += w(W, n * W.cols() + k) * x[k];
      if (bias.present()) y[n] += w(bias, n);
    }
    return y;
  };
  auto norm = [&](const double* x, int64_t n, const Tensor& weight, double* out) {
    double ms = 0;
    for (int64_t i = 0; i < n; ++i) ms += x[i] * x[i];
    const double s = 1.0 / std::sqrt(ms / n + c.rms_norm_eps);
    for (int64_t i = 0; i < n; ++i) out[i] = w(weight, i) * x[i] * s;
  };
  auto rope = [&](double* v, int64_t pos) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double angle = pos / std::pow(c.rope_theta, 2.0 * i / hd);
      const double a = v[i], b = v[i + hd / 2];
      v[i] = a * std::cos(angle) - b * std::sin(angle);
      v[i + hd / 2] = b * std::cos(angle) + a * std::sin(angle);
    }
  };
  std::vector<std::vector<double>> x(T, std::vector<double>(H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < H; ++i) x[t][i] = w(model.weights.embed, tokens[t] * H + i);
  }
  for (const LayerWeights& L : model.weights.layers) {
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> h(H);
      norm(x[t].data(), H, L.input_norm, h.data());
      q[t] = matvec(L.q, L.q_bias, h);
      k[t] = matvec(L.k, L.k_bias, h);
      v[t] = matvec(L.v, L.v_bias, h);
      for (int64_t head = 0; head < c.num_heads; ++head) {
        if (c.qk_norm) norm(&q[t][head * hd], hd, L.q_norm, &q[t][head * hd]);
        rope(&q[t][head * hd], t);
      }
      for (int64_t head = 0; head < c.num_kv_heads; ++head) {
        if (c.qk_norm) norm(&k[t][head * hd], hd, L.k_norm, &k[t][head * hd]);
        rope(&k[t][head * hd], t);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> attn(c.num_heads * hd, 0.0);
      const int64_t visible = t < commit_rows ? t + 1 : T;
      for (int64_t head = 0; head < c.num_heads; ++head) {
        const int64_t kvh = head / (c.num_heads / c.num_kv_heads);
        std::vector<double> p(visible);
        double max_s = -1e300, sum = 0;
        for (int64_t s = 0; s < visible; ++s) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i) d += q[t][head * hd + i] * k[s][kvh * hd + i];
          p[s] = d / std::sqrt(static_cast<double>(hd));
          max_s = std::max(max_s, p[s]);
        }
        for (auto& e : p) sum += (e = std::exp(e - max_s));
        for (int64_t s = 0; s < visible; ++s) {
          for (int64_t i = 0; i < hd; ++i) attn[head * hd + i] += p[s] / sum * v[s][kvh * hd + i];
        }
      }
      const auto o = matvec(L.o, L.o_bias, attn);
      for (int64_t i = 0; i < H; ++i) x[t][i] += o[i];
    }
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> h(H);
      norm(x[t].data(), H, L.post_norm, h.data());
      auto g = matvec(L.gate, Tensor{}, h);
      const auto u = matvec(L.up, Tensor{}, h);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const auto d = matvec(L.down, Tensor{}, g);
      for (int64_t i = 0; i < H; ++i) x[t][i] += d[i];
    }
  }
  std::vector<double> logits;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> h(H);
    norm(x[t].data(), H, model.weights.final_norm, h.data());
    const auto row = matvec(model.weights.lm_head, Tensor{}, h);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

std::vector<float> forward_all(Backend& b, const std::vector<int32_t>& commit, const std::vector<int32_t>& window) {
  ForwardArgs args;
  args.commit = commit;
  args.window = window;
  for (int32_t r = 0; r < static_cast<int32_t>(commit.size() + window.size()); ++r) args.logit_rows.push_back(r);
  std::vector<float> logits(args.logit_rows.size() * b.config().vocab_size);
  b.forward(args, logits.data());
  return logits;
}

template <typename A, typename B>
double max_rel_error(const A& got, const B& want, size_t offset = 0) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[offset + i])));
    scale = std::max(scale, std::abs(static_cast<double>(want[offset + i])));
  }
  return diff / scale;
}

const std::vector<int32_t> kPrompt = {5, 17, 3, 22, 9, 30, 11};

DecodeParams greedy(int64_t max_tokens) {
  DecodeParams p;
  p.max_tokens = max_tokens;
  p.block_size = 4;
  p.eos_token_ids = {};
  p.trace = true;
  return p;
}

// Pages of the model's tensors not mapped into this process (the present bit of /proc/self/pagemap):
// a page is mapped only once something has read it through this mapping.
size_t unmapped_weight_pages(const Model& model) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  REQUIRE_MESSAGE(fd >= 0, "/proc/self/pagemap must be readable");
  size_t unmapped = 0;
  for (const auto& file : model.files) {
    for (const auto& [name, info] : file->tensors()) {
      if (info.nbytes == 0) continue;
      const auto begin = reinterpret_cast<uintptr_t>(file->data(info));
      for (uintptr_t p = begin / page; p <= (begin + info.nbytes - 1) / page; ++p) {
        uint64_t entry = 0;
        if (::pread(fd, &entry, sizeof entry, static_cast<off_t>(p * sizeof entry)) != sizeof entry) {
          FAIL("cannot read /proc/self/pagemap");
        }
        if ((entry >> 63) == 0) ++unmapped;
      }
    }
  }
  ::close(fd);
  return unmapped;
}

}  // namespace

TEST_CASE("cpu backend: the weights are read in at load, before the first forward") {
  // About 10 MB of weights: far more pages than the kernel maps around the few that loading reads.
  TinyShape shape;
  shape.hidden = 256;
  shape.intermediate = 512;
  shape.head_dim = 64;
  shape.vocab = 8192;
  auto model = load_model(write_tiny_model("backend-read-in", shape, 21));
  REQUIRE(unmapped_weight_pages(*model) > 1000);  // loading the model alone reads almost none
  auto backend = make_cpu_backend(*model, BackendOptions{1, 0});
  CHECK(unmapped_weight_pages(*model) == 0);
}

TEST_CASE("cpu forward matches a plain double-precision forward for every architecture switch") {
  struct Case {
    const char* name;
    TinyShape shape;
  };
  TinyShape llama, tied, qwen2, qwen3, mha;
  tied.tied = true;
  qwen2.qkv_bias = true;
  qwen3.qk_norm = true;
  mha.kv_heads = mha.heads;
  for (const Case& k : {Case{"llama", llama}, Case{"tied", tied}, Case{"qwen2", qwen2}, Case{"qwen3", qwen3},
                        Case{"mha", mha}}) {
    CAPTURE(k.name);
    auto model = load_model(write_tiny_model(std::string("fwd-") + k.name, k.shape, 11));
    BackendOptions options;
    options.threads = 2;
    auto backend = make_cpu_backend(*model, options);
    const std::vector<int32_t> window = {38, 39, 4, 39};
    const auto got = forward_all(*backend, kPrompt, window);
    std::vector<int32_t> all = kPrompt;
    all.insert(all.end(), window.begin(), window.end());
    CHECK(max_rel_error(got, naive_logits(*model, all, static_cast<int64_t>(kPrompt.size()))) < 1e-5);
  }
}

TEST_CASE("cpu forward: f32 and f16 weights give the logits of the bf16 weights they hold") {
  const std::string dir = write_tiny_model("fwd-dtypes", TinyShape{}, 15);
  auto bf16_model = load_model(dir);
  auto reference = forward_all(*make_cpu_backend(*bf16_model, BackendOptions{2, 0}), kPrompt, {39, 39, 39, 39});
  for (const char* dtype : {"F32", "F16"}) {
    CAPTURE(dtype);
    std::map<std::string, RawTensor> tensors;
    for (const auto& [name, info] : bf16_model->files[0]->tensors()) {
      Tensor t{info.dtype, info.shape, bf16_model->files[0]->data(info), name};
      std::string bytes;
      for (int64_t i = 0; i < static_cast<int64_t>(info.nbytes / 2); ++i) {
        const float v = cpu::load_element(t, i);
        if (dtype[1] == '3') {
          bytes.append(reinterpret_cast<const char*>(&v), 4);
        } else {  // round-to-nearest f16 (the weights lie far below the f16 maximum)
          int exponent;
          const float mantissa = std::frexp(std::abs(v), &exponent);
          uint16_t h = 0;
          if (exponent + 14 <= 0) {  // subnormal: multiples of 2^-24
            h = static_cast<uint16_t>(std::lround(std::ldexp(std::abs(v), 24)));
          } else if (v != 0.0f) {
            const uint32_t m = static_cast<uint32_t>(std::lround((mantissa * 2.0f - 1.0f) * 1024.0f));
            h = static_cast<uint16_t>(((exponent + 14) << 10) + m);  // a carry out of m bumps the exponent
          }
          if (v < 0) h |= 0x8000;
          bytes.append(reinterpret_cast<const char*>(&h), 2);
        }
      }
      tensors[name] = RawTensor{dtype, info.shape, bytes};
    }
    const std::string converted = scratch_dir(std::string("fwd-dtypes-") + dtype);
    write_file(converted + "/model.safetensors", safetensors_bytes(tensors));
    write_file(converted + "/config.json", read_file(dir + "/config.json"));
    auto model = load_model(converted);
    CHECK(model->weights.embed.dtype == (dtype[1] == '3' ? DType::f32 : DType::f16));
    const auto logits = forward_all(*make_cpu_backend(*model, BackendOptions{2, 0}), kPrompt, {39, 39, 39, 39});
    // bf16 values are exact in f32; in f16 too, but for the few below 2^-14 that lose low bits.
    CHECK(max_rel_error(logits, reference) < (dtype[1] == '3' ? 1e-7 : 1e-4));
  }
}

TEST_CASE("cpu forward: the KV cache gives the same logits as one long forward") {
  auto model = load_model(write_tiny_model("fwd-cache", TinyShape{}, 12));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0});
  const int64_t V = model->config.vocab_size;
  const std::vector<int32_t> window = {39, 7, 39, 39};
  const auto whole = forward_all(*backend, kPrompt, window);

  backend->reset_cache();
  forward_all(*backend, {kPrompt.begin(), kPrompt.begin() + 3}, {});
  CHECK(backend->cached_len() == 3);
  const auto split = forward_all(*backend, {kPrompt.begin() + 3, kPrompt.end()}, window);
  CHECK(max_rel_error(split, whole, 3 * V) < 1e-6);

  backend->reset_cache();
  forward_all(*backend, kPrompt, {});
  const auto window_only = forward_all(*backend, {}, window);
  CHECK(backend->cached_len() == static_cast<int64_t>(kPrompt.size()));
  CHECK(max_rel_error(window_only, whole, kPrompt.size() * V) < 1e-6);
}

TEST_CASE("cpu forward: commit rows are causal, the window is bidirectional") {
  auto model = load_model(write_tiny_model("fwd-mask", TinyShape{}, 13));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0});
  const int64_t V = model->config.vocab_size, P = static_cast<int64_t>(kPrompt.size());
  const auto a = forward_all(*backend, kPrompt, {39, 39, 39, 39});
  backend->reset_cache();
  const auto b = forward_all(*backend, kPrompt, {39, 39, 39, 8});
  CHECK(std::equal(a.begin(), a.begin() + P * V, b.begin()));
  // Window row 0 sees window position 3.
  CHECK(!std::equal(a.begin() + P * V, a.begin() + (P + 1) * V, b.begin() + P * V));
}

TEST_CASE("cpu forward: the thread count does not change a single bit") {
  auto model = load_model(write_tiny_model("fwd-threads", TinyShape{}, 14));
  auto one = make_cpu_backend(*model, BackendOptions{1, 0});
  auto three = make_cpu_backend(*model, BackendOptions{3, 0});
  CHECK(forward_all(*one, kPrompt, {39, 39, 39, 39}) == forward_all(*three, kPrompt, {39, 39, 39, 39}));
}

TEST_CASE("decode: fused and separate commits give the same tokens, separate costs one forward per block") {
  auto model = load_model(write_tiny_model("dec-commit", TinyShape{}, 21));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0});
  DecodeParams p = greedy(16);
  const GenerateResult fused = generate(*backend, kPrompt, p, nullptr, nullptr);
  p.commit = CommitPolicy::separate;
  const GenerateResult separate = generate(*backend, kPrompt, p, nullptr, nullptr);
  CHECK(fused.tokens.size() == 16);
  CHECK(fused.finish_reason == FinishReason::length);
  CHECK(separate.tokens == fused.tokens);
  CHECK(separate.forward_passes == fused.forward_passes + 4);
  CHECK(fused.forward_passes == static_cast<int64_t>(fused.trace.size()));
  CHECK(fused.trace.front().forward == 0);
  CHECK(fused.trace.front().block_start == static_cast<int64_t>(kPrompt.size()));
  CHECK(fused.trace.back().forward == fused.forward_passes - 1);
  CHECK(separate.trace.front().forward == 1);
  for (size_t i = 0; i < fused.trace.size(); ++i) {
    CHECK(fused.trace[i].candidates == separate.trace[i].candidates);
    CHECK(!fused.trace[i].revealed.empty());
  }
}

TEST_CASE("decode: min_per_step, steps schedule and threshold shape every step") {
  auto model = load_model(write_tiny_model("dec-rule", TinyShape{}, 22));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0});
  DecodeParams p = greedy(12);
  p.threshold = 1.0;
  p.steps = 2;
  GenerateResult r = generate(*backend, kPrompt, p, nullptr, nullptr);
  REQUIRE(r.trace.size() == 6);  // 3 blocks x 2 steps
  for (const TraceStep& s : r.trace) CHECK(s.revealed.size() == 2);

  p.steps = 0;
  p.min_per_step = 4;
  r = generate(*backend, kPrompt, p, nullptr, nullptr);
  CHECK(r.forward_passes == 3);  // every block in one step

  p.min_per_step = 1;
  p.threshold = 0.0;  // every candidate passes
  r = generate(*backend, kPrompt, p, nullptr, nullptr);
  CHECK(r.forward_passes == 3);
}

TEST_CASE("decode: max_tokens, EOS and block sizes end generation as docs/decoding.md says") {
  auto model = load_model(write_tiny_model("dec-end", TinyShape{}, 23));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0});
  DecodeParams p = greedy(0);
  GenerateResult r = generate(*backend, kPrompt, p, nullptr, nullptr);
  CHECK(r.tokens.empty());
  CHECK(r.forward_passes == 0);
  CHECK(r.finish_reason == FinishReason::length);

  p.max_tokens = 10;
  const GenerateResult reference = generate(*backend, kPrompt, p, nullptr, nullptr);
  CHECK(reference.tokens.size() == 10);
  CHECK(reference.trace.back().block_start == static_cast<int64_t>(kPrompt.size()) + 8);
  for (const TraceStep& s : reference.trace) {
    if (s.block_start == static_cast<int64_t>(kPrompt.size()) + 8) CHECK(s.candidates.back() <= 1);
  }

  // The 6th token becomes EOS. Blocks before the one that reveals it are unchanged; inside that block
  // the positions after a revealed EOS stop being candidates, which may change the other reveals.
  const int32_t eos = reference.tokens[5];
  const size_t first = std::find(reference.tokens.begin(), reference.tokens.end(), eos) - reference.tokens.begin();
  p.eos_token_ids = {eos};
  r = generate(*backend, kPrompt, p, nullptr, nullptr);
  CHECK(r.finish_reason == FinishReason::stop);
  CHECK(r.tokens.size() <= first);
  CHECK(std::find(r.tokens.begin(), r.tokens.end(), eos) == r.tokens.end());
  const size_t same = first / 4 * 4;
  REQUIRE(r.tokens.size() >= same);
  CHECK(std::equal(r.tokens.begin(), r.tokens.begin() + same, reference.tokens.begin()));

  p.eos_token_ids = {};
  for (int block : {1, 2, 8}) {
    p.block_size = block;
    r = generate(*backend, kPrompt, p, nullptr, nullptr);
    CHECK(r.tokens.size() == 10);
    for (const TraceStep& s : r.trace) CHECK(s.candidates.size() <= static_cast<size_t>(block));
  }
}

TEST_CASE("decode: the seed fixes sampled tokens; temperature 0 ignores it") {
  auto model = load_model(write_tiny_model("dec-seed", TinyShape{}, 24));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0});
  DecodeParams p = greedy(24);
  p.temperature = 1.5;
  p.top_p = 0.95;
  p.remasking = Remasking::random;
  p.seed = 99;
  const auto a = generate(*backend, kPrompt, p, nullptr, nullptr).tokens;
  CHECK(generate(*backend, kPrompt, p, nullptr, nullptr).tokens == a);
  p.seed = 100;
  CHECK(generate(*backend, kPrompt, p, nullptr, nullptr).tokens != a);
  p.temperature = 0.0;
  p.remasking = Remasking::low_confidence;
  const auto g = generate(*backend, kPrompt, p, nullptr, nullptr).tokens;
  p.seed = 5;
  CHECK(generate(*backend, kPrompt, p, nullptr, nullptr).tokens == g);
}

TEST_CASE("decode: unshifted logits predict each position from its own row") {
  TinyShape shape;
  shape.shift_logits = false;
  auto model = load_model(write_tiny_model("dec-noshift", shape, 25));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0});
  DecodeParams p = greedy(8);
  const GenerateResult fused = generate(*backend, kPrompt, p, nullptr, nullptr);
  p.commit = CommitPolicy::separate;
  CHECK(generate(*backend, kPrompt, p, nullptr, nullptr).tokens == fused.tokens);
  // The first step of the first block equals an argmax over the window rows of one forward.
  backend->reset_cache();
  const auto logits = forward_all(*backend, kPrompt, {39, 39, 39, 39});
  const int64_t V = model->config.vocab_size;
  for (const Revealed& r : fused.trace.front().revealed) {
    const float* row = logits.data() + (kPrompt.size() + r.j) * V;
    CHECK(r.token == std::max_element(row, row + V - 1) - row);  // mask (V-1) excluded
  }
}

TEST_CASE("decode: cancellation stops between steps; streaming reports each block") {
  auto model = load_model(write_tiny_model("dec-cancel", TinyShape{}, 26));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0});
  std::atomic<bool> cancel{true};
  GenerateResult r = generate(*backend, kPrompt, greedy(12), nullptr, &cancel);
  CHECK(r.finish_reason == FinishReason::cancelled);
  CHECK(r.forward_passes == 0);

  cancel = false;
  std::vector<std::vector<int32_t>> blocks;
  r = generate(*backend, kPrompt, greedy(12),
               [&](const std::vector<int32_t>& tokens, int64_t) {
                 blocks.push_back(tokens);
                 cancel = true;
               },
               &cancel);
  CHECK(r.finish_reason == FinishReason::cancelled);
  REQUIRE(blocks.size() == 1);
  CHECK(r.tokens == blocks[0]);
}

TEST_CASE("decode: bad requests are errors, not crashes") {
  auto model = load_model(write_tiny_model("dec-bad", TinyShape{}, 27));
  auto backend = make_cpu_backend(*model, BackendOptions{1, 32});
  CHECK_THROWS_WITH(generate(*backend, {}, greedy(4), nullptr, nullptr), doctest::Contains("at least one token"));
  CHECK_THROWS_WITH(generate(*backend, {1, 40}, greedy(4), nullptr, nullptr),
                    doctest::Contains("prompt token id 40 is outside the vocabulary"));
  CHECK_THROWS_WITH(generate(*backend, kPrompt, greedy(30), nullptr, nullptr),
                    doctest::Contains("lower max_tokens or load the model with a larger maxContext"));
  CHECK_THROWS_WITH(make_cpu_backend(*model, BackendOptions{1, 100000}),
                    doctest::Contains("exceeds the model's max_position_embeddings"));
  ForwardArgs args;
  args.commit = {1, 2};
  args.logit_rows = {2};
  std::vector<float> out(40);
  CHECK_THROWS_WITH(backend->forward(args, out.data()), doctest::Contains("logits row 2 is outside"));
}

namespace {

// The C++ twin of convert/tests/test_decode.py's Successor: the row of a real token t predicts
// t % 5 + 1 at 0.9, the row of a mask predicts the next position from `drafts`; ids 1..5, EOS 6, mask 7.
class SuccessorBackend : public Backend {
 public:
  static ModelConfig scripted_config() {
    ModelConfig c;
    c.vocab_size = 8;
    c.mask_token_id = 7;
    c.max_position_embeddings = 64;
    c.shift_logits = true;
    return c;
  }
  explicit SuccessorBackend(std::map<int64_t, std::pair<int32_t, double>> drafts)
      : Backend(scripted_config(), 64), drafts_(std::move(drafts)) {}

  void forward(const ForwardArgs& args, float* logits) override {
    calls.push_back(args);
    const int64_t start = static_cast<int64_t>(cached_.size());
    cached_.insert(cached_.end(), args.commit.begin(), args.commit.end());
    std::vector<int32_t> tokens(cached_);
    tokens.insert(tokens.end(), args.window.begin(), args.window.end());
    for (size_t i = 0; i < args.logit_rows.size(); ++i) {
      const int64_t at = start + args.logit_rows[i];
      const int32_t token = tokens.at(at);
      std::pair<int32_t, double> choice{token % 5 + 1, 0.9};
      if (token == 7) {
        const auto it = drafts_.find(at + 1);
        choice = it == drafts_.end() ? std::pair<int32_t, double>{1, 0.3} : it->second;
      }
      for (int32_t v = 0; v < 8; ++v) {
        const double p = v == choice.first ? choice.second : v == 7 ? 0.0 : (1.0 - choice.second) / 6;
        logits[i * 8 + v] = p > 0 ? static_cast<float>(std::log(p)) : -INFINITY;
      }
    }
  }
  int64_t cached_len() const override { return static_cast<int64_t>(cached_.size()); }
  void reset_cache() override { cached_.clear(); }
  int32_t max_window() const override { return window_limit; }

  std::vector<ForwardArgs> calls;
  int32_t window_limit = 64;

 private:
  std::map<int64_t, std::pair<int32_t, double>> drafts_;
  std::vector<int32_t> cached_;
};

// Per forward of a traced generation: the window's first position, how many tokens it confirmed, how many
// drafts it made.
struct TraceShape {
  std::vector<int64_t> starts;
  std::vector<size_t> confirmed, drafted;
};
TraceShape trace_shape(const GenerateResult& r) {
  TraceShape shape;
  for (const TraceStep& s : r.trace) {
    shape.starts.push_back(s.block_start);
    shape.confirmed.push_back(s.revealed.size());
    shape.drafted.push_back(s.drafts.size());
  }
  return shape;
}

}  // namespace

TEST_CASE("decode verify: keeps matching drafts, corrects the first wrong one, as the Python test does") {
  SuccessorBackend backend({{4, {5, 0.9}}, {5, {1, 0.8}}, {6, {3, 0.9}}, {8, {4, 0.9}}, {9, {5, 0.4}}, {10, {1, 0.9}}});
  DecodeParams p;
  p.max_tokens = 8;
  p.block_size = 4;
  p.threshold = 0.5;
  p.remasking = Remasking::verify;
  p.eos_token_ids = {6};
  p.trace = true;
  const GenerateResult r = generate(backend, {1, 2, 3}, p, nullptr, nullptr);
  CHECK(r.tokens == std::vector<int32_t>{4, 5, 1, 2, 3, 4, 5, 1});
  CHECK(r.finish_reason == FinishReason::length);
  CHECK(r.forward_passes == 5);
  const int32_t M = 7;
  const std::vector<std::vector<int32_t>> commits{{1, 2, 3}, {4}, {5, 1, 2}, {3}, {4, 5}};
  const std::vector<std::vector<int32_t>> windows{
      {M, M, M, M}, {5, 1, 3, M, M, M, M}, {M, M, M, M}, {4, M, M, M, M}, {M, M, M, M}};
  const std::vector<std::vector<int32_t>> rows{{2, 3, 4, 5}, {0, 1, 2, 3, 4, 5, 6}, {2, 3, 4, 5}, {0, 1, 2}, {1}};
  REQUIRE(backend.calls.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(backend.calls[i].commit == commits[i]);
    CHECK(backend.calls[i].window == windows[i]);
    CHECK(backend.calls[i].logit_rows == rows[i]);
  }
  const auto [starts, confirmed, drafted] = trace_shape(r);
  CHECK(starts == std::vector<int64_t>{3, 4, 7, 8, 10});
  CHECK(confirmed == std::vector<size_t>{1, 3, 1, 2, 1});
  CHECK(drafted == std::vector<size_t>{3, 0, 1, 1, 0});

  // An EOS reading ends the generation without the EOS; verify needs shifted logits and fused commits.
  SuccessorBackend eos_backend({});
  p.eos_token_ids = {1};
  const GenerateResult stopped = generate(eos_backend, {1, 2, 3}, p, nullptr, nullptr);
  CHECK(stopped.tokens == std::vector<int32_t>{4, 5});
  CHECK(stopped.finish_reason == FinishReason::stop);
  p.commit = CommitPolicy::separate;
  CHECK_THROWS_WITH_AS(generate(eos_backend, {1, 2, 3}, p, nullptr, nullptr),
                       doctest::Contains("use commit 'fused'"), std::runtime_error);
  // A backend whose forward takes at most 6 positions cannot run verify's windows of 7 at block size 4.
  p.commit = CommitPolicy::fused;
  eos_backend.window_limit = 6;
  const size_t forwards_before = eos_backend.calls.size();
  CHECK_THROWS_WITH_AS(generate(eos_backend, {1, 2, 3}, p, nullptr, nullptr),
                       doctest::Contains("use block_size <= 3"), std::runtime_error);
  CHECK(eos_backend.calls.size() == forwards_before);  // refused before any forward
}

namespace {

// The C++ twin of convert/tests/test_decode.py's TreeSuccessor: a real token's row predicts t % 5 + 1 at
// 0.9; a mask row at absolute position q predicts q+1 from `guesses` (token -> probability, the rest spread
// evenly over the other non-mask ids; {1: 0.1} where none is given). Rows sit where the layout puts them.
class TreeSuccessorBackend : public Backend {
 public:
  explicit TreeSuccessorBackend(std::map<int64_t, std::map<int32_t, double>> guesses)
      : Backend(SuccessorBackend::scripted_config(), 64), guesses_(std::move(guesses)) {}

  void forward(const ForwardArgs& args, float* logits) override {
    calls.push_back(args);
    const int64_t start = static_cast<int64_t>(cached_.size());
    const int64_t C = static_cast<int64_t>(args.commit.size());
    cached_.insert(cached_.end(), args.commit.begin(), args.commit.end());
    std::vector<int32_t> tokens(args.commit);
    tokens.insert(tokens.end(), args.window.begin(), args.window.end());
    for (size_t i = 0; i < args.logit_rows.size(); ++i) {
      const int64_t r = args.logit_rows[i];
      const int64_t position = r < C || !args.has_layout() ? start + r : start + C + args.window_offsets.at(r - C);
      const int32_t token = tokens.at(r);
      std::map<int32_t, double> probs{{token % 5 + 1, 0.9}};
      if (token == 7) {
        const auto it = guesses_.find(position + 1);
        probs = it == guesses_.end() ? std::map<int32_t, double>{{1, 0.1}} : it->second;
      }
      double given = 0.0;
      for (const auto& [t, p] : probs) given += p;
      const double rest = (1.0 - given) / static_cast<double>(7 - probs.size());
      for (int32_t v = 0; v < 8; ++v) {
        const double p = probs.count(v) ? probs.at(v) : v == 7 ? 0.0 : rest;
        logits[i * 8 + v] = p > 0 ? static_cast<float>(std::log(p)) : -INFINITY;
      }
    }
  }
  int64_t cached_len() const override { return static_cast<int64_t>(cached_.size()); }
  void reset_cache() override { cached_.clear(); }

  std::vector<ForwardArgs> calls;

 private:
  std::map<int64_t, std::map<int32_t, double>> guesses_;
  std::vector<int32_t> cached_;
};

}  // namespace

TEST_CASE("decode tree: walks the branch the reading chooses, drafts from where it stops, as the Python test does") {
  TreeSuccessorBackend backend({{4, {{5, 0.6}, {2, 0.3}}}, {5, {{1, 0.7}}}, {7, {{3, 0.8}}}, {8, {{5, 0.9}}},
                                {9, {{5, 0.9}}}, {10, {{1, 0.9}}}});
  DecodeParams p;
  p.max_tokens = 8;
  p.block_size = 3;
  p.threshold = 0.2;
  p.remasking = Remasking::tree;
  p.tree_width = 2;
  p.eos_token_ids = {6};
  p.trace = true;
  const GenerateResult r = generate(backend, {1, 2, 3}, p, nullptr, nullptr);
  CHECK(r.tokens == std::vector<int32_t>{4, 5, 1, 2, 3, 4, 5, 1});
  CHECK(r.finish_reason == FinishReason::length);
  REQUIRE(backend.calls.size() == 4);
  const int32_t M = 7;
  const auto masks = [&](std::vector<int32_t> v, size_t n) {
    v.insert(v.end(), n, M);
    return v;
  };
  const std::vector<std::vector<int32_t>> commits{{1, 2, 3}, {4}, {5, 1, 2}, {3, 4}};
  const std::vector<std::vector<int32_t>> windows{masks({}, 3), masks({5, 1, 2, 1}, 15), masks({3, 5}, 9), masks({5}, 6)};
  const std::vector<std::vector<int32_t>> rows{
      {2, 3, 4}, {0, 1, 2, 3, 4, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18}, {2, 3, 4, 5, 6, 8, 9, 11, 12}, {1, 2, 3, 4, 6, 7}};
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(backend.calls[i].commit == commits[i]);
    CHECK(backend.calls[i].window == windows[i]);
    CHECK(backend.calls[i].logit_rows == rows[i]);
  }
  CHECK(backend.calls[0].window_offsets == std::vector<int32_t>{0, 1, 2});
  CHECK(backend.calls[0].window_visible == std::vector<uint64_t>{7, 7, 7});
  CHECK(backend.calls[1].window_offsets ==
        std::vector<int32_t>{0, 1, 0, 1, 0, 1, 2, 1, 2, 3, 2, 3, 4, 1, 2, 3, 2, 3, 4});
  std::vector<uint64_t> visible{1, 3, 4, 12};
  for (uint64_t group : {uint64_t{7} << 4, 1 | uint64_t{7} << 7, 3 | uint64_t{7} << 10, 4 | uint64_t{7} << 13,
                         12 | uint64_t{7} << 16}) {
    visible.insert(visible.end(), 3, group);
  }
  CHECK(backend.calls[1].window_visible == visible);
  const auto [starts, confirmed, drafted] = trace_shape(r);
  CHECK(starts == std::vector<int64_t>{3, 4, 7, 9});
  CHECK(confirmed == std::vector<size_t>{1, 3, 2, 2});
  CHECK(drafted == std::vector<size_t>{4, 2, 2, 0});
  CHECK(r.trace[0].draft_branches == std::vector<int32_t>{0, 0, 1, 1});

  // Windows past 64 rows are refused before any forward: tree_width 1 at block size 8 needs 71.
  p.block_size = 8;
  p.tree_width = 1;
  const size_t before = backend.calls.size();
  CHECK_THROWS_WITH_AS(generate(backend, {1, 2, 3}, p, nullptr, nullptr), doctest::Contains("lower tree_width or block_size"),
                       std::runtime_error);
  CHECK(backend.calls.size() == before);
}

namespace {

// The lookup tests' stream: after the prompt 1 2 3 the exact stream 4 5 1 2 3 4 5 1 2 3 4 5 repeats itself;
// the masks guess 2 5 for positions 6-7 (after forward 3 confirms 1 at position 5). Block size 3, threshold 0.2,
// lookup_ngram 2: every forward after the third confirms 3 tokens, committed as below.
DecodeParams repeating_stream_params(Remasking remasking) {
  DecodeParams p;
  p.max_tokens = 12;
  p.block_size = 3;
  p.threshold = 0.2;
  p.remasking = remasking;
  p.tree_width = 1;
  p.lookup_ngram = 2;
  p.eos_token_ids = {6};
  p.trace = true;
  return p;
}
TreeSuccessorBackend repeating_stream_backend() { return TreeSuccessorBackend({{6, {{2, 0.9}}}, {7, {{5, 0.9}}}}); }
void check_repeating_stream(const TreeSuccessorBackend& backend, const GenerateResult& r) {
  CHECK(r.tokens == std::vector<int32_t>{4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5});
  REQUIRE(backend.calls.size() == 6);
  std::vector<std::vector<int32_t>> commits;
  for (const ForwardArgs& call : backend.calls) commits.push_back(call.commit);
  CHECK(commits == std::vector<std::vector<int32_t>>{{1, 2, 3}, {4}, {5}, {1}, {2, 3, 4}, {5, 1, 2}});
}

}  // namespace

TEST_CASE("decode tree: lookup_ngram drafts what followed the context's last match, as the Python test does") {
  // Forward 4's window: the group's 2 5 and the prompt's continuation 2 3, one node 2 with children 5 and 3.
  DecodeParams p = repeating_stream_params(Remasking::tree);
  TreeSuccessorBackend backend = repeating_stream_backend();
  const GenerateResult r = generate(backend, {1, 2, 3}, p, nullptr, nullptr);
  check_repeating_stream(backend, r);
  const ForwardArgs& fourth = backend.calls[3];
  std::vector<int32_t> window{2, 5, 3};
  window.insert(window.end(), 12, 7);
  CHECK(fourth.window == window);
  CHECK(fourth.window_offsets == std::vector<int32_t>{0, 1, 1, 0, 1, 2, 1, 2, 3, 2, 3, 4, 2, 3, 4});
  std::vector<uint64_t> visible{1, 3, 5};
  for (uint64_t group : {uint64_t{7} << 3, 1 | uint64_t{7} << 6, 3 | uint64_t{7} << 9, 5 | uint64_t{7} << 12}) {
    visible.insert(visible.end(), 3, group);
  }
  CHECK(fourth.window_visible == visible);
  std::vector<int32_t> drafted, confidences_zero;
  for (const Revealed& d : r.trace[2].drafts) {
    drafted.push_back(d.token);
    confidences_zero.push_back(d.confidence == 0.0 ? 1 : 0);
  }
  CHECK(drafted == std::vector<int32_t>{2, 5, 2, 3});
  CHECK(confidences_zero == std::vector<int32_t>{0, 0, 1, 1});
  CHECK(r.trace[2].draft_branches == std::vector<int32_t>{0, 0, 1, 1});
  CHECK(std::vector<int32_t>(backend.calls[4].window.begin(), backend.calls[4].window.begin() + 2) == std::vector<int32_t>{5, 1});
  CHECK(std::vector<int32_t>(backend.calls[5].window.begin(), backend.calls[5].window.begin() + 2) == std::vector<int32_t>{3, 4});

  // Without the lookup branch the same stream takes 11 forwards; with tree_width 4 it would not fit 64 rows.
  p.lookup_ngram = 0;
  TreeSuccessorBackend plain = repeating_stream_backend();
  CHECK(generate(plain, {1, 2, 3}, p, nullptr, nullptr).forward_passes == 11);
  p.block_size = 4;
  p.tree_width = 4;
  p.lookup_ngram = 2;
  CHECK_THROWS_WITH_AS(generate(plain, {1, 2, 3}, p, nullptr, nullptr), doctest::Contains("lookup_ngram"), std::runtime_error);
}

TEST_CASE("decode verify: lookup_ngram drafts after a mismatch and where the masks agree, as the Python test does") {
  // Forward 3's masks guess 2 5 and the prompt's 1 was followed by 2 3: the same first token, so 2 3 is
  // drafted; forward 4's masks guess nothing and the context drafts 5 1.
  DecodeParams p = repeating_stream_params(Remasking::verify);
  TreeSuccessorBackend backend = repeating_stream_backend();
  const GenerateResult r = generate(backend, {1, 2, 3}, p, nullptr, nullptr);
  check_repeating_stream(backend, r);
  CHECK(backend.calls[3].window == std::vector<int32_t>{2, 3, 7, 7, 7});
  CHECK(backend.calls[4].window == std::vector<int32_t>{5, 1, 7, 7, 7});
  REQUIRE(r.trace[2].drafts.size() == 2);
  CHECK(r.trace[2].drafts[1].token == 3);
  CHECK(r.trace[2].drafts[1].confidence == 0.0);
  p.lookup_ngram = 0;
  TreeSuccessorBackend plain = repeating_stream_backend();
  CHECK(generate(plain, {1, 2, 3}, p, nullptr, nullptr).forward_passes == 11);
}

TEST_CASE("cpu forward: a tree layout places rows at their offsets and limits what each sees") {
  // Two one-token branches x and y at the same position (offset 0), each seeing only itself: each row reads
  // exactly as that token would read as the last commit row.
  auto model = load_model(write_tiny_model("fwd-tree", TinyShape{}, 14));
  auto backend = make_cpu_backend(*model, BackendOptions{2, 0});
  const int64_t V = model->config.vocab_size, P = static_cast<int64_t>(kPrompt.size());
  ForwardArgs tree;
  tree.commit = kPrompt;
  tree.window = {21, 8};
  tree.window_offsets = {0, 0};
  tree.window_visible = {1, 2};
  tree.logit_rows = {static_cast<int32_t>(P), static_cast<int32_t>(P + 1)};
  std::vector<float> both(2 * V);
  backend->forward(tree, both.data());
  for (int32_t k = 0; k < 2; ++k) {
    CAPTURE(k);
    backend->reset_cache();
    std::vector<int32_t> commit = kPrompt;
    commit.push_back(tree.window[k]);
    const auto alone = forward_all(*backend, commit, {});
    CHECK(max_rel_error(std::vector<float>(both.begin() + k * V, both.begin() + (k + 1) * V), alone, P * V) < 1e-6);
  }
  // Without the layout, y sits one position later and sees x: other logits.
  backend->reset_cache();
  const auto plain = forward_all(*backend, kPrompt, {21, 8});
  CHECK(max_rel_error(std::vector<float>(both.begin() + V, both.end()), plain, (P + 1) * V) > 1e-3);
}

TEST_CASE("lookup context: its index answers what a scan of the whole context answers") {
  // The rule of docs/decoding.md ("Tree", step 4), written as the scan it replaces.
  auto scan = [](const std::vector<int32_t>& context, int ngram, int32_t depth, int32_t eos) {
    const int64_t size = static_cast<int64_t>(context.size());
    for (int64_t n = std::min<int64_t>(ngram, size - 1); n >= 1; --n) {
      for (int64_t start = size - n - 1; start >= 0; --start) {
        if (!std::equal(context.end() - n, context.end(), context.begin() + start)) continue;
        std::vector<int32_t> found;
        for (int64_t i = start + n; i < size && static_cast<int32_t>(found.size()) < depth; ++i) {
          found.push_back(context[static_cast<size_t>(i)]);
          if (found.back() == eos) break;
        }
        return found;
      }
    }
    return std::vector<int32_t>{};
  };
  SplitMix64 rng(11);
  int64_t matched = 0, compared = 0;
  for (int ngram : {1, 2, 3, 8}) {
    for (int32_t vocab : {2, 3, 6, 50}) {  // small vocabularies repeat n-grams often
      std::vector<int32_t> prompt;
      for (int i = 0; i < 5; ++i) prompt.push_back(static_cast<int32_t>(rng.next_u64() % vocab));
      LookupContext context(prompt, ngram);
      std::vector<int32_t> tokens = prompt;
      for (int step = 0; step < 300; ++step) {
        const int32_t token = static_cast<int32_t>(rng.next_u64() % vocab);
        context.push(token);
        tokens.push_back(token);
        for (int32_t depth : {1, 3, 7}) {
          const std::vector<int32_t> want = scan(tokens, ngram, depth, 0);
          CHECK(context.branch(depth, [](int32_t t) { return t == 0; }) == want);
          matched += want.empty() ? 0 : 1;
          ++compared;
        }
      }
      CHECK(context.tokens() == tokens);
    }
  }
  CHECK(matched > compared / 2);  // the comparison is not all empty branches
  CHECK(LookupContext({1, 2}, 0).branch(3, [](int32_t) { return false; }).empty());
  CHECK_THROWS_AS(LookupContext({1}, kMaxLookupNgram + 1), std::invalid_argument);
}
