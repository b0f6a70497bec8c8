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

}  // namespace

TEST_CASE("cpu matmuls: every x row count, partial weight tiles, bf16 and f32 weights, against double sums") {
  // The kernel takes x rows four at a time (the last one to three from a padded copy) and weight rows four at a
  // time (a matrix's last one to three on their own), so row counts around multiples of 4 and of the 128-row
  // sweep, and matrices whose rows are not a multiple of 4, are where it could go wrong.
  ThreadPool pool(2);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (const DType dtype : {DType::bf16, DType::f32}) {
    for (const int64_t K : {8, 40, 1000}) {
      for (const int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 131}) {
        // Two projections of one input (as q and k), 13 and 4 rows, the first with a bias.
        const int64_t N[2] = {13, 4};
        std::vector<float> values[2];
        std::vector<uint16_t> halves[2];
        Tensor W[2];
        std::vector<float> y[2], bias(N[0]);
        for (float& b : bias) b = uniform(rng);
        for (int p = 0; p < 2; ++p) {
          values[p].resize(N[p] * K);
          for (float& v : values[p]) v = bf16_value(bf16_bits(uniform(rng)));
          W[p].dtype = dtype;
          W[p].shape = {N[p], K};
          if (dtype == DType::bf16) {
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
