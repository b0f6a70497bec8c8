// The FP8 GEMM's standalone harness (STYLE.md: a CPU reference, the variants, a validator, a timer), for the
// GPU machine. Three sections, each line prefixed CODES / CHECK / TIME, a table last; exit status 1 on any
// mismatch of the engine's own path:
//   CODES  every e4m3 code through both conversions of fp8.cuh (cvt, shift) against its value computed here
//          from the format's definition; the engine's conversion (A2D_FP8_CONVERT, default cvt) must be exact
//          for all 254 finite codes, the other one is reported.
//   CHECK  the engine's gemm() on every GEMM shape of the MiniCPM5-2B forward (qkv, o, gate/up, down, lm_head)
//          at 1, 4, 8, 16, 32 and 64 rows, bf16 weights and e4m3 ones (random codes, random row scales),
//          against an fp64 CPU reference of the same stored values: the fp32 residual-add epilogue (residual
//          rows start at known values; every output must be theirs plus the product, to 2e-5 of the row's
//          norm) and the bf16 store epilogue (outputs poisoned with NaN first; to 4e-3, bf16's rounding).
//          Rows past the forward's count must keep their poison. The lm_head's reference covers every 64th
//          output row and its last 64 (its 130,560 rows would take minutes of CPU).
//   TIME   microseconds per GEMM and the weight stream's TB/s, graph-replayed over enough distinct copies of
//          each matrix to stream past the 60 MB L2: bf16 and e4m3 under the engine's tuning, e4m3 with 8 loads
//          per lane and with K split towards 4 blocks per SM.
// Built outside the engine's CMake (bench/device-fp8.sh builds it twice, the second with
// -DA2D_FP8_CONVERT=shift, to time the other conversion):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iengine/cuda -o build/device/fp8_gemm_bench \
//     engine/bench/fp8_gemm_bench.cu engine/cuda/gemm.cu
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_values.cuh"
#include "fp8.cuh"
#include "gemm.cuh"
#include "weights.cuh"

using namespace a2d::cuda;
using namespace a2d::bench;

namespace {

// Weights: bf16 from bench_values.cuh's weight_bf16, or an e4m3 code whose exponent is mostly 3..8 (values 2^-4 ..
// 2^2, as a row scaled to 448 holds) with subnormals and 448 now and then; row scales (256 + u) x 2^-17, u < 256.
__host__ __device__ inline uint8_t weight_code(uint64_t seed, uint64_t i) {
  const uint64_t h = mix64(seed * 0x100000001B3ull + i + 0x5555);
  const unsigned e = (h >> 8) % 64 < 60 ? 3 + (h >> 16) % 6 : (h >> 16) % 16;
  const unsigned code = (h & 0x80) | (e << 3) | ((h >> 24) & 7);
  return static_cast<uint8_t>((code & 0x7f) == 0x7f ? code - 1 : code);
}
__host__ __device__ inline float weight_scale(uint64_t seed, uint64_t row) {
  return static_cast<float>(256 + mix64(seed * 0x9E37ull + row) % 256) * (1.0f / 131072.0f);
}

// A finite e4m3 code's value from the format's definition (OCP FP8 E4M3: bias 7, S.1111.111 is NaN).
double e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 0xf, m = code & 7;
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return code & 0x80 ? -magnitude : magnitude;
}
bool e4m3_finite(uint8_t code) { return (code & 0x7f) != 0x7f; }

#define CHECK_CUDA(call) A2D_CUDA_CHECK(call)

// ---------------------------------------------------------------------------------------------- CODES

template <Fp8Convert kHow>
__global__ void convert_codes_kernel(uint32_t* out) {
  // Thread i converts the pair (code 2i, code 2i+1) from the low and the high half of one word.
  const int i = threadIdx.x;  // 0..127
  const uint32_t four = (2u * i) | ((2u * i + 1) << 8) | ((2u * i) << 16) | ((2u * i + 1) << 24);
  out[2 * i] = e4m3x2_to_bf16x2<kHow>(four, 0);
  out[2 * i + 1] = e4m3x2_to_bf16x2<kHow>(four, 1);
}

