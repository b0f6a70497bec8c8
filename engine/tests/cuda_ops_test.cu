// The CUDA op table (llama.cpp's test-backend-ops, for this engine): every kernel of engine/cuda/ through its
// public launch function, on random inputs of several shapes (the MiniCPM5-2B shapes: hidden 2048, 16 q heads
// and 2 KV heads of 128, intermediate 6144, vocab 130560; and odd sizes that leave partial tiles and chunks),
// against the CPU backend's op (engine/src/cpu_kernels.h) or, where the CPU backend has no separate op, a plain
// double-precision reference written here. Weights are placed by the engine's own convert_rows / place_fp8_rows
// (weights.cuh), so the tiled fragment layout is the engine's, not a copy of it. Every output is filled with
// NaN before the launch, so an element the kernel should write and does not fails its case.
//
// One line per case: op, variant, shape, max_abs_err, max_rel_err, tolerance, PASS|FAIL. An element passes when
// |got - ref| <= abs + rms * rms(ref) + rel * |ref| (rms(ref): the root mean square of that output, which keeps
// the bound meaningful where a dot product cancels to near zero); max_rel_err is |got - ref| / max(|ref|,
// rms(ref)). A case with several outputs (a residual and its sums of squares, logits and the chosen token)
// states each output's tolerance, separated by ';'. Exit status 1 when any case fails.
//   a2d_cuda_ops_test [--filter SUBSTR]   (only the cases whose "op variant shape" line contains SUBSTR)
//   a2d_cuda_ops_test --probe             (exit 0 at once when a GPU is present: the binary loads)
// bench/device-ops.sh runs it on the GPU machine.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "attention.cuh"
#include "attention_prefill.cuh"
#include "cpu_kernels.h"
#include "embed.cuh"
#include "gemm.cuh"
#include "gemm_prefill.cuh"
#include "model.h"
#include "reveal.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "thread_pool.h"
#include "weights.cuh"

using namespace a2d::cuda;
using a2d::AdapterRule;
using a2d::DType;
using a2d::LowRank;
using a2d::Tensor;
using a2d::ThreadPool;

namespace {

// ------------------------------------------------------------------------------------------- host values

uint16_t bf16_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}
float round_bf16(float v) { return bf16_value(bf16_bits(v)); }

struct Rng {  // SplitMix64: the same inputs on every run
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
};

