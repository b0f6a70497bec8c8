#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu_kernels.h"
#include "model.h"
#include "thread_pool.h"

using namespace a2d;

namespace {

// The bf16 bits of `v`, rounded to nearest even, and their value.
uint16_t bf16_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}
float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// A finite e4m3 code's value, from the format's definition: (-1)^s 2^(e-7) (1 + m/8), or 2^-6 m/8 for e = 0.
float e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 0xf, m = code & 7;
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return static_cast<float>(code & 0x80 ? -magnitude : magnitude);
}

}  // namespace

TEST_CASE("cpu e4m3 weights: every code decodes to its OCP FP8 value, times its row's scale") {
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  const float scales[2] = {1.0f, 0.375f};
  Tensor t;
  t.dtype = DType::f8_e4m3;
  t.shape = {2, 128};
  t.data = codes.data();
  t.scale = scales;
  // Row 0 holds codes 0..127 (scale 1), row 1 codes 128..255 (the same magnitudes, negative, scale 0.375).
  const std::pair<int, float> known[] = {{0x00, 0.0f},        {0x01, 0x1p-9f},  {0x07, 7 * 0x1p-9f}, {0x08, 0x1p-6f},
                                         {0x30, 0.5f},        {0x38, 1.0f},     {0x3c, 1.5f},        {0x40, 2.0f},
                                         {0x77, 240.0f},      {0x7e, 448.0f}};
  for (const auto& [code, value] : known) {
    CAPTURE(code);
    CHECK(cpu::load_element(t, code) == value);
    CHECK(cpu::load_element(t, 128 + code) == -value * 0.375f);
  }
  CHECK(std::isnan(cpu::load_element(t, 0x7f)));
  CHECK(std::isnan(cpu::load_element(t, 0xff)));
  // Monotonic between neighbours: no code decodes out of order (a wrong exponent bias or mantissa width would).
  for (int code = 1; code < 0x7f; ++code) CHECK(cpu::load_element(t, code) > cpu::load_element(t, code - 1));
}

TEST_CASE("cpu matmuls: every x row count, partial weight tiles, bf16, f32 and e4m3 weights, against double sums") {
  // The kernel takes x rows four at a time (the last one to three from a padded copy) and weight rows four at a
  // time (a matrix's last one to three on their own), so row counts around multiples of 4 and of the 128-row
  // sweep, and matrices whose rows are not a multiple of 4, are where it could go wrong.
  ThreadPool pool(2);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::uniform_int_distribution<int> code(0, 0x7e);  // finite e4m3 magnitudes; the sign is drawn apart
  std::uniform_real_distribution<float> positive(0.01f, 2.f);
  for (const DType dtype : {DType::bf16, DType::f32, DType::f8_e4m3}) {
    for (const int64_t K : {8, 40, 1000}) {
      for (const int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 131}) {
        // Two projections of one input (as q and k), 13 and 4 rows, the first with a bias.
        const int64_t N[2] = {13, 4};
        std::vector<float> values[2], scales[2];
        std::vector<uint16_t> halves[2];
        std::vector<uint8_t> bytes[2];
        Tensor W[2];
        std::vector<float> y[2], bias(N[0]);
        for (float& b : bias) b = uniform(rng);
        for (int p = 0; p < 2; ++p) {
          values[p].resize(N[p] * K);
          for (float& v : values[p]) v = bf16_value(bf16_bits(uniform(rng)));
          W[p].dtype = dtype;
          W[p].shape = {N[p], K};
          if (dtype == DType::f8_e4m3) {
            // The values the matmul must multiply: the decoded code times its row's scale, in fp32.
            for (int64_t n = 0; n < N[p]; ++n) scales[p].push_back(positive(rng));
            for (int64_t i = 0; i < N[p] * K; ++i) {
              bytes[p].push_back(static_cast<uint8_t>(code(rng) | (rng() & 0x80)));
              values[p][i] = e4m3_value(bytes[p].back()) * scales[p][i / K];
            }
            W[p].data = bytes[p].data();
            W[p].scale = scales[p].data();
          } else if (dtype == DType::bf16) {
            for (float v : values[p]) halves[p].push_back(bf16_bits(v));
            W[p].data = halves[p].data();
          } else {
            W[p].data = values[p].data();
          }
          y[p].assign(M * N[p], NAN);
        }
        std::vector<float> x(M * K);
        for (float& v : x) v = uniform(rng);
        cpu::matmuls(pool, x.data(), M, {cpu::Projection{&W[0], bias.data(), y[0].data()}, cpu::Projection{&W[1], nullptr, y[1].data()}});
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
}