// How many finite codes convert to exactly their value (both halves of the word agree), printing the first miss.
template <Fp8Convert kHow>
int exact_codes(const char* name) {
  uint32_t* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, 256 * sizeof(uint32_t)));
  convert_codes_kernel<kHow><<<1, 128>>>(device);
  CHECK_CUDA(cudaGetLastError());
  std::vector<uint32_t> words(256);
  CHECK_CUDA(cudaMemcpy(words.data(), device, 256 * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(device));
  int exact = 0;
  bool reported = false;
  for (int code = 0; code < 256; ++code) {
    if (!e4m3_finite(static_cast<uint8_t>(code))) continue;
    const int i = code / 2, lane = code % 2;
    const uint16_t low = static_cast<uint16_t>(words[2 * i] >> (16 * lane));
    const uint16_t high = static_cast<uint16_t>(words[2 * i + 1] >> (16 * lane));
    const double want = e4m3_value(static_cast<uint8_t>(code));
    const bool ok = low == high && bf16_value(low) == want && std::signbit(bf16_value(low)) == std::signbit(want);
    exact += ok;
    if (!ok && !reported) {
      std::printf("CODES %-5s first miss: code 0x%02x gives %.9g (bf16 0x%04x), its value is %.9g\n", name, code,
                  bf16_value(low), low, want);
      reported = true;
    }
  }
  std::printf("CODES %-5s %d of 254 finite codes exact%s\n", name, exact, kHow == kFp8Convert ? " (the engine's conversion)" : "");
  return exact;
}

// ---------------------------------------------------------------------------------------------- the shapes

struct Shape {
  const char* name;
  int n, k;
  int reference_stride;  // the reference covers output rows n % stride == 0 and the last 64
};
const Shape kShapes[] = {
    {"qkv", 2560, 2048, 1}, {"o", 2048, 2048, 1}, {"gate_up", 12288, 2048, 1}, {"down", 2048, 6144, 1},
    {"lm_head", 130560, 2048, 64},
};
const int kRowCounts[] = {1, 4, 8, 16, 32, 64};

// One GEMM weight in both formats on the device, in the engine's tiled layouts (filled there from the element
// functions above); the host recomputes any element it needs.
struct Weights {
  int n, k;
  uint64_t seed;
  bf16* device_bf16 = nullptr;
  uint8_t* device_fp8 = nullptr;
  float* device_scales = nullptr;

  double value(bool fp8, int64_t row, int64_t col) const {
    const uint64_t i = static_cast<uint64_t>(row) * k + col;
    return fp8 ? e4m3_value(weight_code(seed, i)) * static_cast<double>(weight_scale(seed, row))
               : bf16_value(weight_bf16(seed, i));
  }
};

__global__ void fill_weights_kernel(Weights w) {
  const int64_t count = static_cast<int64_t>(w.n) * w.k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / w.k, c = i % w.k;
    const uint16_t bits = weight_bf16(w.seed, i);
    w.device_bf16[tiled_index(r, c, w.k)] = *reinterpret_cast<const bf16*>(&bits);
    w.device_fp8[tiled_fp8_index(r, c, w.k)] = weight_code(w.seed, i);
    if (c == 0) w.device_scales[r] = weight_scale(w.seed, r);
  }
}

Weights make_weights(int n, int k, uint64_t seed) {
  Weights w{n, k, seed};
  CHECK_CUDA(cudaMalloc(&w.device_bf16, tiled_elements(n, k) * sizeof(bf16)));
  CHECK_CUDA(cudaMalloc(&w.device_fp8, tiled_fp8_bytes(n, k)));
  CHECK_CUDA(cudaMalloc(&w.device_scales, n * sizeof(float)));
  CHECK_CUDA(cudaMemset(w.device_bf16, 0, tiled_elements(n, k) * sizeof(bf16)));  // the padding
  CHECK_CUDA(cudaMemset(w.device_fp8, 0, tiled_fp8_bytes(n, k)));
  fill_weights_kernel<<<2048, 256>>>(w);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  return w;
}

void free_weights(Weights& w) {
  cudaFree(w.device_bf16);
  cudaFree(w.device_fp8);
  cudaFree(w.device_scales);
}

// What every launch of one shape shares: the step state, split-K scratch, the outputs.
struct Buffers {
  StepState* state = nullptr;
  float* split_partials = nullptr;
  unsigned* split_counters = nullptr;
  bf16* x = nullptr;
  float* residual = nullptr;
  float* ssq = nullptr;
  bf16* out = nullptr;
};