// bf16 values uniform in [lo, hi): the bits the device gets and the values the reference multiplies.
struct Bf16Values {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
Bf16Values random_bf16(Rng& rng, size_t count, float lo, float hi) {
  Bf16Values v;
  v.bits.resize(count);
  v.values.resize(count);
  for (size_t i = 0; i < count; ++i) {
    v.bits[i] = bf16_bits(rng.uniform(lo, hi));
    v.values[i] = bf16_value(v.bits[i]);
  }
  return v;
}

std::vector<float> random_floats(Rng& rng, size_t count, float lo, float hi) {
  std::vector<float> v(count);
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

// ------------------------------------------------------------------------------------------- device memory

cudaStream_t g_stream = nullptr;  // a blocking stream: the synchronous copies below order with it
int g_sm_count = 0;

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    A2D_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(1, count) * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& host) {
    A2D_CUDA_CHECK(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  void zero() { A2D_CUDA_CHECK(cudaMemset(data_, 0, count_ * sizeof(T))); }
  // All bytes 0xff: NaN as bf16 and as fp32, -1 as an int.
  void poison() { A2D_CUDA_CHECK(cudaMemset(data_, 0xff, count_ * sizeof(T))); }
  std::vector<T> download() const {
    A2D_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    std::vector<T> host(count_);
    A2D_CUDA_CHECK(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t count_;
};

bf16* as_bf16(const DeviceArray<uint16_t>& a) { return reinterpret_cast<bf16*>(a.get()); }

// ------------------------------------------------------------------------------------------- the table

struct Tolerance {
  double rel;
  double rms;
  double abs;
};
// "8e-03r+2e-03rms": rel x |ref| + rms x rms(ref) + abs.
std::string describe(const Tolerance& t) {
  std::string s;
  auto term = [&](double value, const char* unit) {
    char text[32];
    std::snprintf(text, sizeof(text), "%s%.0e%s", s.empty() ? "" : "+", value, unit);
    s += text;
  };
  if (t.rel > 0) term(t.rel, "r");
  if (t.rms > 0) term(t.rms, "rms");
  if (t.abs > 0 || s.empty()) term(t.abs, "");
  return s;
}

// One case's outputs: each add() is one output with its tolerance.
class Check {
 public:
  void add(const std::vector<double>& got, const std::vector<double>& ref, const Tolerance& tol) {
    if (got.size() != ref.size()) throw std::logic_error("check: sizes differ");
    double squares = 0;
    for (double r : ref) squares += r * r;
    const double rms = ref.empty() ? 0 : std::sqrt(squares / ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::isfinite(got[i]) ? std::fabs(got[i] - ref[i]) : INFINITY;
      const double limit = tol.abs + tol.rms * rms + tol.rel * std::fabs(ref[i]);
      if (!(err <= limit)) {
        if (ok_) first_bad_ = "output " + std::to_string(outputs_) + " element " + std::to_string(i) + ": got " +
                              std::to_string(got[i]) + ", want " + std::to_string(ref[i]);
        ok_ = false;
      }
      max_abs_ = std::max(max_abs_, err);
      const double scale = std::max(std::fabs(ref[i]), rms);
      max_rel_ = std::max(max_rel_, scale > 0 ? err / scale : (err > 0 ? INFINITY : 0.0));
    }
    const std::string d = describe(tol);
    if (tolerance_.find(d) == std::string::npos) tolerance_ += (tolerance_.empty() ? "" : ";") + d;
    ++outputs_;
  }
  // A condition that is not a number (a region the kernel must not write, a token id in range).
  void require(bool condition, const std::string& what) {
    if (!condition && ok_) first_bad_ = what;
    ok_ = ok_ && condition;
  }
  bool ok() const { return ok_; }
  double max_abs() const { return max_abs_; }
  double max_rel() const { return max_rel_; }
  const std::string& tolerance() const { return tolerance_; }
  const std::string& first_bad() const { return first_bad_; }

 private:
  bool ok_ = true;
  double max_abs_ = 0, max_rel_ = 0;
  int outputs_ = 0;
  std::string tolerance_, first_bad_;
};

class Table {
 public:
  explicit Table(std::string filter) : filter_(std::move(filter)) {}
  bool wanted(const std::string& op, const std::string& variant, const std::string& shape) const {
    return filter_.empty() || (op + " " + variant + " " + shape).find(filter_) != std::string::npos;
  }
  // Runs one case (skipped when the filter leaves it out): `body` fills the check.
  void run(const std::string& op, const std::string& variant, const std::string& shape,
           const std::function<void(Check&)>& body) {
    if (!wanted(op, variant, shape)) return;
    Check check;
    std::string error;
    try {
      body(check);
    } catch (const std::exception& e) {
      error = e.what();
    }
    const bool ok = error.empty() && check.ok();
    ++cases_;
    failures_ += ok ? 0 : 1;
    std::printf("%-18s %-40s %-32s %10.3e %10.3e  %-28s %s\n", op.c_str(), variant.c_str(), shape.c_str(),
                check.max_abs(), check.max_rel(), check.tolerance().c_str(), ok ? "PASS" : "FAIL");
    if (!error.empty()) std::printf("    error: %s\n", error.c_str());
    if (error.empty() && !ok) std::printf("    first failure: %s\n", check.first_bad().c_str());
    std::fflush(stdout);
  }
  int cases() const { return cases_; }
  int failures() const { return failures_; }

 private:
  std::string filter_;
  int cases_ = 0, failures_ = 0;
};

template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}
std::vector<double> bf16_to_double(const std::vector<uint16_t>& bits) {
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = bf16_value(bits[i]);
  return v;
}
// Elements [begin, end) of a poisoned output that must still hold the poison (all bytes 0xff).
template <typename T>
bool untouched(const std::vector<T>& v, size_t begin, size_t end) {
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = begin * sizeof(T); i < end * sizeof(T); ++i) {
    if (bytes[i] != 0xff) return false;
  }
  return true;
}

// Tolerances, one per kind of output (the README's table repeats them):
// - a bf16 output of fp32 arithmetic: one bf16 rounding (2^-9 relative, 2^-8 where fp32 differences put the value
//   on the other side of a rounding boundary), plus 2e-3 of the output's rms for the accumulation order and for
//   the normalised input's own bf16 rounding (an input element on a rounding boundary rounds either way);
// - an fp32 output of bf16 products (residual add, logits): 1e-3 of the rms (summation order, the same inputs);
// - attention (bf16 probabilities multiply V on the tensor cores, 2^-9 each): 2e-2 of the rms, 1e-2 relative;
// - exact copies (embedding rows): 0.
constexpr Tolerance kBf16Out{8e-3, 2e-3, 0};
constexpr Tolerance kFp32Gemm{0, 1e-3, 0};
constexpr Tolerance kSumOfSquares{1e-4, 1e-6, 0};
constexpr Tolerance kAttention{1e-2, 2e-2, 0};
constexpr Tolerance kExact{0, 0, 0};

StepState make_state(int cached, int commit, int rows) {
  StepState s;
  std::memset(&s, 0, sizeof(s));
  s.cached = cached;
  s.commit = commit;
  s.rows = rows;
  s.serial = 7;  // a forward's number (never 0)
  return s;
}

std::string dims(std::initializer_list<std::pair<const char*, long>> parts) {
  std::string s;
  for (const auto& [name, value] : parts) s += (s.empty() ? "" : " ") + std::string(name) + std::to_string(value);
  return s;
}

int bucket_rows(int rows) { return ceil_div(rows, 8) * 8; }

// ------------------------------------------------------------------------------------------- GEMM weights

// A weight matrix in HF row order [n][k]: bf16, or e4m3 codes with an fp32 scale per row. tensor() is the same
// bytes as the CPU backend reads them.
struct HostWeight {
  int64_t n = 0, k = 0;
  bool fp8 = false;
  std::vector<uint16_t> bits;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Tensor tensor() const {
    Tensor t;
    t.dtype = fp8 ? DType::f8_e4m3 : DType::bf16;
    t.shape = {n, k};
    t.data = fp8 ? static_cast<const void*>(codes.data()) : static_cast<const void*>(bits.data());
    t.scale = fp8 ? scales.data() : nullptr;
    return t;
  }
};

// Values of magnitude about 1 / sqrt(k), so that a dot product with inputs in [-1, 1] is about 1/3.
HostWeight random_weight(Rng& rng, int64_t n, int64_t k, bool fp8) {
  HostWeight w;
  w.n = n;
  w.k = k;
  w.fp8 = fp8;
  const float bound = 1.f / std::sqrt(static_cast<float>(k));
  if (!fp8) {
    w.bits.resize(size_t(n) * k);
    for (uint16_t& b : w.bits) b = bf16_bits(rng.uniform(-bound, bound));
    return w;
  }
  // Every finite e4m3 code (S.1111.111 is NaN), whose values reach 448; the row scale brings them to the bound.
  w.codes.resize(size_t(n) * k);
  for (uint8_t& c : w.codes) {
    do c = static_cast<uint8_t>(rng.next() & 0xff);
    while ((c & 0x7f) == 0x7f);
  }
  w.scales.resize(n);
  for (float& s : w.scales) s = bound / 160.f * rng.uniform(0.5f, 1.5f);
  return w;
}

// One part of a logical matrix and where the engine puts its rows (weights.cuh, RowPlacement).
struct Part {
  int64_t first_row;
  int64_t rows;
  RowPlacement at;
};

// The GEMM row order the engine uses for each epilogue (model.cu, DeviceModel::upload): q and k heads in
// rope-pair order for the fused RoPE, gate and up interleaved 8 by 8, everything else as stored.
struct GemmLayout {
  std::vector<Part> parts;
  int n_rows;  // GEMM rows (padded gate/up tiles included)
  int n_out;
};
GemmLayout rope_qkv_layout(int heads, int kv_heads, int head_dim) {
  const int64_t q = int64_t(heads) * head_dim, kv = int64_t(kv_heads) * head_dim;
  return {{{0, q, rope_pair_rows(0, head_dim / 2)},
           {q, kv, rope_pair_rows(q, head_dim / 2)},
           {q + kv, kv, contiguous_rows(q + kv)}},
          int(q + 2 * kv), int(q + 2 * kv)};
}
GemmLayout silu_layout(int intermediate) {
  return {{{0, intermediate, RowPlacement{8, 16, 0, 0}}, {intermediate, intermediate, RowPlacement{8, 16, 8, 0}}},
          ceil_div(intermediate, 8) * 16, intermediate};
}
GemmLayout plain_layout(int n) { return {{{0, n, contiguous_rows(0)}}, n, n}; }

// A weight on the device in the GEMM layout, placed part by part with the engine's functions.
struct DeviceWeight {
  std::unique_ptr<DeviceArray<uint16_t>> tiled;
  std::unique_ptr<DeviceArray<uint8_t>> fp8;
  std::unique_ptr<DeviceArray<float>> scales;
};
DeviceWeight place_weight(const HostWeight& w, const GemmLayout& layout) {
  DeviceWeight d;
  if (!w.fp8) {
    DeviceArray<uint16_t> source(w.bits);
    d.tiled = std::make_unique<DeviceArray<uint16_t>>(size_t(tiled_elements(layout.n_rows, w.k)));
    d.tiled->zero();  // the padding rows and columns must be zeros
    for (const Part& part : layout.parts) {
      convert_rows(source.get() + part.first_row * w.k, SourceType::bf16, part.rows, w.k, as_bf16(*d.tiled), part.at,
                   true, g_stream);
    }
  } else {
    DeviceArray<uint8_t> source(w.codes);
    DeviceArray<float> scales(w.scales);
    d.fp8 = std::make_unique<DeviceArray<uint8_t>>(size_t(tiled_fp8_bytes(layout.n_rows, w.k)));
    d.fp8->zero();
    d.scales = std::make_unique<DeviceArray<float>>(size_t(layout.n_rows));
    d.scales->zero();
    for (const Part& part : layout.parts) {
      place_fp8_rows(source.get() + part.first_row * w.k, part.rows, w.k, d.fp8->get(), part.at, g_stream);
      place_scales(scales.get() + part.first_row, part.rows, d.scales->get(), part.at, g_stream);
    }
  }
  A2D_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  return d;
}

// Rows of `cols` bf16 values per logical row (a bias: cols 1; the adapter's B: its rank) in the GEMM's row order.
std::unique_ptr<DeviceArray<uint16_t>> place_rows(const std::vector<uint16_t>& bits, int cols, const GemmLayout& layout) {
  DeviceArray<uint16_t> source(bits);
  auto d = std::make_unique<DeviceArray<uint16_t>>(size_t(layout.n_rows) * cols);
  d->zero();
  for (const Part& part : layout.parts) {
    convert_rows(source.get() + part.first_row * cols, SourceType::bf16, part.rows, cols, as_bf16(*d), part.at, false,
                 g_stream);
  }
  A2D_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  return d;
}

// ------------------------------------------------------------------------------------------- references

// Each residual row's RMSNorm scale 1 / sqrt(sum / k + eps).
std::vector<float> rms_scales(const std::vector<float>& residual, int rows, int k, float eps) {
  std::vector<float> scale(rows);
  for (int t = 0; t < rows; ++t) {
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += double(residual[size_t(t) * k + i]) * residual[size_t(t) * k + i];
    scale[t] = static_cast<float>(1.0 / std::sqrt(sum / k + eps));
  }
  return scale;
}

// The residual rows as the GEMMs' normalising load and mask_adapter_down compute them: bf16(h * scale * w). With
// the sums of squares staged (GemmTuning::stage_ssq) the GEMM loads bf16(h * 1 * w) and multiplies the dot
// products by the scale after the K loop: `scale` all ones here, the caller scales the products.
std::vector<float> normalised_rows(const std::vector<float>& residual, int rows, int k, const std::vector<float>& norm,
                                   const std::vector<float>& scale) {
  std::vector<float> x(size_t(rows) * k);
  for (int t = 0; t < rows; ++t) {
    for (int i = 0; i < k; ++i) x[size_t(t) * k + i] = round_bf16(residual[size_t(t) * k + i] * scale[t] * norm[i]);
  }
  return x;
}

// The producer's partial sums of squares: part p of row t covers columns 16p..16p+15 (a residual-add GEMM's
// tile), [parts][kMaxRows]; parts 1: the whole row (the embedding's).
std::vector<float> sums_of_squares(const std::vector<float>& residual, int rows, int k, bool per_tile) {
  const int parts = per_tile ? ceil_div(k, 16) : 1;
  std::vector<float> ssq(size_t(parts) * kMaxRows, 0.f);
  for (int t = 0; t < rows; ++t) {
    for (int i = 0; i < k; ++i) {
      const float v = residual[size_t(t) * k + i];
      ssq[size_t(per_tile ? i / 16 : 0) * kMaxRows + t] += v * v;
    }
  }
  return ssq;
}

// Logical rows of `got` (GEMM row order in the engine's layout is undone by the caller's indexing).
std::vector<float> silu_mul_reference(const std::vector<float>& y, int rows, int intermediate) {
  std::vector<float> out(size_t(rows) * intermediate);
  for (int t = 0; t < rows; ++t) {
    for (int i = 0; i < intermediate; ++i) {
      const double gate = y[size_t(t) * 2 * intermediate + i], up = y[size_t(t) * 2 * intermediate + intermediate + i];
      out[size_t(t) * intermediate + i] = static_cast<float>(gate / (1.0 + std::exp(-gate)) * up);
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------- decode GEMM

struct GemmShape {
  std::string name;
  GemmEpilogue epilogue;
  int k;
  int n = 0;  // outputs (store, residual add, logits) or the intermediate size (silu)
  int heads = 0, kv_heads = 0, head_dim = 0;  // rope_qkv
  bool bias = false;
  int adapter_rank = 0;  // > 0: a row adapter of this rank on each target of the GEMM (q, k, v / gate, up / one)
  bool adapter_window = false;  // its rule: every window row (true) or the window rows holding the mask token
  // The rows as two sequences of one forward (continuous batching, step_state.cuh), each with commit rows and a
  // window, on KV cache slots of their own at positions of their own: the adapter acts on both windows, and
  // rope_qkv rotates each row by its sequence's position and writes K and V into its sequence's slot.
  bool two_sequences = false;
};

// The targets a GEMM's adapter carries, as the engine's sites do (model.cu): [first logical row, rows) each.
std::vector<std::pair<int64_t, int64_t>> adapter_targets(const GemmShape& s, int64_t logical_rows) {
  if (s.epilogue == GemmEpilogue::rope_qkv) {
    const int64_t q = int64_t(s.heads) * s.head_dim, kv = int64_t(s.kv_heads) * s.head_dim;
    return {{0, q}, {q, kv}, {q + kv, kv}};
  }
  if (s.epilogue == GemmEpilogue::silu_mul) return {{0, s.n}, {s.n, s.n}};
  return {{0, logical_rows}};
}

const char* epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::store_bf16: return "store_bf16";
    case GemmEpilogue::silu_mul: return "silu_mul";
    case GemmEpilogue::residual_add: return "residual_add";
    case GemmEpilogue::logits: return "logits";
    case GemmEpilogue::rope_qkv: return "rope_qkv";
  }
  return "?";
}

GemmLayout layout_of(const GemmShape& s) {
  switch (s.epilogue) {
    case GemmEpilogue::rope_qkv: return rope_qkv_layout(s.heads, s.kv_heads, s.head_dim);
    case GemmEpilogue::silu_mul: return silu_layout(s.n);
    default: return plain_layout(s.n);
  }
}

// What gemm_plan picks for this GEMM under the engine's default tuning.
std::string plan_name(const GemmPlan& plan) {
  if (plan.wide) return "wide s" + std::to_string(plan.splits);
  return "tile L" + std::to_string(plan.loads) + " s" + std::to_string(plan.splits);
}

// One decode GEMM shape: its weights made and placed once, then one case per row count. The input is what
// enqueue_forward gives each GEMM: up to 8 rows the qkv, gate/up and lm_head GEMMs normalise the fp32 residual at
// the load; above, they read bf16 rows (rmsnorm_rows wrote them); o and down read bf16 rows always.
// The rope_qkv epilogue's outputs against the CPU op: RoPE on the reference projections' q and k heads at
// positions cached + t, then q (rows x H x D) and each row's k and v in cache slot cached + t of its KV head;
// the cache slots before the forward's must keep their poison.
// Row t sits at `positions[t]` of KV cache slot `slots[t]` (slot_stride elements a slot); each slot's rows start at
// its first position, before which its cache must stay as it was.
// y is taken by value: it is rotated here, and a caller checks several kernels against the same product.
void check_rope_qkv(Check& check, std::vector<float> y, int rows, int logical_rows, const std::vector<int64_t>& positions,
                    const std::vector<int>& slots, size_t slot_stride, int H, int KV, int D, int max_context,
                    const DeviceArray<uint16_t>& out, const DeviceArray<uint16_t>& k_cache, const DeviceArray<uint16_t>& v_cache) {
  a2d::cpu::rope(y.data(), rows, logical_rows, H + KV, D, positions.data(), 1e6);
  const std::vector<uint16_t> q_got = out.download(), k_got = k_cache.download(), v_got = v_cache.download();
  std::vector<double> got, want;
  for (int t = 0; t < rows; ++t) {
    for (int i = 0; i < H * D; ++i) {
      got.push_back(bf16_value(q_got[size_t(t) * H * D + i]));
      want.push_back(y[size_t(t) * logical_rows + i]);
    }
    for (int h = 0; h < KV; ++h) {
      for (int d = 0; d < D; ++d) {
        const size_t slot = slots[t] * slot_stride + (size_t(h) * max_context + positions[t]) * D + d;
        got.push_back(bf16_value(k_got[slot]));
        want.push_back(y[size_t(t) * logical_rows + (H + h) * D + d]);
        got.push_back(bf16_value(v_got[slot]));
        want.push_back(y[size_t(t) * logical_rows + (H + KV + h) * D + d]);
      }
    }
  }
  check.add(got, want, kBf16Out);
  for (int t = 0; t < rows; ++t) {
    if (t > 0 && slots[t] == slots[t - 1]) continue;  // a sequence's first row: its slot's positions before it
    const size_t first = slots[t] * slot_stride, count = size_t(positions[t]) * D;
    check.require(untouched(k_got, first, first + count) && untouched(v_got, first, first + count),
                  "cache positions before the forward's were written (slot " + std::to_string(slots[t]) + ")");
  }
}

void gemm_cases(Table& table, ThreadPool& pool, const GemmShape& s, bool fp8, const std::vector<int>& row_counts,
                uint64_t seed) {
  const GemmLayout layout = layout_of(s);
  const int64_t logical_rows = s.epilogue == GemmEpilogue::silu_mul ? 2 * int64_t(s.n) : layout.n_rows;
  GemmTuning tuning;
  tuning.sm_count = g_sm_count;
  const std::string op = std::string("gemm ") + epilogue_name(s.epilogue);
  // The logits epilogue at 13 rows leaves only the argmax partials (StepState::write_logits 0), as a forward
  // that needs no logits row on the host runs it.
  auto argmax_only = [&](int rows) { return s.epilogue == GemmEpilogue::logits && rows == 13; };
  // The tile kernel stages the producer's sums of squares (and scales after the K loop) up to two row tiles, for
  // unmapped rows and at most 128 parts (gemm.cu, kStageSsq); up to 8 rows, here, as the forward normalises them.
  auto staged_ssq = [&](int rows) {
    return tuning.stage_ssq && bucket_rows(rows) <= 16 && s.epilogue != GemmEpilogue::logits && ceil_div(s.k, 16) <= 128;
  };
  auto variant_of = [&](int rows, bool& normalised) {
    const int max_rows = bucket_rows(rows);
    normalised = s.epilogue != GemmEpilogue::residual_add && max_rows <= 8;
    const GemmPlan plan = gemm_plan(layout.n_rows, s.k, max_rows, tuning, fp8);
    return std::string(fp8 ? "e4m3 " : "bf16 ") +
           (normalised ? (staged_ssq(rows) ? "norm-in staged " : "norm-in ") : "bf16-in ") + plan_name(plan) +
           (s.bias ? " +bias" : "") + (s.adapter_rank > 0 ? (s.adapter_window ? " +window-adapter" : " +mask-adapter") : "") +
           (s.two_sequences ? " two-sequences" : "") + (argmax_only(rows) ? " argmax-only" : "");
  };
  bool any = false;
  for (int rows : row_counts) {
    bool normalised;
    any = any || table.wanted(op, variant_of(rows, normalised), s.name + " rows" + std::to_string(rows));
  }
  if (!any) return;

  Rng rng{seed};
  HostWeight w = random_weight(rng, logical_rows, s.k, fp8);
  const int mask_token = s.epilogue == GemmEpilogue::logits ? s.n - 1 : 7;
  if (s.epilogue == GemmEpilogue::logits) {
    // The mask token's logit large, so that an argmax that does not exclude it picks it.
    if (fp8) {
      w.scales[mask_token] *= 16.f;
    } else {
      for (int64_t i = 0; i < s.k; ++i) {
        uint16_t& b = w.bits[size_t(mask_token) * s.k + i];
        b = bf16_bits(bf16_value(b) * 16.f);
      }
    }
  }
  // A row adapter: A [targets * rank][k] rides the weight after its tiles (GemmParams::adapter_tiles); B
  // [logical rows][rank] and each row's offset in t, in the GEMM's row order.
  const int R = s.adapter_rank;
  const auto targets = adapter_targets(s, logical_rows);
  const int total_rank = R > 0 ? R * static_cast<int>(targets.size()) : 0;
  const int out_tiles = ceil_div(layout.n_rows, kGemmTileRows);
  GemmLayout weight_layout = layout;
  if (R > 0) weight_layout.n_rows = gemm_rows(layout.n_rows, total_rank);
  const DeviceWeight dw = place_weight(w, weight_layout);
  const Tensor wt = w.tensor();
  const Bf16Values adapter_a = random_bf16(rng, size_t(total_rank) * s.k, -0.05f, 0.05f);
  const Bf16Values adapter_b = random_bf16(rng, size_t(logical_rows) * R, -0.2f, 0.2f);
  std::unique_ptr<DeviceArray<uint16_t>> adapter_b_device;
  std::unique_ptr<DeviceArray<int>> adapter_offset_device;
  if (R > 0) {
    DeviceArray<uint16_t> a_source(adapter_a.bits);
    convert_rows(a_source.get(), SourceType::bf16, total_rank, s.k, as_bf16(*dw.tiled), contiguous_rows(int64_t(out_tiles) * 16),
                 true, g_stream);
    adapter_b_device = place_rows(adapter_b.bits, R, layout);
    std::vector<int> offsets(layout.n_rows, 0);
    for (size_t j = 0; j < targets.size(); ++j) {
      for (int64_t r = targets[j].first; r < targets[j].first + targets[j].second; ++r) {
        for (const Part& part : layout.parts) {
          // A part's placement counts rows from the part's first one (place_weight hands it the part alone).
          if (r >= part.first_row && r < part.first_row + part.rows) {
            offsets[placed_row(part.at, r - part.first_row)] = static_cast<int>(j) * R;
          }
        }
      }
    }
    adapter_offset_device = std::make_unique<DeviceArray<int>>(offsets);
  }
  const Bf16Values bias = random_bf16(rng, s.bias ? logical_rows : 0, -0.5f, 0.5f);
  std::unique_ptr<DeviceArray<uint16_t>> bias_device;
  if (s.bias) bias_device = place_rows(bias.bits, 1, layout);
  const Bf16Values norm = random_bf16(rng, s.k, 0.5f, 1.5f);
  DeviceArray<uint16_t> norm_device(norm.bits);

  const int tiles = ceil_div(layout.n_rows, kGemmTileRows);
  const int cached = 29;
  const int max_context = cached + kMaxRows + 3;
  for (int rows : row_counts) {
    bool normalised;
    const std::string variant = variant_of(rows, normalised);
    table.run(op, variant, s.name + " rows" + std::to_string(rows), [&](Check& check) {
      const int max_rows = bucket_rows(rows);
      // Rows 0..commit-1 committed, the window alternates the mask token and others (the adapter acts on the first).
      // Two sequences: rows [0, rows / 2) and the rest, each its first half committed.
      const int commit = rows / 2;
      StepState state = make_state(cached, commit, rows);
      std::vector<bool> window(rows);
      for (int t = 0; t < rows; ++t) window[t] = t >= commit;
      if (s.two_sequences) {
        const int split = rows / 2;
        state.entries = 2;
        for (int e = 0; e < 2; ++e) {
          state.entry_slot[e] = 1 - e;
          state.entry_cached[e] = cached + 7 * e;
          state.entry_row0[e] = e == 0 ? 0 : split;
          state.entry_rows[e] = e == 0 ? split : rows - split;
          state.entry_commit[e] = state.entry_rows[e] / 2;
          for (int t = state.entry_row0[e]; t < state.entry_row0[e] + state.entry_rows[e]; ++t) {
            state.row_entry[t] = e;
            window[t] = t - state.entry_row0[e] >= state.entry_commit[e];
          }
        }
      }
      for (int t = 0, in_window = 0; t < rows; ++t) {
        in_window = window[t] ? in_window + 1 : 0;
        state.tokens[t] = window[t] && in_window % 2 == 1 ? mask_token : 100 + t;
      }
      std::vector<int> logit_rows;
      if (s.epilogue == GemmEpilogue::logits) {
        logit_rows.push_back(0);
        for (int t = std::max(1, rows / 2); t < rows; ++t) logit_rows.push_back(t);
        state.logit_count = static_cast<int>(logit_rows.size());
        state.write_logits = argmax_only(rows) ? 0 : 1;
        for (size_t i = 0; i < logit_rows.size(); ++i) state.logit_rows[i] = logit_rows[i];
      }
      DeviceArray<StepState> state_device(std::vector<StepState>{state});

      // Inputs and the reference's view of them.
      const std::vector<float> residual = random_floats(rng, size_t(rows) * s.k, -2.f, 2.f);
      const Bf16Values x_bf16 = random_bf16(rng, size_t(rows) * s.k, -1.f, 1.f);
      // x: the input as the adapter and a scale-first load see it; x_gemm times row_scale: what the GEMM multiplies.
      const std::vector<float> scales = rms_scales(residual, rows, s.k, 1e-6f);
      const std::vector<float> x = normalised ? normalised_rows(residual, rows, s.k, norm.values, scales) : x_bf16.values;
      const bool scale_after = normalised && staged_ssq(rows);
      const std::vector<float> x_gemm =
          scale_after ? normalised_rows(residual, rows, s.k, norm.values, std::vector<float>(rows, 1.f)) : x;
      DeviceArray<float> residual_device(residual);
      const std::vector<float> ssq = sums_of_squares(residual, rows, s.k, true);
      DeviceArray<float> ssq_device(ssq);
      DeviceArray<uint16_t> x_device(x_bf16.bits);

      GemmParams g{};
      g.weight = fp8 ? nullptr : as_bf16(*dw.tiled);
      g.weight_fp8 = fp8 ? dw.fp8->get() : nullptr;
      g.weight_scale = fp8 ? dw.scales->get() : nullptr;
      g.n_rows = layout.n_rows;
      g.n_out = layout.n_out;
      g.k = s.k;
      g.bias = s.bias ? as_bf16(*bias_device) : nullptr;
      g.state = state_device.get();
      g.x_stride = s.k;
      if (normalised) {
        g.residual_in = residual_device.get();
        g.ssq_in = ssq_device.get();
        g.ssq_in_parts = ceil_div(s.k, 16);
        g.norm_weight = as_bf16(norm_device);
        g.norm_eps = 1e-6f;
      } else {
        g.x = as_bf16(x_device);
      }
      g.use_row_map = s.epilogue == GemmEpilogue::logits;
      g.mask_token_id = mask_token;
      const GemmPlan plan = gemm_plan(layout.n_rows, s.k, max_rows, tuning, fp8, adapter_tile_count(total_rank));
      DeviceArray<float> split_partials(std::max<size_t>(1, plan.scratch_floats));
      DeviceArray<unsigned> split_counters{size_t(ceil_div(weight_layout.n_rows, kGemmTileRows))};
      split_counters.zero();
      g.split_partials = split_partials.get();
      g.split_counters = split_counters.get();

      // Outputs, poisoned.
      const int out_cols = s.epilogue == GemmEpilogue::rope_qkv ? s.heads * s.head_dim : layout.n_out;
      DeviceArray<uint16_t> out(size_t(kMaxRows) * out_cols);
      out.poison();
      DeviceArray<float> residual_out(size_t(kMaxRows) * layout.n_out);
      const std::vector<float> residual_before = random_floats(rng, size_t(kMaxRows) * layout.n_out, -1.f, 1.f);
      residual_out.upload(residual_before);
      DeviceArray<float> ssq_out(size_t(tiles) * kMaxRows);
      ssq_out.poison();
      DeviceArray<float> logits(size_t(kMaxRows) * layout.n_out);
      logits.poison();
      DeviceArray<ArgmaxPartial> partials(size_t(tiles) * kMaxRows);
      partials.poison();
      const size_t slot_stride = size_t(std::max(1, s.kv_heads)) * max_context * std::max(1, s.head_dim);
      DeviceArray<uint16_t> k_cache((s.two_sequences ? 2 : 1) * slot_stride);
      DeviceArray<uint16_t> v_cache(k_cache.size());
      k_cache.poison();
      v_cache.poison();
      std::unique_ptr<DeviceArray<float>> rope_table;
      if (s.epilogue == GemmEpilogue::rope_qkv) {
        rope_table = std::make_unique<DeviceArray<float>>(size_t(max_context) * s.head_dim);
        fill_rope_table(reinterpret_cast<float2*>(rope_table->get()), max_context, s.head_dim, 1e6, g_stream);
        g.rope_table = reinterpret_cast<const float2*>(rope_table->get());
        g.head_dim = s.head_dim;
        g.num_heads = s.heads;
        g.num_kv_heads = s.kv_heads;
        g.max_context = max_context;
        g.q_out = as_bf16(out);
        g.k_cache = as_bf16(k_cache);
        g.v_cache = as_bf16(v_cache);
        g.kv_slot_stride = slot_stride;
      } else if (s.epilogue == GemmEpilogue::residual_add) {
        g.residual_out = residual_out.get();
        g.ssq_out = ssq_out.get();
      } else if (s.epilogue == GemmEpilogue::logits) {
        g.logits = logits.get();
        g.argmax_out = partials.get();
      } else {
        g.out = as_bf16(out);
      }
      g.out_stride = out_cols;

      // The row adapter, fused: t = A x for the rows its rule names from the adapter tiles, B t in the epilogue.
      std::unique_ptr<DeviceArray<unsigned long long>> adapter_t;
      if (R > 0) {
        // NaN values tagged with the previous forward's serial everywhere: a weight tile that took a t value no
        // adapter tile of this launch wrote shows it in its rows.
        adapter_t = std::make_unique<DeviceArray<unsigned long long>>(size_t(kMaxRows) * total_rank);
        adapter_t->upload(std::vector<unsigned long long>(adapter_t->size(), tag_t(NAN, state.serial - 1)));
        g.adapter_tiles = adapter_tile_count(total_rank);
        g.adapter_b = as_bf16(*adapter_b_device);
        g.adapter_offset = adapter_offset_device->get();
        g.adapter_rank = R;
        g.adapter_total_rank = total_rank;
        g.adapter_t = adapter_t->get();
        g.adapter_mask_token = s.adapter_window ? -1 : mask_token;
      }
      gemm(g, normalised ? GemmInput::rmsnorm_residual : GemmInput::bf16_rows, s.epilogue, max_rows, tuning, g_stream, true);
      DeviceArray<TokenChoice> choices(kMaxRows);
      choices.poison();
      if (s.epilogue == GemmEpilogue::logits) {
        reveal_argmax(RevealParams{partials.get(), tiles, state_device.get(), choices.get()}, max_rows, g_stream, true);
      }
      A2D_CUDA_CHECK(cudaStreamSynchronize(g_stream));

      // The reference: y = x W^T (+ bias) for the rows the epilogue sees (the logits' mapped rows), then the adapter.
      const int y_rows = s.epilogue == GemmEpilogue::logits ? static_cast<int>(logit_rows.size()) : rows;
      std::vector<float> x_rows(size_t(y_rows) * s.k);
      for (int t = 0; t < y_rows; ++t) {
        const int from = s.epilogue == GemmEpilogue::logits ? logit_rows[t] : t;
        std::copy_n(x_gemm.begin() + size_t(from) * s.k, s.k, x_rows.begin() + size_t(t) * s.k);
      }
      std::vector<float> y(size_t(y_rows) * logical_rows);
      a2d::cpu::matmul(pool, x_rows.data(), y_rows, wt, nullptr, y.data());
      for (int t = 0; t < y_rows; ++t) {
        for (int64_t n = 0; n < logical_rows; ++n) {
          float& v = y[size_t(t) * logical_rows + n];
          if (scale_after) v *= scales[t];
          if (s.bias) v += bias.values[n];
        }
      }
      if (R > 0) {
        // The adapter tiles multiply the input as the weight tiles do: with the row scale after the K loop.
        std::vector<float> x_adapter(x_gemm);
        if (scale_after) {
          for (int t = 0; t < rows; ++t) {
            for (int c = 0; c < s.k; ++c) x_adapter[size_t(t) * s.k + c] *= scales[t];
          }
        }
        std::vector<int64_t> adapted;  // the rows the rule names: every window row, or those holding the mask token
        for (int t = 0; t < rows; ++t) {
          if (window[t] && (s.adapter_window || state.tokens[t] == mask_token)) adapted.push_back(t);
        }
        for (size_t j = 0; j < targets.size(); ++j) {
          LowRank lr;
          lr.a.dtype = lr.b.dtype = DType::bf16;
          lr.a.shape = {R, s.k};
          lr.a.data = adapter_a.bits.data() + size_t(j) * R * s.k;
          lr.b.shape = {targets[j].second, R};
          lr.b.data = adapter_b.bits.data() + size_t(targets[j].first) * R;
          a2d::cpu::low_rank_add(pool, x_adapter.data(), s.k, adapted, lr, y.data() + targets[j].first, logical_rows);
        }
      }

      if (s.epilogue == GemmEpilogue::store_bf16 || s.epilogue == GemmEpilogue::silu_mul) {
        const std::vector<float> want = s.epilogue == GemmEpilogue::silu_mul ? silu_mul_reference(y, rows, s.n) : y;
        const std::vector<uint16_t> got = out.download();
        check.add(bf16_to_double(std::vector<uint16_t>(got.begin(), got.begin() + size_t(rows) * out_cols)), to_double(want),
                  kBf16Out);
        check.require(untouched(got, size_t(rows) * out_cols, got.size()), "rows past the forward's count were written");
      } else if (s.epilogue == GemmEpilogue::residual_add) {
        const std::vector<float> got = residual_out.download();
        std::vector<double> want(size_t(rows) * s.n), got_rows(size_t(rows) * s.n);
        for (size_t i = 0; i < want.size(); ++i) {
          want[i] = double(residual_before[i]) + y[i];
          got_rows[i] = got[i];
        }
        check.add(got_rows, want, kFp32Gemm);
        check.require(std::equal(got.begin() + want.size(), got.end(), residual_before.begin() + want.size()),
                      "residual rows past the forward's count changed");
        // ssq_out[tile][t]: the tile's 16 rows of the new residual, squared and summed.
        const std::vector<float> ssq_got = ssq_out.download();
        std::vector<double> sg, sw;
        for (int tile = 0; tile < tiles; ++tile) {
          for (int t = 0; t < rows; ++t) {
            double sum = 0;
            for (int r = tile * 16; r < std::min(s.n, tile * 16 + 16); ++r) sum += want[size_t(t) * s.n + r] * want[size_t(t) * s.n + r];
            sg.push_back(ssq_got[size_t(tile) * kMaxRows + t]);
            sw.push_back(sum);
          }
        }
        check.add(sg, sw, kSumOfSquares);
      } else if (s.epilogue == GemmEpilogue::rope_qkv) {
        // RoPE (the CPU op) on the q and k heads at positions cached + t, then q for attention and k, v in the cache.
        std::vector<int64_t> positions(rows);
        std::vector<int> slots(rows, 0);
        for (int t = 0; t < rows; ++t) {
          positions[t] = cached + t;
          if (s.two_sequences) {
            const int e = state.row_entry[t];
            positions[t] = state.entry_cached[e] + t - state.entry_row0[e];
            slots[t] = state.entry_slot[e];
          }
        }
        check_rope_qkv(check, y, rows, logical_rows, positions, slots, slot_stride, s.heads, s.kv_heads, s.head_dim,
                       max_context, out, k_cache, v_cache);
      } else {
        // logits[t][n] for the mapped rows, then reveal_argmax over the GEMM's partials: the token must be one
        // whose reference logit is the top one (within the logits' tolerance), never the mask token, and its
        // confidence softmax(top) over every token but the mask one.
        const std::vector<float> got = logits.download();
        const size_t count = argmax_only(rows) ? 0 : size_t(y_rows) * s.n;
        if (count > 0) check.add(to_double(std::vector<float>(got.begin(), got.begin() + count)), to_double(y), kFp32Gemm);
        check.require(untouched(got, count, got.size()), count > 0 ? "logit rows past logit_count were written"
                                                                   : "logits written with write_logits 0");
        const std::vector<TokenChoice> chosen = choices.download();
        double squares = 0;
        for (float v : y) squares += double(v) * v;
        const double rms = std::sqrt(squares / y.size());
        std::vector<double> top_got, top_want, conf_got, conf_want;
        for (int t = 0; t < y_rows; ++t) {
          const float* row = y.data() + size_t(t) * s.n;
          int best = -1;
          for (int v = 0; v < s.n; ++v) {
            if (v != mask_token && (best < 0 || row[v] > row[best])) best = v;
          }
          double sum = 0;
          for (int v = 0; v < s.n; ++v) sum += v == mask_token ? 0.0 : std::exp(double(row[v]) - row[best]);
          const int token = chosen[t].token;
          check.require(token >= 0 && token < s.n && token != mask_token,
                        "row " + std::to_string(t) + " chose token " + std::to_string(token));
          top_got.push_back(token >= 0 && token < s.n ? row[token] / rms : NAN);
          top_want.push_back(row[best] / rms);
          conf_got.push_back(chosen[t].confidence);
          conf_want.push_back(1.0 / sum);
        }
        check.add(top_got, top_want, Tolerance{0, 0, 2e-3});
        check.add(conf_got, conf_want, Tolerance{5e-3, 0, 1e-6});
      }
    });
  }
}

void decode_gemm_cases(Table& table, ThreadPool& pool) {
  // The 2B forward's five GEMMs (MiniCPM5-2B: hidden 2048, 16 q / 2 KV heads of 128, intermediate 6144, vocab
  // 130560) at the row buckets the engine captures, and odd shapes: partial tiles, K not a multiple of a chunk,
  // few heads, a wide GEMM whose last block holds one tile.
  const std::vector<int> all_rows = {1, 3, 8, 13, 16, 29, 33, 64};
  const std::vector<GemmShape> shapes = {
      {"2B qkv n2560 k2048", GemmEpilogue::rope_qkv, 2048, 0, 16, 2, 128},
      {"2B o n2048 k2048", GemmEpilogue::residual_add, 2048, 2048},
      {"2B gate_up i6144 k2048", GemmEpilogue::silu_mul, 2048, 6144},
      {"2B down n2048 k6144", GemmEpilogue::residual_add, 6144, 2048},
      {"2B lm_head v130560 k2048", GemmEpilogue::logits, 2048, 130560},
      {"qkv+bias n2560 k2048", GemmEpilogue::store_bf16, 2048, 2560, 0, 0, 0, true},
      {"odd n200 k456", GemmEpilogue::store_bf16, 456, 200, 0, 0, 0, true},
      {"odd i100 k264", GemmEpilogue::silu_mul, 264, 100},
      {"odd n72 k1000", GemmEpilogue::residual_add, 1000, 72},
      {"odd v1001 k520", GemmEpilogue::logits, 520, 1001},
      {"odd h3/1 d64 k200", GemmEpilogue::rope_qkv, 200, 0, 3, 1, 64},
      {"odd wide i4228 k2048", GemmEpilogue::silu_mul, 2048, 4228},
      {"odd wide v8461 k1032", GemmEpilogue::logits, 1032, 8461},
  };
  uint64_t seed = 1000;
  for (const GemmShape& s : shapes) {
    gemm_cases(table, pool, s, false, all_rows, ++seed);
    // FP8 weights on every shape, at a row count of each kernel.
    gemm_cases(table, pool, s, true, {1, 13, 33}, ++seed);
  }
  // Row adapters fused into the qkv, o, gate/up and down GEMMs (rank 64 on the 2B shape and the bundled model's,
  // rank 24 and 4 on odd ones: the 16-byte and the scalar B loops), under the mask and the window rules; the
  // wide kernel at 40 rows, split K where the plan splits.
  gemm_cases(table, pool, {"2B qkv+adapter r64", GemmEpilogue::rope_qkv, 2048, 0, 16, 2, 128, false, 64}, false, {4, 13}, 2001);
  gemm_cases(table, pool, {"2B o+adapter r64", GemmEpilogue::residual_add, 2048, 2048, 0, 0, 0, false, 64}, false, {5, 16}, 2002);
  gemm_cases(table, pool, {"2B gate_up+adapter r64", GemmEpilogue::silu_mul, 2048, 6144, 0, 0, 0, false, 64}, false, {6, 40}, 2003);
  gemm_cases(table, pool, {"odd n200 k456+adapter r24", GemmEpilogue::store_bf16, 456, 200, 0, 0, 0, true, 24}, false, {3, 9, 36}, 2004);
  gemm_cases(table, pool, {"2B qkv+window-adapter r64", GemmEpilogue::rope_qkv, 2048, 0, 16, 2, 128, false, 64, true}, false, {5, 9, 32, 64}, 2005);
  gemm_cases(table, pool, {"2B down+window-adapter r64", GemmEpilogue::residual_add, 6144, 2048, 0, 0, 0, false, 64, true}, false, {7, 33}, 2006);
  gemm_cases(table, pool, {"2B gate_up+window-adapter r64", GemmEpilogue::silu_mul, 2048, 6144, 0, 0, 0, false, 64, true}, false, {9, 40}, 2007);
  gemm_cases(table, pool, {"135M qkv+window-adapter r64", GemmEpilogue::rope_qkv, 576, 0, 9, 3, 64, false, 64, true}, false, {5, 12}, 2008);
  gemm_cases(table, pool, {"odd n200 k456+window-adapter r4", GemmEpilogue::store_bf16, 456, 200, 0, 0, 0, true, 4, true}, false, {3, 9}, 2009);
  // Two sequences in one forward: each one's window rows take the adapter, its commit rows do not.
  gemm_cases(table, pool, {"2B o+mask-adapter r64", GemmEpilogue::residual_add, 2048, 2048, 0, 0, 0, false, 64, false, true}, false,
             {6, 24}, 2010);
  gemm_cases(table, pool, {"2B gate_up+window-adapter r64", GemmEpilogue::silu_mul, 2048, 6144, 0, 0, 0, false, 64, true, true}, false,
             {10, 40}, 2011);
  // The fused RoPE epilogue of two sequences: each row at its own sequence's position, K and V into its slot.
  gemm_cases(table, pool, {"2B qkv+window-adapter r64", GemmEpilogue::rope_qkv, 2048, 0, 16, 2, 128, false, 64, true, true}, false,
             {10, 40}, 2012);
  gemm_cases(table, pool, {"odd h3/1 d64 k200", GemmEpilogue::rope_qkv, 200, 0, 3, 1, 64, false, 0, false, true}, false, {6, 33}, 2013);
}

// ------------------------------------------------------------------------------------------- prefill GEMM

struct PrefillGemmCase {
  std::string name;
  PrefillEpilogue epilogue;
  int k;
  int n = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  bool bias = false;
  // rope_qkv of a forward's rows (PrefillGemmParams::state): two sequences on slots 1 and 0 at their own positions,
  // and the GEMM run over 5 rows more than the forward's (a graph's row bucket), which must write nothing.
  bool two_sequences = false;
};

const char* prefill_epilogue_name(PrefillEpilogue e) {
  switch (e) {
    case PrefillEpilogue::store_bf16: return "store_bf16";
    case PrefillEpilogue::silu_mul: return "silu_mul";
    case PrefillEpilogue::residual_add: return "residual_add";
    case PrefillEpilogue::rope_qkv: return "rope_qkv";
  }
  return "?";
}

void prefill_gemm_cases(Table& table, ThreadPool& pool, const PrefillGemmCase& s, const std::vector<int>& row_counts,
                        uint64_t seed) {
  const std::string op = std::string("gemm_prefill ") + prefill_epilogue_name(s.epilogue);
  const std::string variant = std::string("bf16") + (s.bias ? " +bias" : "") + (s.two_sequences ? " two-sequences" : "");
  bool any = false;
  for (int rows : row_counts) any = any || table.wanted(op, variant, s.name + " rows" + std::to_string(rows));
  if (!any) return;
  const GemmLayout layout = s.epilogue == PrefillEpilogue::rope_qkv  ? rope_qkv_layout(s.heads, s.kv_heads, s.head_dim)
                            : s.epilogue == PrefillEpilogue::silu_mul ? silu_layout(s.n)
                                                                      : plain_layout(s.n);
  const int64_t logical_rows = s.epilogue == PrefillEpilogue::silu_mul ? 2 * int64_t(s.n) : layout.n_rows;
  Rng rng{seed};
  const HostWeight w = random_weight(rng, logical_rows, s.k, false);
  const DeviceWeight dw = place_weight(w, layout);
  const Tensor wt = w.tensor();
  const Bf16Values bias = random_bf16(rng, s.bias ? logical_rows : 0, -0.5f, 0.5f);
  std::unique_ptr<DeviceArray<uint16_t>> bias_device;
  if (s.bias) bias_device = place_rows(bias.bits, 1, layout);

  for (int rows : row_counts) {
    table.run(op, variant, s.name + " rows" + std::to_string(rows), [&](Check& check) {
      const int cached = 11;
      const int max_context = cached + rows + 12;
      // Two sequences: rows [0, split) on slot 1 at cached + t, the rest on slot 0 at cached + 7 + (t - split).
      const int split = rows / 2, padded = s.two_sequences ? rows + 5 : rows;
      StepState state{};
      std::vector<int64_t> positions(rows);
      std::vector<int> slots(rows, 0);
      for (int t = 0; t < rows; ++t) positions[t] = cached + t;
      if (s.two_sequences) {
        state.rows = rows;
        state.entries = 2;
        for (int e = 0; e < 2; ++e) {
          const EntryView view{1 - e, cached + 7 * e, 0, e == 0 ? 0 : split, e == 0 ? split : rows - split};
          add_entry(state, e, view, std::max(1, s.heads / std::max(1, s.kv_heads)));
          for (int t = view.row0; t < view.row0 + view.rows; ++t) {
            positions[t] = view.cached + t - view.row0;
            slots[t] = view.slot;
          }
        }
      }
      DeviceArray<StepState> state_device(std::vector<StepState>{state});
      const Bf16Values x = random_bf16(rng, size_t(padded) * s.k, -1.f, 1.f);
      DeviceArray<uint16_t> x_device(x.bits);
      PrefillGemmParams p{};
      p.weight = as_bf16(*dw.tiled);
      p.n_rows = layout.n_rows;
      p.n_out = layout.n_out;
      p.k = s.k;
      p.bias = s.bias ? as_bf16(*bias_device) : nullptr;
      p.x = as_bf16(x_device);
      p.x_stride = s.k;
      p.rows = padded;
      const int out_cols = s.epilogue == PrefillEpilogue::rope_qkv ? s.heads * s.head_dim : layout.n_out;
      DeviceArray<uint16_t> out(size_t(padded) * out_cols);
      DeviceArray<float> residual(size_t(rows) * layout.n_out);
      const std::vector<float> residual_before = random_floats(rng, residual.size(), -1.f, 1.f);
      const size_t slot_stride = size_t(std::max(1, s.kv_heads)) * max_context * std::max(1, s.head_dim);
      DeviceArray<uint16_t> k_cache((s.two_sequences ? 2 : 1) * slot_stride);
      DeviceArray<uint16_t> v_cache(k_cache.size());
      std::unique_ptr<DeviceArray<float>> rope_table;
      p.out_stride = out_cols;
      if (s.epilogue == PrefillEpilogue::rope_qkv) {
        rope_table = std::make_unique<DeviceArray<float>>(size_t(max_context) * s.head_dim);
        fill_rope_table(reinterpret_cast<float2*>(rope_table->get()), max_context, s.head_dim, 1e6, g_stream);
        p.rope_table = reinterpret_cast<const float2*>(rope_table->get());
        p.head_dim = s.head_dim;
        p.num_heads = s.heads;
        p.num_kv_heads = s.kv_heads;
        p.max_context = max_context;
        p.cached = cached;
        p.q_out = as_bf16(out);
        p.k_cache = as_bf16(k_cache);
        p.v_cache = as_bf16(v_cache);
        if (s.two_sequences) {
          p.state = state_device.get();
          p.kv_slot_stride = slot_stride;
        }
      } else if (s.epilogue == PrefillEpilogue::residual_add) {
        p.residual = residual.get();
      } else {
        p.out = as_bf16(out);
      }
      std::vector<float> y(size_t(rows) * logical_rows);
      a2d::cpu::matmuls(pool, x.values.data(), rows, {a2d::cpu::Projection{&wt, s.bias ? bias.values.data() : nullptr, y.data()}});

      // Every block shape the mma.sync kernel is built at (kPrefillShapes), then the warpgroup kernel at each of
      // kWgmmaTokens, each from fresh outputs; then, where K has two 64-k steps or more, the warpgroup kernel at
      // 64-token blocks with K split in up to four: the tile's last split summing the partials, and the splits as
      // one cluster (PrefillGemmParams::cluster_splits); then stream-K over 5 blocks (PrefillGemmParams::
      // stream_blocks), so that blocks end one output block and start another, where there are 10 steps or more.
      const int plain_kernels = static_cast<int>(std::size(kPrefillShapes) + std::size(kWgmmaTokens));
      const int steps = (s.k + 63) / 64;
      const int per_split = (steps + std::min(4, steps) - 1) / std::min(4, steps);
      const int splits = (steps + per_split - 1) / per_split;
      const int output_blocks = ((padded + 63) / 64) * (((layout.n_rows + 15) / 16 + 7) / 8);
      constexpr int kStreamBlocks = 5;
      const bool stream = output_blocks * steps >= 2 * kStreamBlocks;
      std::unique_ptr<DeviceArray<float>> partial;
      std::unique_ptr<DeviceArray<int>> counters;
      if (splits >= 2 || stream) {
        // A split's partial of one output block: 32 floats (64 tokens x 128 rows / 256 threads) a consumer thread;
        // stream-K's, two a block.
        partial = std::make_unique<DeviceArray<float>>(std::max(size_t(splits) * output_blocks, size_t(2) * kStreamBlocks) * 256 * 32);
        counters = std::make_unique<DeviceArray<int>>(std::vector<int>(output_blocks, 0));
      }
      const int split_kernels = splits >= 2 ? 2 : 0;
      const int kernels = plain_kernels + split_kernels + (stream ? 1 : 0);
      for (int kernel = 0; kernel < kernels; ++kernel) {
        out.poison();
        k_cache.poison();
        v_cache.poison();
        residual.upload(residual_before);
        if (kernel < static_cast<int>(std::size(kPrefillShapes))) {
          gemm_prefill(p, s.epilogue, g_stream, kPrefillShapes[kernel]);
        } else if (kernel < plain_kernels) {
          gemm_prefill_wgmma(p, s.epilogue, g_stream, kWgmmaTokens[kernel - std::size(kPrefillShapes)]);
        } else if (kernel == plain_kernels + split_kernels) {
          PrefillGemmParams stream_params = p;
          stream_params.stream_blocks = kStreamBlocks;
          stream_params.partial = partial->get();
          stream_params.counters = counters->get();
          gemm_prefill_wgmma(stream_params, s.epilogue, g_stream, 64);
        } else {
          PrefillGemmParams split_params = p;
          split_params.steps_per_split = per_split;
          split_params.partial = partial->get();
          split_params.counters = counters->get();
          split_params.cluster_splits = kernel == plain_kernels + 1 ? splits : 0;
          gemm_prefill_wgmma(split_params, s.epilogue, g_stream, 64);
        }
        A2D_CUDA_CHECK(cudaStreamSynchronize(g_stream));
        if (counters) {
          const std::vector<int> left = counters->download();
          check.require(std::all_of(left.begin(), left.end(), [](int c) { return c == 0; }),
                        "the split or stream-K counters were not left zero (kernel " + std::to_string(kernel) + ")");
        }
        if (s.epilogue == PrefillEpilogue::store_bf16 || s.epilogue == PrefillEpilogue::silu_mul) {
          const std::vector<float> want = s.epilogue == PrefillEpilogue::silu_mul ? silu_mul_reference(y, rows, s.n) : y;
          check.add(bf16_to_double(out.download()), to_double(want), kBf16Out);
        } else if (s.epilogue == PrefillEpilogue::residual_add) {
          const std::vector<float> got = residual.download();
          std::vector<double> want(got.size());
          for (size_t i = 0; i < want.size(); ++i) want[i] = double(residual_before[i]) + y[i];
          check.add(to_double(got), want, kFp32Gemm);
        } else {
          check_rope_qkv(check, y, rows, logical_rows, positions, slots, slot_stride, s.heads, s.kv_heads, s.head_dim,
                         max_context, out, k_cache, v_cache);
          if (s.two_sequences) {
            // The padded rows past the forward's: no q row, and no cache row past each sequence's last position.
            const std::vector<uint16_t> q_got = out.download(), k_got = k_cache.download(), v_got = v_cache.download();
            check.require(untouched(q_got, size_t(rows) * out_cols, q_got.size()), "q rows past the forward's were written");
            for (int e = 0; e < 2; ++e) {
              const int slot = state.entry_slot[e], end = state.entry_cached[e] + state.entry_rows[e];
              for (int h = 0; h < s.kv_heads; ++h) {
                const size_t first = slot * slot_stride + (size_t(h) * max_context + end) * s.head_dim;
                const size_t last = slot * slot_stride + size_t(h + 1) * max_context * s.head_dim;
                check.require(untouched(k_got, first, last) && untouched(v_got, first, last),
                              "cache rows past a sequence's last position were written (slot " + std::to_string(slot) + ")");
              }
            }
          }
        }
      }
    });
  }
}

void all_prefill_gemm_cases(Table& table, ThreadPool& pool) {
  // Rows: one, a partial 128-row block, several blocks with a partial last one, the 2048-row chunk; each at every
  // block shape (32, 64 and 128 token rows) and on the warpgroup kernel (64, 128 and 256).
  prefill_gemm_cases(table, pool, {"2B qkv n2560 k2048", PrefillEpilogue::rope_qkv, 2048, 0, 16, 2, 128}, {1, 130, 2048}, 3001);
  prefill_gemm_cases(table, pool, {"qkv+bias n2560 k2048", PrefillEpilogue::store_bf16, 2048, 2560, 0, 0, 0, true}, {77, 517}, 3002);
  prefill_gemm_cases(table, pool, {"2B o n2048 k2048", PrefillEpilogue::residual_add, 2048, 2048}, {1, 300}, 3003);
  prefill_gemm_cases(table, pool, {"2B gate_up i6144 k2048", PrefillEpilogue::silu_mul, 2048, 6144}, {5, 2048}, 3004);
  prefill_gemm_cases(table, pool, {"2B down n2048 k6144", PrefillEpilogue::residual_add, 6144, 2048}, {517}, 3005);
  prefill_gemm_cases(table, pool, {"odd n200 k456", PrefillEpilogue::store_bf16, 456, 200, 0, 0, 0, true}, {1, 129}, 3006);
  prefill_gemm_cases(table, pool, {"odd i100 k264", PrefillEpilogue::silu_mul, 264, 100}, {77}, 3007);
  prefill_gemm_cases(table, pool, {"odd n72 k1000", PrefillEpilogue::residual_add, 1000, 72}, {5, 260}, 3008);
  prefill_gemm_cases(table, pool, {"odd h3/1 d64 k200", PrefillEpilogue::rope_qkv, 200, 0, 3, 1, 64}, {129}, 3009);
  // A batched decode forward's rows through the prefill GEMMs: two sequences, each at its own position and slot.
  prefill_gemm_cases(table, pool, {"2B qkv n2560 k2048", PrefillEpilogue::rope_qkv, 2048, 0, 16, 2, 128, false, true},
                     {40, 59}, 3010);
  // (A forward holds at most kMaxRows rows: the StepState's per-row arrays.)
  prefill_gemm_cases(table, pool, {"odd h3/1 d64 k200", PrefillEpilogue::rope_qkv, 200, 0, 3, 1, 64, false, true}, {61}, 3011);
}

// ------------------------------------------------------------------------------------------- attention

struct AttentionShape {
  int heads, kv_heads, head_dim;
  int padded() const { return head_dim <= 32 ? 32 : (head_dim <= 64 ? 64 : 128); }
  std::string name() const {
    return "h" + std::to_string(heads) + "/" + std::to_string(kv_heads) + " d" + std::to_string(head_dim) +
           (padded() != head_dim ? "p" + std::to_string(padded()) : "");
  }
};

// Random q [rows][heads][head_dim] and cache keys/values [positions][kv_heads][head_dim] (the CPU op's layout), and
// their padded device layouts: q [rows][heads][padded], caches [kv_heads][max_context][padded], zeros past
// head_dim, NaN in the cache slots past `positions` (a kernel reading them would fail).
struct AttentionInputs {
  std::vector<float> q, k, v;
  std::unique_ptr<DeviceArray<uint16_t>> q_device, k_device, v_device;
};
AttentionInputs attention_inputs(Rng& rng, const AttentionShape& s, int rows, int positions, int max_context) {
  const int H = s.heads, KV = s.kv_heads, D = s.head_dim, P = s.padded();
  AttentionInputs in;
  const Bf16Values q = random_bf16(rng, size_t(rows) * H * D, -1.f, 1.f);
  const Bf16Values k = random_bf16(rng, size_t(positions) * KV * D, -1.f, 1.f);
  const Bf16Values v = random_bf16(rng, size_t(positions) * KV * D, -1.f, 1.f);
  in.q = q.values;
  in.k = k.values;
  in.v = v.values;
  std::vector<uint16_t> q_padded(size_t(rows) * H * P, 0);
  for (int t = 0; t < rows; ++t) {
    for (int h = 0; h < H; ++h) std::copy_n(&q.bits[(size_t(t) * H + h) * D], D, &q_padded[(size_t(t) * H + h) * P]);
  }
  std::vector<uint16_t> k_padded(size_t(KV) * max_context * P, 0xffff), v_padded(k_padded.size(), 0xffff);
  for (int h = 0; h < KV; ++h) {
    for (int p = 0; p < positions; ++p) {
      uint16_t* kd = &k_padded[(size_t(h) * max_context + p) * P];
      uint16_t* vd = &v_padded[(size_t(h) * max_context + p) * P];
      std::fill(kd, kd + P, 0);
      std::fill(vd, vd + P, 0);
      std::copy_n(&k.bits[(size_t(p) * KV + h) * D], D, kd);
      std::copy_n(&v.bits[(size_t(p) * KV + h) * D], D, vd);
    }
  }
  in.q_device = std::make_unique<DeviceArray<uint16_t>>(q_padded);
  in.k_device = std::make_unique<DeviceArray<uint16_t>>(k_padded);
  in.v_device = std::make_unique<DeviceArray<uint16_t>>(v_padded);
  return in;
}

// One decode attention launch (attention + attention_combine) as the op table's cases run it: every buffer it
// writes poisoned first, the output read back whole (rows past the forward's included, to check they stay untouched).
struct DecodeAttentionLaunch {
  const AttentionShape& shape;
  int max_rows, max_entries, max_context;
  size_t kv_slot_stride;  // 0: one sequence
  AdapterRule rule;
  int mask_token;
  bool split_keys;
  bool prefetch = false;  // AttentionParams::prefetch_cached
};
std::vector<uint16_t> run_decode_attention(const DecodeAttentionLaunch& l, const StepState& state, DeviceArray<uint16_t>& q,
                                           DeviceArray<uint16_t>& k, DeviceArray<uint16_t>& v) {
  const int H = l.shape.heads, KV = l.shape.kv_heads, D = l.shape.head_dim, P = l.shape.padded();
  DeviceArray<StepState> state_device(std::vector<StepState>{state});
  AttentionParams p{};
  p.q = as_bf16(q);
  p.k_cache = as_bf16(k);
  p.v_cache = as_bf16(v);
  p.max_context = l.max_context;
  p.kv_slot_stride = l.kv_slot_stride;
  p.num_heads = H;
  p.num_kv_heads = KV;
  p.head_dim = D;
  p.head_dim_padded = P;
  p.scale = 1.f / std::sqrt(static_cast<float>(D));
  p.state = state_device.get();
  p.max_splits = attention_max_splits(l.max_rows, l.max_entries, H, KV, g_sm_count);
  p.prefetch_cached = l.prefetch;
  p.row_capacity = l.max_rows * (H / KV);
  DeviceArray<float> partial_o(size_t(p.max_splits) * KV * p.row_capacity * P);
  DeviceArray<float2> partial_ml(size_t(p.max_splits) * KV * p.row_capacity);
  partial_o.poison();
  partial_ml.poison();
  DeviceArray<uint16_t> out(size_t(l.max_rows) * H * D);
  out.poison();
  p.partial_o = partial_o.get();
  p.partial_ml = partial_ml.get();
  p.out = as_bf16(out);
  p.early_trigger = AttentionTrigger::short_kv;
  p.split_keys = l.split_keys;
  p.revealed_rule_mask_token = l.rule != AdapterRule::none ? l.mask_token : -1;
  p.revealed_rule_causal = l.rule == AdapterRule::mask;
  attention(p, l.max_rows, l.max_entries, g_stream, true);
  attention_combine(p, l.max_rows, g_stream, true);
  return out.download();
}

// Decode attention (attention + attention_combine) over a cache of `cached` positions and the forward's own rows:
// commit rows causal, window rows see the whole forward; under a row adapter's rule a window row that is not the
// mask token skips the window positions holding it, attending causally under the mask adapter's.
void decode_attention_case(Table& table, ThreadPool& pool, const AttentionShape& s, int cached, int rows, int commit,
                           AdapterRule rule, bool split_keys, uint64_t seed, bool prefetch = false) {
  const std::string variant = std::string(rule == AdapterRule::none ? "block-causal" : rule == AdapterRule::mask ? "mask-rule" : "window-rule") +
                              (split_keys ? "" : " no-split-keys") + (prefetch ? " prefetch" : "");
  table.run("attention", variant, s.name() + " " + dims({{"n", cached}, {"rows", rows}, {"commit", commit}}), [&](Check& check) {
    const int H = s.heads, KV = s.kv_heads, D = s.head_dim;
    const int max_rows = bucket_rows(rows);
    const int positions = cached + rows, max_context = positions + 70;
    const int mask_token = 5;
    Rng rng{seed};
    AttentionInputs in = attention_inputs(rng, s, rows, positions, max_context);
    StepState state = make_state(cached, commit, rows);
    std::vector<uint8_t> revealed;
    for (int t = 0; t < rows; ++t) {
      state.tokens[t] = t >= commit && rng.below(2) == 0 ? mask_token : 100 + t;
      if (t >= commit) revealed.push_back(state.tokens[t] != mask_token);
    }
    const DecodeAttentionLaunch launch{s, max_rows, 1, max_context, 0, rule, mask_token, split_keys, prefetch};
    const std::vector<uint16_t> got = run_decode_attention(launch, state, *in.q_device, *in.k_device, *in.v_device);

    std::vector<float> want(size_t(rows) * H * D);
    a2d::cpu::attention(pool, in.q.data(), in.k.data(), in.v.data(), cached, commit, rows, H, KV, D, want.data(),
                        rule != AdapterRule::none ? &revealed : nullptr, rule);
    check.add(bf16_to_double(std::vector<uint16_t>(got.begin(), got.begin() + want.size())), to_double(want), kAttention);
    check.require(untouched(got, want.size(), got.size()), "rows past the forward's count were written");
  });
}

// Decode attention over several sequences in one forward (continuous batching, step_state.cuh): sequence i's rows
// follow sequence i-1's, each with its own cached length, commit rows and KV cache slot (not in slot order, one slot
// left out); every sequence's output must equal the CPU op run on it alone. `max_entries` is the launch's capacity
// (the graph's sequence count), at least the sequences given.
struct BatchEntry {
  int slot, cached, rows, commit;
};
void decode_attention_batch_case(Table& table, ThreadPool& pool, const AttentionShape& s, const std::vector<BatchEntry>& entries,
                                 int max_entries, AdapterRule rule, uint64_t seed, bool prefetch = false) {
  std::string shape = s.name();
  int rows = 0, slots = 0, longest = 0;
  for (const BatchEntry& e : entries) {
    shape += " [s" + std::to_string(e.slot) + " n" + std::to_string(e.cached) + " r" + std::to_string(e.rows) + " c" +
             std::to_string(e.commit) + "]";
    rows += e.rows;
    slots = std::max(slots, e.slot + 1);
    longest = std::max(longest, e.cached + e.rows);
  }
  const std::string variant = std::string(rule == AdapterRule::none ? "batch block-causal" : rule == AdapterRule::mask ? "batch mask-rule" : "batch window-rule") +
                              " e" + std::to_string(max_entries) + (prefetch ? " prefetch" : "");
  table.run("attention", variant, shape, [&](Check& check) {
    const int H = s.heads, KV = s.kv_heads, D = s.head_dim, P = s.padded();
    const int max_rows = bucket_rows(rows), group = H / KV, max_context = longest + 40;
    const int mask_token = 5;
    const size_t slot_stride = size_t(KV) * max_context * P;
    Rng rng{seed};
    StepState state = make_state(0, 0, rows);
    state.entries = static_cast<int>(entries.size());
    std::vector<uint16_t> q_all, k_all(slot_stride * slots, 0xffff), v_all(k_all.size(), 0xffff);
    std::vector<AttentionInputs> inputs;
    std::vector<std::vector<uint8_t>> revealed(entries.size());
    int row0 = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      const BatchEntry& e = entries[i];
      inputs.push_back(attention_inputs(rng, s, e.rows, e.cached + e.rows, max_context));
      const std::vector<uint16_t> q = inputs.back().q_device->download(), k = inputs.back().k_device->download(),
                                  v = inputs.back().v_device->download();
      q_all.insert(q_all.end(), q.begin(), q.end());
      std::copy(k.begin(), k.end(), k_all.begin() + slot_stride * e.slot);
      std::copy(v.begin(), v.end(), v_all.begin() + slot_stride * e.slot);
      add_entry(state, static_cast<int>(i), EntryView{e.slot, e.cached, e.commit, row0, e.rows}, group);
      for (int t = 0; t < e.rows; ++t) {
        state.tokens[row0 + t] = t >= e.commit && rng.below(2) == 0 ? mask_token : 100 + t;
        if (t >= e.commit) revealed[i].push_back(state.tokens[row0 + t] != mask_token);
      }
      row0 += e.rows;
    }
    DeviceArray<uint16_t> q_device(q_all), k_device(k_all), v_device(v_all);
    const DecodeAttentionLaunch launch{s, max_rows, max_entries, max_context, slot_stride, rule, mask_token, true, prefetch};
    const std::vector<uint16_t> got = run_decode_attention(launch, state, q_device, k_device, v_device);

    std::vector<float> want;
    for (size_t i = 0; i < entries.size(); ++i) {
      const BatchEntry& e = entries[i];
      std::vector<float> alone(size_t(e.rows) * H * D);
      a2d::cpu::attention(pool, inputs[i].q.data(), inputs[i].k.data(), inputs[i].v.data(), e.cached, e.commit, e.rows, H, KV,
                          D, alone.data(), rule != AdapterRule::none ? &revealed[i] : nullptr, rule);
      want.insert(want.end(), alone.begin(), alone.end());
    }
    check.add(bf16_to_double(std::vector<uint16_t>(got.begin(), got.begin() + want.size())), to_double(want), kAttention);
    check.require(untouched(got, want.size(), got.size()), "rows past the forward's count were written");
  });
}

void prefill_attention_case(Table& table, ThreadPool& pool, const AttentionShape& s, int cached, int rows, uint64_t seed) {
  table.run("attention_prefill", "causal", s.name() + " " + dims({{"n", cached}, {"rows", rows}}), [&](Check& check) {
    const int H = s.heads, KV = s.kv_heads, D = s.head_dim;
    const int positions = cached + rows, max_context = positions + 70;
    Rng rng{seed};
    AttentionInputs in = attention_inputs(rng, s, rows, positions, max_context);
    DeviceArray<uint16_t> out(size_t(rows) * H * D);
    out.poison();
    PrefillAttentionParams p{};
    p.q = as_bf16(*in.q_device);
    p.k_cache = as_bf16(*in.k_device);
    p.v_cache = as_bf16(*in.v_device);
    p.max_context = max_context;
    p.num_heads = H;
    p.num_kv_heads = KV;
    p.head_dim = D;
    p.head_dim_padded = s.padded();
    p.scale = 1.f / std::sqrt(static_cast<float>(D));
    p.cached = cached;
    p.rows = rows;
    p.out = as_bf16(out);
    attention_prefill(p, g_stream);
    const std::vector<uint16_t> got = out.download();
    std::vector<float> want(size_t(rows) * H * D);
    a2d::cpu::attention(pool, in.q.data(), in.k.data(), in.v.data(), cached, rows, rows, H, KV, D, want.data());
    check.add(bf16_to_double(got), to_double(want), kAttention);
  });
}

void attention_cases(Table& table, ThreadPool& pool) {
  const AttentionShape two_b{16, 2, 128}, d64{8, 8, 64}, d48{6, 2, 48}, d32{4, 1, 32}, d24{4, 2, 24};
  uint64_t seed = 4000;
  decode_attention_case(table, pool, two_b, 0, 1, 0, AdapterRule::none, true, ++seed);
  decode_attention_case(table, pool, two_b, 0, 4, 0, AdapterRule::none, true, ++seed);
  decode_attention_case(table, pool, two_b, 37, 13, 5, AdapterRule::none, true, ++seed);
  decode_attention_case(table, pool, two_b, 1000, 16, 8, AdapterRule::mask, true, ++seed);
  decode_attention_case(table, pool, two_b, 4000, 64, 32, AdapterRule::mask, true, ++seed);
  decode_attention_case(table, pool, two_b, 4000, 3, 0, AdapterRule::none, false, ++seed);
  decode_attention_case(table, pool, two_b, 16000, 8, 0, AdapterRule::none, true, ++seed);
  decode_attention_case(table, pool, two_b, 300, 64, 64, AdapterRule::none, true, ++seed);
  decode_attention_case(table, pool, d64, 300, 9, 9, AdapterRule::none, true, ++seed);
  decode_attention_case(table, pool, d48, 130, 24, 12, AdapterRule::none, true, ++seed);
  decode_attention_case(table, pool, d32, 70, 8, 4, AdapterRule::mask, true, ++seed);
  decode_attention_case(table, pool, d24, 65, 5, 2, AdapterRule::none, true, ++seed);
  decode_attention_case(table, pool, two_b, 1000, 9, 4, AdapterRule::window, true, ++seed);
  decode_attention_case(table, pool, two_b, 4000, 17, 8, AdapterRule::window, true, ++seed);
  decode_attention_case(table, pool, d64, 300, 9, 4, AdapterRule::window, true, ++seed);
  // Several sequences in one forward: 2B heads, short and long caches (one split each, many), the window rules.
  decode_attention_batch_case(table, pool, two_b, {{2, 37, 5, 1}, {0, 1000, 5, 0}, {3, 0, 4, 0}}, 4, AdapterRule::none, ++seed);
  decode_attention_batch_case(table, pool, two_b, {{1, 4000, 9, 4}, {0, 12, 6, 1}, {5, 300, 5, 1}, {2, 70, 5, 2}, {4, 9000, 7, 2}},
                              8, AdapterRule::window, ++seed);
  decode_attention_batch_case(table, pool, two_b, {{0, 100, 16, 8}, {1, 2000, 24, 12}, {2, 5, 24, 0}}, 4, AdapterRule::mask, ++seed);
  decode_attention_batch_case(table, pool, d64, {{3, 130, 5, 1}, {1, 65, 5, 1}}, 2, AdapterRule::window, ++seed);
  decode_attention_batch_case(table, pool, d24, {{0, 17, 3, 1}, {1, 300, 33, 20}, {2, 0, 2, 0}}, 4, AdapterRule::none, ++seed);
  // A split's first cached key tile copied before the PDL wait (prefetch_cached): splits with and without keys
  // below the cached length, several tiles a split, every head dimension and adapter rule.
  decode_attention_batch_case(table, pool, two_b, {{1, 4000, 9, 4}, {0, 12, 6, 1}, {5, 300, 5, 1}, {2, 70, 5, 2}, {4, 9000, 7, 2}},
                              8, AdapterRule::window, ++seed, true);
  decode_attention_batch_case(table, pool, two_b, {{0, 700, 5, 1}, {1, 64, 5, 1}, {2, 130, 5, 0}}, 4, AdapterRule::none, ++seed, true);
  decode_attention_batch_case(table, pool, d64, {{3, 130, 5, 1}, {1, 65, 5, 1}}, 2, AdapterRule::mask, ++seed, true);
  decode_attention_case(table, pool, two_b, 1000, 9, 4, AdapterRule::window, true, ++seed, true);
  decode_attention_case(table, pool, two_b, 4000, 17, 8, AdapterRule::none, true, ++seed, true);
  decode_attention_case(table, pool, d48, 130, 24, 12, AdapterRule::none, true, ++seed, true);
  decode_attention_case(table, pool, d24, 65, 5, 2, AdapterRule::mask, true, ++seed, true);
  prefill_attention_case(table, pool, two_b, 0, 1, ++seed);
  prefill_attention_case(table, pool, two_b, 0, 300, ++seed);
  prefill_attention_case(table, pool, two_b, 129, 517, ++seed);
  prefill_attention_case(table, pool, two_b, 2000, 64, ++seed);
  prefill_attention_case(table, pool, d64, 33, 200, ++seed);
  prefill_attention_case(table, pool, d48, 0, 129, ++seed);
  prefill_attention_case(table, pool, d24, 17, 70, ++seed);
}

// ------------------------------------------------------------------------------------------- RoPE

// The rope kernel (shapes whose RoPE is not fused into the QKV GEMM: QK-norm, padded heads): q heads roped into q,
// k heads roped and v heads copied into the cache at slot cached + t, each padded with zeros; with QK-norm each q
// and k head RMS-normalised by its weight first.
void rope_case(Table& table, const AttentionShape& s, bool qk_norm, int cached, int rows, uint64_t seed) {
  table.run("rope", qk_norm ? "qk-norm" : "plain", s.name() + " " + dims({{"n", cached}, {"rows", rows}}), [&](Check& check) {
    const int H = s.heads, KV = s.kv_heads, D = s.head_dim, P = s.padded(), heads = H + 2 * KV;
    const int max_rows = bucket_rows(rows), max_context = cached + rows + 9;
    const float eps = 1e-6f;
    const double theta = 1e6;
    Rng rng{seed};
    const Bf16Values qkv = random_bf16(rng, size_t(rows) * heads * D, -2.f, 2.f);
    const Bf16Values q_norm = random_bf16(rng, D, 0.5f, 1.5f), k_norm = random_bf16(rng, D, 0.5f, 1.5f);
    DeviceArray<uint16_t> qkv_device(qkv.bits), q_norm_device(q_norm.bits), k_norm_device(k_norm.bits);
    DeviceArray<float> table_device(size_t(max_context) * D);
    fill_rope_table(reinterpret_cast<float2*>(table_device.get()), max_context, D, theta, g_stream);
    const StepState state = make_state(cached, rows, rows);
    DeviceArray<StepState> state_device(std::vector<StepState>{state});
    DeviceArray<uint16_t> q_out(size_t(max_rows) * H * P), k_cache(size_t(KV) * max_context * P), v_cache(k_cache.size());
    q_out.poison();
    k_cache.poison();
    v_cache.poison();
    RopeParams p{};
    p.qkv = as_bf16(qkv_device);
    p.num_heads = H;
    p.num_kv_heads = KV;
    p.head_dim = D;
    p.head_dim_padded = P;
    p.rope_table = reinterpret_cast<const float2*>(table_device.get());
    p.q_norm = qk_norm ? as_bf16(q_norm_device) : nullptr;
    p.k_norm = qk_norm ? as_bf16(k_norm_device) : nullptr;
    p.norm_eps = eps;
    p.state = state_device.get();
    p.q_out = as_bf16(q_out);
    p.k_cache = as_bf16(k_cache);
    p.v_cache = as_bf16(v_cache);
    p.max_context = max_context;
    rope(p, max_rows, g_stream, true);

    // The CPU ops: rmsnorm per head (QK-norm), then rope on the q and k heads.
    std::vector<float> x = qkv.values;
    if (qk_norm) {
      for (int t = 0; t < rows; ++t) {
        for (int h = 0; h < H + KV; ++h) {
          float* head = x.data() + (size_t(t) * heads + h) * D;
          a2d::cpu::rmsnorm(head, 1, D, (h < H ? q_norm : k_norm).values.data(), eps, head);
        }
      }
    }
    std::vector<int64_t> positions(rows);
    for (int t = 0; t < rows; ++t) positions[t] = cached + t;
    a2d::cpu::rope(x.data(), rows, int64_t(heads) * D, H + KV, D, positions.data(), theta);
    const std::vector<uint16_t> q_got = q_out.download(), k_got = k_cache.download(), v_got = v_cache.download();
    std::vector<double> got, want;
    for (int t = 0; t < rows; ++t) {
      for (int h = 0; h < heads; ++h) {
        const uint16_t* g = h < H ? &q_got[(size_t(t) * H + h) * P]
                                  : &(h < H + KV ? k_got : v_got)[(size_t((h - H) % KV) * max_context + cached + t) * P];
        for (int d = 0; d < P; ++d) {
          got.push_back(bf16_value(g[d]));
          want.push_back(d < D ? x[(size_t(t) * heads + h) * D + d] : 0.0);
        }
      }
    }
    check.add(got, want, kBf16Out);
  });
}

void rope_cases(Table& table) {
  uint64_t seed = 5000;
  rope_case(table, {16, 2, 128}, false, 50, 13, ++seed);
  rope_case(table, {16, 8, 128}, true, 1000, 64, ++seed);
  rope_case(table, {6, 2, 48}, false, 7, 5, ++seed);
  rope_case(table, {4, 4, 64}, true, 0, 1, ++seed);
  rope_case(table, {4, 2, 24}, true, 3, 9, ++seed);
  // The RoPE table against the CPU op's angles (both fp32 angle = float(position) * inv_freq): one fp32 ulp of
  // inv_freq, rounded on a different path, moves the angle of position 8191 by up to ~1e-3.
  struct TableShape {
    int context, head_dim;
    double theta;
  };
  for (const TableShape& shape : {TableShape{8192, 128, 1e6}, TableShape{4096, 64, 1e4}}) {
    const int context = shape.context, head_dim = shape.head_dim;
    const double theta = shape.theta;
    table.run("fill_rope_table", "cos,sin", dims({{"ctx", context}, {"d", head_dim}}) + " theta" + std::to_string(int(theta)),
              [&](Check& check) {
                const int half = head_dim / 2;
                DeviceArray<float> device(size_t(context) * head_dim);
                device.poison();
                fill_rope_table(reinterpret_cast<float2*>(device.get()), context, head_dim, theta, g_stream);
                const std::vector<float> got = device.download();
                std::vector<int64_t> positions(context);
                for (int i = 0; i < context; ++i) positions[i] = i;
                std::vector<float> cos_table(size_t(context) * half), sin_table(cos_table.size());
                a2d::cpu::rope_table(positions.data(), context, head_dim, theta, cos_table.data(), sin_table.data());
                std::vector<double> want(got.size());
                for (size_t i = 0; i < cos_table.size(); ++i) {
                  want[2 * i] = cos_table[i];
                  want[2 * i + 1] = sin_table[i];
                }
                check.add(to_double(got), want, Tolerance{0, 0, 2e-3});
              });
  }
}

// ------------------------------------------------------------------------------------------- RMSNorm, embedding

void rmsnorm_cases(Table& table) {
  // rmsnorm_rows: the residual's rows from the producer's partial sums of squares (per 16-column tile after a
  // residual-add GEMM, one part after the embedding), into the bf16 rows the GEMMs of more than 8 rows read.
  for (const auto& [hidden, rows, per_tile] : std::initializer_list<std::tuple<int, int, bool>>{{2048, 1, true}, {2048, 13, true}, {2048, 64, true},
                                               {2048, 29, false}, {1000, 9, true}, {520, 64, false}}) {
    table.run("rmsnorm_rows", per_tile ? "tile-ssq" : "one-part-ssq", dims({{"hidden", hidden}, {"rows", rows}}),
              [&, hidden = hidden, rows = rows, per_tile = per_tile](Check& check) {
                Rng rng{uint64_t(6000 + hidden + rows)};
                const int max_rows = bucket_rows(rows);
                const std::vector<float> residual = random_floats(rng, size_t(rows) * hidden, -3.f, 3.f);
                const Bf16Values w = random_bf16(rng, hidden, 0.5f, 1.5f);
                const std::vector<float> ssq = sums_of_squares(residual, rows, hidden, per_tile);
                DeviceArray<float> residual_device(residual), ssq_device(ssq);
                DeviceArray<uint16_t> w_device(w.bits), out(size_t(max_rows) * hidden);
                out.poison();
                const StepState state = make_state(0, rows, rows);
                DeviceArray<StepState> state_device(std::vector<StepState>{state});
                rmsnorm_rows(RmsNormParams{residual_device.get(), hidden, ssq_device.get(), per_tile ? ceil_div(hidden, 16) : 1,
                                           as_bf16(w_device), 1e-6f, state_device.get(), as_bf16(out)},
                             max_rows, g_stream, true);
                const std::vector<uint16_t> got = out.download();
                std::vector<float> want(residual.size());
                a2d::cpu::rmsnorm(residual.data(), rows, hidden, w.values.data(), 1e-6, want.data());
                check.add(bf16_to_double(std::vector<uint16_t>(got.begin(), got.begin() + want.size())), to_double(want), kBf16Out);
                check.require(untouched(got, want.size(), got.size()), "rows past the forward's count were written");
              });
  }
  // rmsnorm_prefill: a prompt chunk's rows, each row's sum of squares computed by the kernel.
  for (const auto& [hidden, rows] : std::initializer_list<std::pair<int, int>>{{2048, 1}, {2048, 300}, {2048, 2048}, {520, 7}}) {
    table.run("rmsnorm_prefill", "own-ssq", dims({{"hidden", hidden}, {"rows", rows}}), [&, hidden = hidden, rows = rows](Check& check) {
      Rng rng{uint64_t(6500 + hidden + rows)};
      const std::vector<float> residual = random_floats(rng, size_t(rows) * hidden, -3.f, 3.f);
      const Bf16Values w = random_bf16(rng, hidden, 0.5f, 1.5f);
      DeviceArray<float> residual_device(residual);
      DeviceArray<uint16_t> w_device(w.bits), out(size_t(rows) * hidden);
      out.poison();
      rmsnorm_prefill(residual_device.get(), hidden, as_bf16(w_device), 1e-6f, rows, as_bf16(out), g_stream);
      std::vector<float> want(residual.size());
      a2d::cpu::rmsnorm(residual.data(), rows, hidden, w.values.data(), 1e-6, want.data());
      check.add(bf16_to_double(out.download()), to_double(want), kBf16Out);
    });
  }
}

void embed_cases(Table& table) {
  // The 2B table (130560 x 2048) and an odd one; ids include the first and the last.
  for (const std::pair<int, int>& size : std::initializer_list<std::pair<int, int>>{{130560, 2048}, {1001, 520}}) {
    const int vocab = size.first, hidden = size.second;
    Rng rng{uint64_t(7000 + vocab)};
    const std::string shape = dims({{"vocab", vocab}, {"hidden", hidden}});
    bool any = false;
    for (int rows : {1, 13, 64}) any = any || table.wanted("embed", "decode", shape + " rows" + std::to_string(rows));
    any = any || table.wanted("embed_tokens", "prefill", shape + " rows2048");
    if (!any) continue;
    const Bf16Values embedding = random_bf16(rng, size_t(vocab) * hidden, -1.f, 1.f);
    DeviceArray<uint16_t> table_device(embedding.bits);
    Tensor t;
    t.dtype = DType::bf16;
    t.shape = {vocab, hidden};
    t.data = embedding.bits.data();
    auto ids = [&](int rows) {
      std::vector<int32_t> id(rows);
      for (int i = 0; i < rows; ++i) id[i] = i == 0 ? vocab - 1 : (i == 1 ? 0 : rng.below(vocab));
      return id;
    };
    for (int rows : {1, 13, 64}) {
      table.run("embed", "decode", shape + " rows" + std::to_string(rows), [&](Check& check) {
        const std::vector<int32_t> id = ids(rows);
        StepState state = make_state(0, rows, rows);
        std::copy(id.begin(), id.end(), state.tokens);
        DeviceArray<StepState> state_device(std::vector<StepState>{state});
        DeviceArray<float> residual(size_t(bucket_rows(rows)) * hidden), ssq(kMaxRows);
        residual.poison();
        ssq.poison();
        embed(EmbedParams{as_bf16(table_device), hidden, state_device.get(), residual.get(), ssq.get()}, bucket_rows(rows),
              g_stream, true);
        std::vector<float> want(size_t(rows) * hidden);
        a2d::cpu::embed(t, id.data(), rows, want.data());
        const std::vector<float> got = residual.download();
        check.add(to_double(std::vector<float>(got.begin(), got.begin() + want.size())), to_double(want), kExact);
        check.require(untouched(got, want.size(), got.size()), "rows past the forward's count were written");
        const std::vector<float> ssq_got = ssq.download();
        std::vector<double> sg, sw;
        for (int r = 0; r < rows; ++r) {
          double sum = 0;
          for (int i = 0; i < hidden; ++i) sum += double(want[size_t(r) * hidden + i]) * want[size_t(r) * hidden + i];
          sg.push_back(ssq_got[r]);
          sw.push_back(sum);
        }
        check.add(sg, sw, kSumOfSquares);
      });
    }
    table.run("embed_tokens", "prefill", shape + " rows2048", [&](Check& check) {
      const std::vector<int32_t> id = ids(2048);
      DeviceArray<int32_t> id_device(id);
      DeviceArray<float> residual(size_t(2048) * hidden);
      residual.poison();
      embed_tokens(as_bf16(table_device), hidden, id_device.get(), 2048, residual.get(), g_stream);
      std::vector<float> want(residual.size());
      a2d::cpu::embed(t, id.data(), 2048, want.data());
      check.add(to_double(residual.download()), to_double(want), kExact);
    });
  }
}

// ------------------------------------------------------------------------------------------- argmax and confidence

// reveal_argmax over per-tile partials made here from random logits, as the logits epilogue's contract states them
// (gemm.cuh, ArgmaxPartial: per 16-row tile the max logit with the mask token excluded, the lowest row on ties, and
// the sum of exp(logit - max); a tile with no valid row has index -1). Logits on a coarse grid make ties, which
// the lowest id must win. The answer: the argmax over all tokens but the mask one and its softmax probability.
void reveal_cases(Table& table) {
  for (const auto& [vocab, rows, mask] : std::initializer_list<std::tuple<int, int, int>>{{130560, 1, 130559}, {130560, 7, 3}, {130560, 64, 64000},
                                          {1001, 5, 1000}, {17, 3, 16}}) {
    table.run("reveal_argmax", "ties+mask", dims({{"vocab", vocab}, {"rows", rows}}),
              [&, vocab = vocab, rows = rows, mask = mask](Check& check) {
      Rng rng{uint64_t(8000 + vocab + rows)};
      const int tiles = ceil_div(vocab, kGemmTileRows);
      std::vector<float> logits(size_t(rows) * vocab);
      for (float& l : logits) l = std::round(rng.uniform(-6.f, 6.f) * 4.f) / 4.f;
      for (int t = 0; t < rows; ++t) logits[size_t(t) * vocab + mask] = 50.f;  // the mask token would win
      std::vector<ArgmaxPartial> partials(size_t(tiles) * kMaxRows, ArgmaxPartial{NAN, NAN, -2});
      for (int tile = 0; tile < tiles; ++tile) {
        for (int t = 0; t < rows; ++t) {
          ArgmaxPartial p{-INFINITY, 0.f, -1};
          for (int v = tile * 16; v < std::min(vocab, tile * 16 + 16); ++v) {
            const float l = logits[size_t(t) * vocab + v];
            if (v != mask && (p.index < 0 || l > p.max)) p = {l, 0.f, v};
          }
          double sum = 0;
          for (int v = tile * 16; v < std::min(vocab, tile * 16 + 16) && p.index >= 0; ++v) {
            if (v != mask) sum += std::exp(double(logits[size_t(t) * vocab + v]) - p.max);
          }
          p.sum = static_cast<float>(sum);
          partials[size_t(tile) * kMaxRows + t] = p;
        }
      }
      DeviceArray<ArgmaxPartial> partials_device(partials);
      StepState state = make_state(0, 0, rows);
      state.logit_count = rows;
      DeviceArray<StepState> state_device(std::vector<StepState>{state});
      DeviceArray<TokenChoice> choices(kMaxRows);
      choices.poison();
      reveal_argmax(RevealParams{partials_device.get(), tiles, state_device.get(), choices.get()}, bucket_rows(rows), g_stream, true);
      const std::vector<TokenChoice> got = choices.download();
      std::vector<double> token_got, token_want, conf_got, conf_want;
      for (int t = 0; t < rows; ++t) {
        const float* row = &logits[size_t(t) * vocab];
        int best = -1;
        for (int v = 0; v < vocab; ++v) {
          if (v != mask && (best < 0 || row[v] > row[best])) best = v;
        }
        double sum = 0;
        for (int v = 0; v < vocab; ++v) sum += v == mask ? 0.0 : std::exp(double(row[v]) - row[best]);
        token_got.push_back(got[t].token);
        token_want.push_back(best);
        conf_got.push_back(got[t].confidence);
        conf_want.push_back(1.0 / sum);
      }
      check.add(token_got, token_want, kExact);
      check.add(conf_got, conf_want, Tolerance{1e-4, 0, 0});
    });
  }
}

// ------------------------------------------------------------------------------------------- weight placement

// convert_rows / place_fp8_rows / place_scales against weights.cuh's contract: source row r (rope-pair reordered
// within each head when rope_half is set) goes to row (r / group) * group_stride + group_offset + r % group, at
// tiled_index / tiled_fp8_index of that row in the tiled layouts; the value as bf16 (round to nearest even), e4m3
// bytes and fp32 scales as they are. Rows arrive in two chunks (source_row0), as DeviceModel::stage_rows sends them.
void placement_cases(Table& table) {
  struct PlacementCase {
    const char* name;
    SourceType type;
    bool tiled;
    RowPlacement at;
    int rows, cols, dest_rows;
  };
  const PlacementCase cases[] = {
      {"f32 plain up-rows", SourceType::f32, false, RowPlacement{8, 16, 8, 0}, 100, 72, 208},
      {"f16 tiled rope-pairs", SourceType::f16, true, rope_pair_rows(64, 32), 192, 200, 256},
      {"bf16 tiled gate-rows", SourceType::bf16, true, RowPlacement{8, 16, 0, 0}, 52, 456, 112},
      {"e4m3 fp8-tiled rope-pairs", SourceType::f8_e4m3, true, rope_pair_rows(0, 64), 256, 264, 256},
  };
  for (const PlacementCase& c : cases) {
    table.run(c.type == SourceType::f8_e4m3 ? "place_fp8_rows" : "convert_rows", c.name,
              dims({{"rows", c.rows}, {"cols", c.cols}}), [&](Check& check) {
      Rng rng{uint64_t(9000 + c.rows + c.cols)};
      const int64_t count = int64_t(c.rows) * c.cols;
      const bool fp8 = c.type == SourceType::f8_e4m3;
      const size_t element = c.type == SourceType::f32 ? 4 : (fp8 ? 1 : 2);
      std::vector<float> values(count);
      std::vector<uint8_t> bytes(count * element);
      for (int64_t i = 0; i < count; ++i) {
        const float v = rng.uniform(-3.f, 3.f);
        if (c.type == SourceType::f32) {
          std::memcpy(&bytes[i * 4], &v, 4);
          values[i] = v;
        } else if (c.type == SourceType::f16) {
          const __half h = __float2half_rn(v);
          std::memcpy(&bytes[i * 2], &h, 2);
          values[i] = __half2float(h);
        } else if (c.type == SourceType::bf16) {
          const uint16_t b = bf16_bits(v);
          std::memcpy(&bytes[i * 2], &b, 2);
          values[i] = bf16_value(b);
        } else {
          bytes[i] = static_cast<uint8_t>(rng.next() & 0xff);
          values[i] = bytes[i];
        }
      }
      const std::vector<float> scales = random_floats(rng, c.rows, 0.f, 1.f);
      DeviceArray<uint8_t> source(bytes);
      DeviceArray<float> scale_source(scales);
      const size_t dest_elements = fp8 ? size_t(tiled_fp8_bytes(c.dest_rows, c.cols))
                                   : c.tiled ? size_t(tiled_elements(c.dest_rows, c.cols))
                                             : size_t(c.dest_rows) * c.cols;
      DeviceArray<uint16_t> dest(fp8 ? 0 : dest_elements);
      DeviceArray<uint8_t> dest_fp8(fp8 ? dest_elements : 0);
      DeviceArray<float> dest_scales(c.dest_rows);
      dest.poison();
      dest_fp8.poison();
      dest_scales.poison();
      const int first_chunk = c.rows / 2;  // two chunks of rows, the second from source_row0 = first_chunk
      for (const auto& [row0, n] : std::initializer_list<std::pair<int, int>>{{0, first_chunk}, {first_chunk, c.rows - first_chunk}}) {
        RowPlacement at = c.at;
        at.source_row0 = row0;
        if (fp8) {
          place_fp8_rows(source.get() + size_t(row0) * c.cols, n, c.cols, dest_fp8.get(), at, g_stream);
          place_scales(scale_source.get() + row0, n, dest_scales.get(), at, g_stream);
        } else {
          convert_rows(source.get() + size_t(row0) * c.cols * element, c.type, n, c.cols, as_bf16(dest), at, c.tiled, g_stream);
        }
      }
      const std::vector<uint16_t> got = fp8 ? std::vector<uint16_t>() : dest.download();
      const std::vector<uint8_t> got_fp8 = fp8 ? dest_fp8.download() : std::vector<uint8_t>();
      const std::vector<float> got_scales = dest_scales.download();
      std::vector<double> g, want, sg, sw;
      for (int r = 0; r < c.rows; ++r) {
        const int64_t pr = c.at.rope_half > 0 ? rope_pair_row(r, c.at.rope_half) : r;
        const int64_t row = pr / c.at.group * c.at.group_stride + c.at.group_offset + pr % c.at.group;
        for (int col = 0; col < c.cols; ++col) {
          const int64_t at = fp8 ? tiled_fp8_index(row, col, c.cols) : c.tiled ? tiled_index(row, col, c.cols) : row * c.cols + col;
          g.push_back(fp8 ? got_fp8[at] : bf16_value(got[at]));
          want.push_back(fp8 ? values[size_t(r) * c.cols + col] : round_bf16(values[size_t(r) * c.cols + col]));
        }
        if (fp8) {
          sg.push_back(got_scales[row]);
          sw.push_back(scales[r]);
        }
      }
      check.add(g, want, kExact);
      if (fp8) check.add(sg, sw, kExact);
    });
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string filter;
  bool probe = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--probe") {
      probe = true;
    } else if (arg == "--filter" && i + 1 < argc) {
      filter = argv[++i];
    } else {
      std::fprintf(stderr, "usage: a2d_cuda_ops_test [--filter SUBSTR] [--probe]\n");
      return 2;
    }
  }
  int device_count = 0;
  const cudaError_t found = cudaGetDeviceCount(&device_count);
  if (found != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "no CUDA device: %s\n", found == cudaSuccess ? "none found" : cudaGetErrorString(found));
    return 1;
  }
  if (probe) return 0;
  cudaDeviceProp properties{};
  A2D_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  if (properties.major < 9) {
    std::fprintf(stderr, "the CUDA kernels are built for compute capability 9.0; %s is %d.%d\n", properties.name,
                 properties.major, properties.minor);
    return 1;
  }
  g_sm_count = properties.multiProcessorCount;
  A2D_CUDA_CHECK(cudaStreamCreate(&g_stream));
  attention_prepare();
  attention_prefill_prepare();
  gemm_prefill_prepare();
  ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::printf("device: %s, %d SMs%s\n", properties.name, g_sm_count, filter.empty() ? "" : (", filter: " + filter).c_str());
  std::printf("%-18s %-40s %-32s %10s %10s  %-28s %s\n", "op", "variant", "shape", "max_abs_err", "max_rel_err",
              "tolerance", "result");

  Table table(filter);
  decode_gemm_cases(table, pool);
  all_prefill_gemm_cases(table, pool);
  attention_cases(table, pool);
  rope_cases(table);
  rmsnorm_cases(table);
  embed_cases(table);
  reveal_cases(table);
  placement_cases(table);
  std::printf("%d cases, %d failed\n", table.cases(), table.failures());
  return table.failures() == 0 && table.cases() > 0 ? 0 : 1;
}
