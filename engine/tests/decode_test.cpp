// Model-free tests of the CPU backend and the decode loop on tiny random models written by the test.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <utility>

#include "backend.h"
#include "cpu_kernels.h"
#include "decode.h"
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
    // bf16 values are exact in f32; in f16 too, but for the few below 2^-14 that lose low bits. The f32 and
    // bf16 loops are compiled apart, and an AVX2 clone may sum them in another order: 9.8e-7 measured on an
    // AMD EPYC without AVX-512 (0 on AVX-512); a wrong conversion is off by 1e-3 or more.
    CHECK(max_rel_error(logits, reference) < (dtype[1] == '3' ? 4e-6 : 1e-4));
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
  for (int block : {2, 4, 8}) {
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

TEST_CASE("decode: cancellation stops between steps; a cancelled result holds what was streamed") {
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

TEST_CASE("decode: streaming hands out the window's revealed run after every step") {
  auto model = load_model(write_tiny_model("dec-stream", TinyShape{}, 29));
  auto backend = make_cpu_backend(*model, BackendOptions{1, 0});
  std::vector<std::vector<int32_t>> events;
  const GenerateResult r = generate(*backend, kPrompt, greedy(24),
                                    [&](const std::vector<int32_t>& tokens, int64_t) { events.push_back(tokens); }, nullptr);
  REQUIRE(r.tokens.size() == 24);
  // What the trace says each step made final: the run of revealed positions that starts the window, past what the
  // steps before it in the same block had made final.
  std::vector<std::vector<int32_t>> expected;
  std::map<int32_t, int32_t> revealed;  // window position -> token, this block
  int64_t block_start = -1;
  int32_t handed = 0;
  for (const TraceStep& step : r.trace) {
    if (step.block_start != block_start) {
      block_start = step.block_start;
      revealed.clear();
      handed = 0;
    }
    for (const Revealed& x : step.revealed) revealed[x.j] = x.token;
    std::vector<int32_t> run;
    for (int32_t j = handed; revealed.count(j) > 0; ++j) run.push_back(revealed[j]);
    if (!run.empty()) expected.push_back(run);
    handed += static_cast<int32_t>(run.size());
  }
  CHECK(events == expected);
  std::vector<int32_t> all;
  for (const auto& e : events) all.insert(all.end(), e.begin(), e.end());
  CHECK(all == r.tokens);
  CHECK(events.size() > 24 / 4);  // some blocks reached the client in parts, before they were done
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

// The C++ twin of convert/tests/test_decode.py's Scripted: the logits row read for absolute position p is
// table[p] (probabilities over ids 0..7, mask 7), uniform over the non-mask ids where the table has none. It
// tracks the cache like a real backend, so a loop that asks for the wrong row or commits the wrong tokens
// reads the wrong entry.
class ScriptedBackend : public Backend {
 public:
  static ModelConfig scripted_config() {
    ModelConfig c;
    c.vocab_size = 8;
    c.mask_token_id = 7;
    c.max_position_embeddings = 64;
    c.shift_logits = true;
    return c;
  }
  explicit ScriptedBackend(std::map<int64_t, std::pair<int32_t, double>> table)
      : Backend(scripted_config(), 64), table_(std::move(table)) {}

  void forward(const ForwardArgs& args, float* logits) override {
    calls.push_back(args);
    const int64_t start = static_cast<int64_t>(cached_.size());
    cached_.insert(cached_.end(), args.commit.begin(), args.commit.end());
    for (size_t i = 0; i < args.logit_rows.size(); ++i) {
      const auto it = table_.find(start + args.logit_rows[i] + 1);
      for (int32_t v = 0; v < 8; ++v) {
        double p = 1.0 / 7;
        if (it != table_.end()) p = v == it->second.first ? it->second.second : (1.0 - it->second.second) / 6;
        logits[i * 8 + v] = v == 7 ? -INFINITY : static_cast<float>(std::log(p));
      }
    }
  }
  int64_t cached_len() const override { return static_cast<int64_t>(cached_.size()); }
  void reset_cache() override { cached_.clear(); }
  int32_t prefill_chunk() const override { return chunk; }

  std::vector<ForwardArgs> calls;
  int32_t chunk = 512;

 private:
  std::map<int64_t, std::pair<int32_t, double>> table_;
  std::vector<int32_t> cached_;
};

// convert/tests/test_decode.py's SLIDE: prompt 1 2 3, then per position (token, confidence).
const std::map<int64_t, std::pair<int32_t, double>> kSlide = {
    {3, {1, 0.95}}, {4, {2, 0.5}}, {5, {3, 0.92}}, {6, {4, 0.3}}, {7, {5, 0.95}}, {8, {1, 0.4}}};

DecodeParams slide_params() {
  DecodeParams p;
  p.max_tokens = 6;
  p.block_size = 4;
  p.threshold = 0.9;
  p.eos_token_ids = {6};
  p.advance = Advance::slide;
  p.trace = true;
  return p;
}

std::vector<std::vector<std::pair<int32_t, int32_t>>> reveals(const GenerateResult& r) {
  std::vector<std::vector<std::pair<int32_t, int32_t>>> out;
  for (const TraceStep& s : r.trace) {
    out.emplace_back();
    for (const Revealed& v : s.revealed) out.back().emplace_back(v.j, v.token);
  }
  return out;
}

}  // namespace

TEST_CASE("decode slide: the window moves past every revealed prefix, as the Python test does") {
  ScriptedBackend backend(kSlide);
  const GenerateResult r = generate(backend, {1, 2, 3}, slide_params(), nullptr, nullptr);
  using Step = std::vector<std::pair<int32_t, int32_t>>;
  CHECK(reveals(r) == std::vector<Step>{{{0, 1}, {2, 3}}, {{3, 5}}, {{0, 2}}, {{2, 1}}, {{0, 4}}});
  std::vector<int64_t> starts;
  std::vector<int32_t> steps;
  for (const TraceStep& s : r.trace) {
    starts.push_back(s.block_start);
    steps.push_back(s.step);
  }
  CHECK(starts == std::vector<int64_t>{3, 4, 4, 6, 6});
  CHECK(steps == std::vector<int32_t>{0, 0, 1, 0, 1});
  CHECK(r.tokens == std::vector<int32_t>{1, 2, 3, 4, 5, 1});
  CHECK(r.finish_reason == FinishReason::length);
  CHECK(r.forward_passes == 5);
  CHECK(r.steps == 5);
  CHECK(r.revealed == 6);
  CHECK(r.topped_up == 3);
  REQUIRE(backend.calls.size() == 5);
  const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> calls = {
      {{1, 2, 3}, {7, 7, 7, 7}}, {{1}, {7, 3, 7, 7}}, {{}, {7, 3, 7, 5}}, {{2, 3}, {7, 5, 7, 7}}, {{}, {7, 5, 1, 7}}};
  for (size_t i = 0; i < calls.size(); ++i) {
    CHECK(backend.calls[i].commit == calls[i].first);
    CHECK(backend.calls[i].window == calls[i].second);
  }

  DecodeParams block = slide_params();  // the same table a block at a time
  block.advance = Advance::block;
  ScriptedBackend blocks(kSlide);
  const GenerateResult b = generate(blocks, {1, 2, 3}, block, nullptr, nullptr);
  CHECK(b.forward_passes == 5);
  CHECK(b.tokens == r.tokens);
}

TEST_CASE("decode slide: an EOS ends it once everything before it is revealed; separate commits cost a forward each") {
  auto table = kSlide;
  table[5] = {6, 0.97};  // EOS revealed at position 5 in the first step
  ScriptedBackend backend(table);
  DecodeParams p = slide_params();
  p.max_tokens = 12;
  const GenerateResult r = generate(backend, {1, 2, 3}, p, nullptr, nullptr);
  using Step = std::vector<std::pair<int32_t, int32_t>>;
  CHECK(reveals(r) == std::vector<Step>{{{0, 1}, {2, 6}}, {{0, 2}}});
  CHECK(r.tokens == std::vector<int32_t>{1, 2});
  CHECK(r.finish_reason == FinishReason::stop);
  CHECK(r.forward_passes == 2);

  ScriptedBackend fused_backend(kSlide), separate_backend(kSlide);
  const GenerateResult fused = generate(fused_backend, {1, 2, 3}, slide_params(), nullptr, nullptr);
  DecodeParams sep = slide_params();
  sep.commit = CommitPolicy::separate;
  const GenerateResult separate = generate(separate_backend, {1, 2, 3}, sep, nullptr, nullptr);
  CHECK(separate.tokens == fused.tokens);
  CHECK(reveals(separate) == reveals(fused));
  CHECK(separate.forward_passes == fused.forward_passes + 3);
}

TEST_CASE("decode: a long prompt goes in commit-only chunks, cancellable between them, not counted as forwards") {
  ScriptedBackend backend(kSlide);
  backend.chunk = 2;
  std::vector<int32_t> prompt = {1, 2, 3};
  DecodeParams p = slide_params();
  const GenerateResult whole = [&] {
    ScriptedBackend one(kSlide);
    return generate(one, prompt, p, nullptr, nullptr);
  }();
  const GenerateResult chunked = generate(backend, prompt, p, nullptr, nullptr);
  CHECK(chunked.tokens == whole.tokens);
  CHECK(chunked.forward_passes == whole.forward_passes);
  CHECK(chunked.prefill_forwards == 1);  // [1 2] alone, then [3] with the first window
  REQUIRE(backend.calls.size() == whole.forward_passes + 1);
  CHECK(backend.calls[0].commit == std::vector<int32_t>{1, 2});
  CHECK(backend.calls[0].window.empty());
  CHECK(backend.calls[1].commit == std::vector<int32_t>{3});

  // A cancel raised during the first chunk stops the generation before the second.
  struct CancelOnFirst : ScriptedBackend {
    using ScriptedBackend::ScriptedBackend;
    std::atomic<bool>* flag = nullptr;
    void forward(const ForwardArgs& args, float* logits) override {
      ScriptedBackend::forward(args, logits);
      flag->store(true);
    }
  } cancelling(kSlide);
  cancelling.chunk = 1;
  std::atomic<bool> cancel{false};
  cancelling.flag = &cancel;
  const GenerateResult stopped = generate(cancelling, prompt, p, nullptr, &cancel);
  CHECK(stopped.finish_reason == FinishReason::cancelled);
  CHECK(cancelling.calls.size() == 1);
  CHECK(stopped.forward_passes == 0);
}

TEST_CASE("decode: settings that decode left to right by construction are refused with the rule named") {
  ScriptedBackend backend(kSlide);
  DecodeParams p = slide_params();
  p.remasking = Remasking::leftmost;
  p.threshold = 1.0;
  CHECK_THROWS_WITH(generate(backend, {1, 2, 3}, p, nullptr, nullptr), doctest::Contains("left_to_right"));
  p.min_per_step = 2;
  CHECK(generate(backend, {1, 2, 3}, p, nullptr, nullptr).tokens.size() == 6);
  p = slide_params();
  p.block_size = 1;
  p.min_per_step = 1;
  CHECK_THROWS_WITH(generate(backend, {1, 2, 3}, p, nullptr, nullptr), doctest::Contains("block_size is 1, it must be in [2, 64]"));
  p = slide_params();
  p.steps = 2;
  CHECK_THROWS_WITH(generate(backend, {1, 2, 3}, p, nullptr, nullptr), doctest::Contains("schedule_needs_blocks"));
}