Buffers make_buffers(const Shape& s, const std::vector<uint16_t>& x, const GemmTuning& tuning) {
  Buffers b;
  StepState state{};
  CHECK_CUDA(cudaMalloc(&b.state, sizeof(StepState)));
  CHECK_CUDA(cudaMemcpy(b.state, &state, sizeof(StepState), cudaMemcpyHostToDevice));
  size_t scratch = 0;
  GemmTuning more_splits = tuning;
  more_splits.blocks_per_sm = 4;
  for (const GemmTuning& t : {tuning, more_splits}) {
    for (int rows : kRowCounts) {
      for (bool fp8 : {false, true}) scratch = std::max(scratch, gemm_plan(s.n, s.k, rows, t, fp8).scratch_floats);
    }
  }
  CHECK_CUDA(cudaMalloc(&b.split_partials, std::max<size_t>(1, scratch) * sizeof(float)));
  const int tiles = ceil_div(s.n, kGemmTileRows);
  CHECK_CUDA(cudaMalloc(&b.split_counters, tiles * sizeof(unsigned)));
  CHECK_CUDA(cudaMemset(b.split_counters, 0, tiles * sizeof(unsigned)));
  b.x = reinterpret_cast<bf16*>(device_copy(x));
  CHECK_CUDA(cudaMalloc(&b.residual, sizeof(float) * kMaxRows * s.n));
  CHECK_CUDA(cudaMalloc(&b.ssq, sizeof(float) * tiles * kMaxRows));
  CHECK_CUDA(cudaMalloc(&b.out, sizeof(uint16_t) * kMaxRows * s.n));
  return b;
}

void free_buffers(Buffers& b) {
  for (void* p : {static_cast<void*>(b.state), static_cast<void*>(b.split_partials), static_cast<void*>(b.split_counters),
                  static_cast<void*>(b.x), static_cast<void*>(b.residual), static_cast<void*>(b.ssq),
                  static_cast<void*>(b.out)}) {
    cudaFree(p);
  }
}

void set_rows(const Buffers& b, int rows) {
  StepState state{};
  state.rows = rows;
  CHECK_CUDA(cudaMemcpy(b.state, &state, sizeof(StepState), cudaMemcpyHostToDevice));
}

GemmParams params_for(const Shape& s, const Weights& w, const Buffers& b, bool fp8) {
  GemmParams p{};
  p.weight = fp8 ? nullptr : w.device_bf16;
  p.weight_fp8 = fp8 ? w.device_fp8 : nullptr;
  p.weight_scale = fp8 ? w.device_scales : nullptr;
  p.n_rows = s.n;
  p.n_out = s.n;
  p.k = s.k;
  p.state = b.state;
  p.x = b.x;
  p.x_stride = s.k;
  p.out = b.out;
  p.out_stride = s.n;
  p.residual_out = b.residual;
  p.ssq_out = b.ssq;
  p.split_partials = b.split_partials;
  p.split_counters = b.split_counters;
  return p;
}

// ---------------------------------------------------------------------------------------------- CHECK

