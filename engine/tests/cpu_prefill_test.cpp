// The CPU backend's many-row kernels (cpu_prefill.cpp) against double-precision references, and a prompt
// prefilled in chunks through the Backend against the same prompt in forwards too small for those kernels.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend.h"
#include "cpu_kernels.h"
#include "model.h"
#include "test_util.h"
#include "thread_pool.h"

using namespace a2d;

namespace {

uint16_t to_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace

// Runs `body` once per instruction set the machine has (AVX-512, AVX2/FMA, baseline), then restores the best.
template <typename F>
void for_each_isa(F&& body) {
  for (int level = 0; level <= 2; ++level) {
    if (cpu::limit_many_row_isa(level) != level) continue;  // the machine lacks it
    CAPTURE(level);
    body();
  }
  cpu::limit_many_row_isa(0);
}

TEST_CASE("cpu many-row matmuls: row counts around the token blocks, partial panels, bf16 and f32, against double sums") {
  for_each_isa([] {
    ThreadPool pool(2);
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    for (const DType dtype : {DType::bf16, DType::f32}) {
      for (const int64_t K : {8, 40, 584}) {
        for (const int64_t M : {32, 33, 47, 64, 100, 257}) {
          const int64_t N[2] = {50, 13};  // partial panels of 12, 6 and 32 rows
          std::vector<float> values[2], y[2], bias(N[0]);
          std::vector<uint16_t> halves[2];
          Tensor W[2];
          for (float& b : bias) b = uniform(rng);
          for (int p = 0; p < 2; ++p) {
            values[p].resize(N[p] * K);
            for (float& v : values[p]) v = from_bf16(to_bf16(uniform(rng)));
            W[p].dtype = dtype;
            W[p].shape = {N[p], K};
            if (dtype == DType::bf16) {
              for (float v : values[p]) halves[p].push_back(to_bf16(v));
              W[p].data = halves[p].data();
            } else {
              W[p].data = values[p].data();
            }
            y[p].assign(M * N[p], NAN);
          }
          std::vector<float> x(M * K);
          for (float& v : x) v = uniform(rng);
          cpu::matmuls_many_rows(pool, x.data(), M,
                                 {cpu::Projection{&W[0], bias.data(), y[0].data()}, cpu::Projection{&W[1], nullptr, y[1].data()}});
          int wrong = 0;
          for (int p = 0; p < 2; ++p) {
            for (int64_t m = 0; m < M; ++m) {
              for (int64_t n = 0; n < N[p]; ++n) {
                double want = p == 0 ? bias[n] : 0.0, scale = 1.0;
                for (int64_t k = 0; k < K; ++k) {
                  want += static_cast<double>(values[p][n * K + k]) * x[m * K + k];
                  scale += std::fabs(static_cast<double>(values[p][n * K + k]) * x[m * K + k]);
                }
                wrong += !(std::fabs(y[p][m * N[p] + n] - want) <= 1e-5 * scale);
              }
            }
          }
          CAPTURE(static_cast<int>(dtype));
          CAPTURE(K);
          CAPTURE(M);
          CHECK(wrong == 0);
        }
      }
    }
  });
}

TEST_CASE("cpu attention: the tiled causal rows and the window rows after them, against a double reference") {
  for_each_isa([] {
    ThreadPool pool(2);
    std::mt19937 rng(9);
    std::normal_distribution<float> normal(0.f, 1.f);
    struct Shape {
      int heads, kv_heads, head_dim;
    };
    // Head sizes of one vector per P V pass (16, 32 at AVX-512) and of four (64, 128); 8 is not tiled anywhere.
    for (const Shape s : {Shape{4, 2, 16}, Shape{9, 3, 64}, Shape{8, 2, 128}, Shape{4, 4, 32}, Shape{2, 1, 8}}) {
      for (const int64_t n : {0, 37}) {
        for (const int64_t C : {16, 77}) {
          const int64_t W = 3, T = C + W;
          const int64_t q_stride = int64_t(s.heads) * s.head_dim, kv_stride = int64_t(s.kv_heads) * s.head_dim;
          std::vector<float> q(T * q_stride), k((n + T) * kv_stride), v((n + T) * kv_stride), out(T * q_stride, NAN);
          // Large scores in some heads: the online softmax must rescale across key tiles.
          for (float& e : q) e = 3.f * normal(rng);
          for (float& e : k) e = normal(rng);
          for (float& e : v) e = normal(rng);
          cpu::attention(pool, q.data(), k.data(), v.data(), n, C, T, s.heads, s.kv_heads, s.head_dim, out.data());
          const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
          double worst = 0;
          for (int64_t r = 0; r < T; ++r) {
            const int64_t keys = r < C ? n + r + 1 : n + T;
            for (int h = 0; h < s.heads; ++h) {
              const int kvh = h / (s.heads / s.kv_heads);
              std::vector<double> w(keys);
              double top = -INFINITY, sum = 0;
              for (int64_t p = 0; p < keys; ++p) {
                double dot = 0;
                for (int d = 0; d < s.head_dim; ++d) {
                  dot += double(q[r * q_stride + h * s.head_dim + d]) * k[p * kv_stride + kvh * s.head_dim + d];
                }
                w[p] = dot * scale;
                top = std::max(top, w[p]);
              }
              for (double& e : w) sum += (e = std::exp(e - top));
              for (int d = 0; d < s.head_dim; ++d) {
                double want = 0;
                for (int64_t p = 0; p < keys; ++p) want += w[p] / sum * v[p * kv_stride + kvh * s.head_dim + d];
                worst = std::max(worst, std::fabs(out[r * q_stride + h * s.head_dim + d] - want));
              }
            }
          }
          CAPTURE(s.heads);
          CAPTURE(s.head_dim);
          CAPTURE(n);
          CAPTURE(C);
          CHECK(worst < 2e-5);
        }
      }
    }
  });
}

TEST_CASE("cpu silu_mul: the vector exp against double, saturated ends included") {
  for_each_isa([] {
    std::vector<float> gate, up, want;
    for (int i = -4000; i <= 4000; ++i) {
      const float g = i * 0.03f;  // -120 .. 120: exp(-g) over- and underflows at the ends
      gate.push_back(g);
      up.push_back(1.0f + 0.001f * i);
      want.push_back(static_cast<float>(g / (1.0 + std::exp(-static_cast<double>(g))) * up.back()));
    }
    cpu::silu_mul(gate.data(), up.data(), static_cast<int64_t>(gate.size()));
    int wrong = 0;
    for (size_t i = 0; i < gate.size(); ++i) wrong += !(std::fabs(gate[i] - want[i]) <= 1e-6f * std::fabs(want[i]) + 1e-30f);
    CHECK(wrong == 0);
  });
}

TEST_CASE("cpu backend: a prompt in prefill chunks gives the logits and cache of forwards too small for the many-row kernels") {
  test::TinyShape shape;
  shape.hidden = 64;
  shape.intermediate = 96;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 16;
  shape.vocab = 50;
  shape.layers = 2;
  shape.max_positions = 512;
  shape.weight_scale = 0.2f;
  const std::string dir = test::write_tiny_model("cpu_prefill_chunks", shape, 3);
  auto model = load_model(dir);
  BackendOptions options;
  options.threads = 2;
  auto backend = make_cpu_backend(*model, options);
  std::vector<int32_t> prompt(230);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 31 + 7) % (shape.vocab - 1));
  const int32_t vocab = shape.vocab;

  // Logits of the prompt's last row and of a 4-token window after it, the prompt sent in chunks of `chunk`.
  auto run = [&](size_t chunk) {
    backend->reset_cache();
    std::vector<float> last(vocab);
    for (size_t begin = 0; begin < prompt.size(); begin += chunk) {
      const size_t end = std::min(prompt.size(), begin + chunk);
      ForwardArgs args;
      args.commit.assign(prompt.begin() + begin, prompt.begin() + end);
      if (end == prompt.size()) args.logit_rows = {static_cast<int32_t>(end - begin - 1)};
      backend->forward(args, last.data());
    }
    ForwardArgs window;
    window.window = {3, shape.vocab - 1, shape.vocab - 1, 5};
    window.logit_rows = {0, 1, 2, 3};
    std::vector<float> logits(4 * vocab);
    backend->forward(window, logits.data());
    logits.insert(logits.end(), last.begin(), last.end());
    return logits;
  };
  const std::vector<float> small = run(8);  // 8 rows: the row-by-row attention and the weight-streaming matmul
  for (const size_t chunk : {size_t(40), size_t(100), prompt.size()}) {
    const std::vector<float> big = run(chunk);
    double err = 0, norm = 0;
    for (size_t i = 0; i < big.size(); ++i) {
      err += (big[i] - small[i]) * double(big[i] - small[i]);
      norm += double(small[i]) * small[i];
    }
    CAPTURE(chunk);
    CHECK(std::sqrt(err / norm) < 1e-5);
  }
  CHECK(backend->prefill_chunk() >= 256);
}