// ref[m][j] = sum_k x[m][k] W[row_j][k] in fp64 for the covered output rows, all kMaxRows input rows.
std::vector<double> reference(const Shape& s, const Weights& w, bool fp8, const std::vector<uint16_t>& x,
                              const std::vector<int>& covered) {
  std::vector<double> ref(static_cast<size_t>(kMaxRows) * covered.size());
  std::vector<double> xd(x.size());
  for (size_t i = 0; i < x.size(); ++i) xd[i] = bf16_value(x[i]);
  const int workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int t = 0; t < workers; ++t) {
    pool.emplace_back([&, t] {
      std::vector<double> row(s.k);
      for (size_t j = t; j < covered.size(); j += workers) {
        for (int c = 0; c < s.k; ++c) row[c] = w.value(fp8, covered[j], c);
        for (int m = 0; m < kMaxRows; ++m) {
          double sum = 0;
          const double* xm = xd.data() + static_cast<size_t>(m) * s.k;
          for (int c = 0; c < s.k; ++c) sum += xm[c] * row[c];
          ref[static_cast<size_t>(m) * covered.size() + j] = sum;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  return ref;
}

struct Verdict {
  double worst = 0;  // max over rows of |out - ref| / |ref| (covered columns)
  long bad = 0;      // NaN, unwritten or changed-where-it-must-not outputs
};

// Runs one GEMM and validates it against `ref`. The epilogue: residual_add (fp32) or store_bf16 (bf16).
Verdict run_check(const Shape& s, const Weights& w, const Buffers& b, const std::vector<double>& ref,
                  const std::vector<int>& covered, bool fp8, int rows, GemmEpilogue epilogue, const GemmTuning& tuning) {
  set_rows(b, rows);
  const size_t outputs = static_cast<size_t>(kMaxRows) * s.n;
  std::vector<float> start(outputs);
  Rng rng{static_cast<uint64_t>(rows) * 7919 + s.n};
  for (float& v : start) v = 2.0f * rng.uniform() - 1.0f;
  CHECK_CUDA(cudaMemcpy(b.residual, start.data(), outputs * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(b.out, 0xff, outputs * sizeof(uint16_t)));  // NaN poison
  gemm(params_for(s, w, b, fp8), GemmInput::bf16_rows, epilogue, rows, tuning, nullptr, false);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> got(outputs);
  if (epilogue == GemmEpilogue::residual_add) {
    std::vector<float> residual(outputs);
    CHECK_CUDA(cudaMemcpy(residual.data(), b.residual, outputs * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < outputs; ++i) got[i] = static_cast<double>(residual[i]) - start[i];
  } else {
    std::vector<uint16_t> out(outputs);
    CHECK_CUDA(cudaMemcpy(out.data(), b.out, outputs * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < outputs; ++i) got[i] = bf16_value(out[i]);
  }
  Verdict v;
  for (int m = 0; m < kMaxRows; ++m) {
    if (m >= rows) {  // rows the forward does not have: untouched
      for (int n = 0; n < s.n; n += 97) {
        const double g = got[static_cast<size_t>(m) * s.n + n];
        v.bad += epilogue == GemmEpilogue::residual_add ? g != 0.0 : !std::isnan(g);
      }
      continue;
    }
    double diff = 0, norm = 0;
    for (size_t j = 0; j < covered.size(); ++j) {
      const double g = got[static_cast<size_t>(m) * s.n + covered[j]];
      const double r = ref[static_cast<size_t>(m) * covered.size() + j];
      if (!std::isfinite(g)) ++v.bad;
      diff += (g - r) * (g - r);
      norm += r * r;
    }
    v.worst = std::max(v.worst, std::sqrt(diff / norm));
  }
  return v;
}

// ---------------------------------------------------------------------------------------------- TIME

// Microseconds per GEMM: `copies` GEMMs over distinct weights in one graph (the engine's PDL between them),
// replayed; the median of 15 replays after 3.
double time_gemms(const Shape& s, const std::vector<Weights>& copies, const Buffers& b, bool fp8, int rows,
                  const GemmTuning& tuning) {
  set_rows(b, rows);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (const Weights& w : copies) {
    gemm(params_for(s, w, b, fp8), GemmInput::bf16_rows, GemmEpilogue::store_bf16, rows, tuning, stream, true);
  }
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int it = -3; it < 15; ++it) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (it >= 0) us.push_back(ms * 1e3 / copies.size());
  }
  std::sort(us.begin(), us.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--probe") {  // bench/device-fp8.sh: does this binary run on this machine at all
    std::printf("fp8_gemm_bench\n");
    return 0;
  }
  const bool check_only = mode == "--check-only";
  try {
    cudaDeviceProp props{};
    CHECK_CUDA(cudaGetDeviceProperties(&props, 0));
    std::printf("device %s, %d SMs; conversion %s\n", props.name, props.multiProcessorCount,
                kFp8Convert == Fp8Convert::cvt ? "cvt" : "shift");
    GemmTuning tuning;
    tuning.sm_count = props.multiProcessorCount;
    int failures = 0;

    const int cvt = exact_codes<Fp8Convert::cvt>("cvt");
    const int shift = exact_codes<Fp8Convert::shift>("shift");
    failures += (kFp8Convert == Fp8Convert::cvt ? cvt : shift) != 254;

    struct Timing {
      std::string shape, variant;
      int rows;
      double us, tbps;
    };
    std::vector<Timing> timings;
    for (const Shape& s : kShapes) {
      std::vector<uint16_t> x(static_cast<size_t>(kMaxRows) * s.k);
      Rng rng{static_cast<uint64_t>(s.n) * 31 + s.k};
      for (auto& h : x) h = bf16_bits(2.0f * rng.uniform() - 1.0f);
      std::vector<int> covered;
      for (int n = 0; n < s.n; ++n) {
        if (n % s.reference_stride == 0 || n >= s.n - 64) covered.push_back(n);
      }
      Weights w = make_weights(s.n, s.k, 1000 + s.n);
      Buffers b = make_buffers(s, x, tuning);
      GemmTuning loads8 = tuning, splits4 = tuning;
      loads8.loads = 8;
      splits4.blocks_per_sm = 4;
      for (bool fp8 : {false, true}) {
        const std::vector<double> ref = reference(s, w, fp8, x, covered);
        for (int rows : kRowCounts) {
          for (GemmEpilogue epilogue : {GemmEpilogue::residual_add, GemmEpilogue::store_bf16}) {
            const bool fp32 = epilogue == GemmEpilogue::residual_add;
            const double tolerance = fp32 ? 2e-5 : 4e-3;
            for (const auto& [label, t] : {std::pair<const char*, const GemmTuning&>{"default", tuning},
                                           {"loads8", loads8}, {"splits4", splits4}}) {
              if (!fp8 && t.loads != tuning.loads) continue;  // bf16's variants are the engine's own checks
              const Verdict v = run_check(s, w, b, ref, covered, fp8, rows, epilogue, t);
              const bool ok = v.worst <= tolerance && v.bad == 0;
              failures += !ok;
              std::printf("CHECK %-8s rows %2d %-4s %-12s %-8s rel err %.2e (tol %.0e) untouched/finite %s  %s\n", s.name,
                          rows, fp8 ? "fp8" : "bf16", fp32 ? "residual_add" : "store_bf16", label, v.worst, tolerance,
                          v.bad == 0 ? "ok" : (std::to_string(v.bad) + " bad").c_str(), ok ? "PASS" : "FAIL");
            }
          }
        }
      }
      free_weights(w);
      if (!check_only) {
        // Distinct copies streaming well past the L2 (at least 512 MB of bf16 weights, at least 2 copies).
        const size_t bytes = static_cast<size_t>(s.n) * s.k * 2;
        const int count = static_cast<int>(std::max<size_t>(2, (size_t(512) << 20) / bytes + 1));
        std::vector<Weights> copies;
        for (int i = 0; i < count; ++i) copies.push_back(make_weights(s.n, s.k, 5000 + i));
        for (int rows : {1, 4, 8, 16, 32, 64}) {
          for (const auto& [label, fp8, t] : {std::tuple<const char*, bool, const GemmTuning&>{"bf16", false, tuning},
                                              {"fp8", true, tuning}, {"fp8 loads8", true, loads8},
                                              {"fp8 splits4", true, splits4}}) {
            const double us = time_gemms(s, copies, b, fp8, rows, t);
            const double tbps = (fp8 ? bytes / 2 : bytes) / (us * 1e-6) / 1e12;
            timings.push_back({s.name, label, rows, us, tbps});
            std::printf("TIME  %-8s rows %2d %-12s %8.2f us  %.2f TB/s  (%d copies)\n", s.name, rows, label, us, tbps,
                        count);
          }
        }
        for (Weights& c : copies) free_weights(c);
      }
      free_buffers(b);
    }

    if (!timings.empty()) {
      std::printf("\nus per GEMM (TB/s of weights), conversion %s\n%-8s %4s", kFp8Convert == Fp8Convert::cvt ? "cvt" : "shift",
                  "shape", "rows");
      const char* variants[] = {"bf16", "fp8", "fp8 loads8", "fp8 splits4"};
      for (const char* v : variants) std::printf(" %18s", v);
      std::printf("\n");
      for (size_t i = 0; i < timings.size(); i += 4) {
        std::printf("%-8s %4d", timings[i].shape.c_str(), timings[i].rows);
        for (size_t j = i; j < i + 4; ++j) std::printf("   %7.2f (%5.2f)", timings[j].us, timings[j].tbps);
        std::printf("\n");
      }
    }
    std::printf("fp8_gemm_bench: %s\n", failures == 0 ? "every check PASS" : (std::to_string(failures) + " FAILED").c_str());
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("fp8_gemm_bench: error: %s\n", e.what());
    return 1;
  }
}
