// The prefill GEMM's standalone harness (engine/cuda/gemm_prefill.cu, gemm_wgmma.cu), for the GPU machine
// (bench/stage-device.sh builds it as build/device/gemm_prefill_bench; bench/device-prefill-gemm.sh runs it): every
// block shape the mma.sync kernel is built at (kPrefillShapes) and the warpgroup kernel at each of kWgmmaTokens
// (its K split planned by prefill_wgmma_split) side by side, and the shape the engine picks by rows
// (prefill_shape):
//   CHECK  each GEMM of the MiniCPM5-2B layer (qkv, o, gate_up, down) at 5, 32, 160 and 2,048 rows, with K split as
//          the engine plans it (prefill_split at the shape's blocks per SM) and unsplit, store_bf16 epilogue:
//          512 sampled outputs against an fp64 reference of the same stored values (the relative error of the
//          sampled vector at most 5e-3, bf16's rounding), and the outputs past the rows keep their poison; then two
//          odd shapes (200 x 456, 72 x 1000) the same way, untimed.
//   TIME   microseconds a GEMM at 8, 32, 64, 160, 512 and 2,048 rows, split and unsplit: a CUDA graph of 42 launches
//          over distinct copies of the weight (a forward's 42 layers, past the 50 MB L2), replayed 20 times.
// Prints CHECK and TIME lines, then a table row per (shape, GEMM, rows), then the by-rows pick's time a layer beside
// the warpgroup kernel's best; exit status 1 on any failed check.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iengine/cuda -Iengine/bench \
//     -o build/device/gemm_prefill_bench engine/bench/gemm_prefill_bench.cu engine/cuda/gemm_prefill.cu \
//     engine/cuda/gemm_wgmma.cu
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_values.cuh"
#include "gemm_prefill.cuh"
#include "weights.cuh"

using namespace a2d::cuda;
using namespace a2d::bench;

namespace {

struct Shape {
  const char* name;
  int n, k;
};
const Shape kShapes[] = {{"qkv", 2560, 2048}, {"o", 2048, 2048}, {"gate_up", 12288, 2048}, {"down", 2048, 6144}};
// Checked, not timed: weight rows not a multiple of a block's 128 and a K whose last 64-k step holds one chunk.
const Shape kOddShapes[] = {{"odd", 200, 456}, {"odd", 72, 1000}};
const int kCheckRows[] = {5, 32, 160, 2048};
const int kTimeRows[] = {8, 32, 64, 160, 512, 2048};
constexpr int kLayers = 42;
constexpr int kReplays = 20;
constexpr int kMaxRows = 2048;

// One kernel configuration: a shape of the mma.sync kernel, or the warpgroup kernel at `wgmma_tokens` a block.
struct Variant {
  PrefillShape shape;
  int wgmma_tokens = 0;
  std::string name() const {
    if (wgmma_tokens > 0) return "wgmma, tokens " + std::to_string(wgmma_tokens);
    return "tokens " + std::to_string(shape.block_tokens) + ", stages " + std::to_string(shape.stages) + ", blocks/SM " +
           std::to_string(shape.blocks_per_sm);
  }
};

std::vector<Variant> variants() {
  std::vector<Variant> all;
  for (const PrefillShape& shape : kPrefillShapes) all.push_back({shape, 0});
  for (int tokens : kWgmmaTokens) all.push_back({PrefillShape{}, tokens});
  return all;
}

__global__ void fill_weight_kernel(bf16* w, int n, int k, uint64_t seed) {
  const int64_t count = static_cast<int64_t>(n) * k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const uint16_t bits = weight_bf16(seed, i);
    w[tiled_index(i / k, i % k, k)] = *reinterpret_cast<const bf16*>(&bits);
  }
}

// One shape's weight copies (copy c from seed c + 1), its inputs, outputs and split scratch.
struct Setup {
  Shape shape;
  int sms = 0;  // the device's SMs, which the split plan divides its blocks over
  std::vector<bf16*> weights;
  std::vector<uint16_t> x_host;  // [kMaxRows][k]
  bf16* x = nullptr;
  bf16* out = nullptr;  // [kMaxRows + 1][n]: the row past the last holds the poison
  float* partial = nullptr;
  int* counters = nullptr;
};

Setup make_setup(const Shape& s) {
  Setup setup{s};
  A2D_CUDA_CHECK(cudaDeviceGetAttribute(&setup.sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t bytes = tiled_elements(s.n, s.k) * sizeof(bf16);
  const int copies = static_cast<int>(std::min<size_t>(kLayers, (200ull << 20) / bytes + 1));
  for (int c = 0; c < copies; ++c) {
    bf16* w = nullptr;
    A2D_CUDA_CHECK(cudaMalloc(&w, bytes));
    A2D_CUDA_CHECK(cudaMemset(w, 0, bytes));
    fill_weight_kernel<<<1024, 256>>>(w, s.n, s.k, static_cast<uint64_t>(c) + 1);
    A2D_CUDA_CHECK(cudaGetLastError());
    setup.weights.push_back(w);
  }
  Rng rng{static_cast<uint64_t>(s.n) * 131 + s.k};
  setup.x_host.resize(static_cast<size_t>(kMaxRows) * s.k);
  for (auto& h : setup.x_host) h = bf16_bits(2.0f * rng.uniform() - 1.0f);
  setup.x = reinterpret_cast<bf16*>(device_copy(setup.x_host));
  A2D_CUDA_CHECK(cudaMalloc(&setup.out, static_cast<size_t>(kMaxRows + 1) * s.n * sizeof(bf16)));
  // The most scratch any row count asks for: the split plans at the check and time row counts.
  size_t partial = 1, counters = 1;
  for (int rows : kTimeRows) {
    for (const PrefillShape& shape : kPrefillShapes) {
      const PrefillSplit split = prefill_split(rows, s.n, s.k, shape.blocks_per_sm, setup.sms, shape);
      partial = std::max(partial, split.partial_floats);
      counters = std::max<size_t>(counters, split.counters);
    }
    for (int tokens : kWgmmaTokens) {
      const PrefillSplit split = prefill_wgmma_split(rows, s.n, s.k, setup.sms, tokens);
      partial = std::max(partial, split.partial_floats);
      counters = std::max<size_t>(counters, split.counters);
    }
  }
  A2D_CUDA_CHECK(cudaMalloc(&setup.partial, partial * sizeof(float)));
  A2D_CUDA_CHECK(cudaMalloc(&setup.counters, counters * sizeof(int)));
  A2D_CUDA_CHECK(cudaMemset(setup.counters, 0, counters * sizeof(int)));  // the kernel leaves them zero
  A2D_CUDA_CHECK(cudaDeviceSynchronize());
  return setup;
}

void free_setup(Setup& s) {
  for (bf16* w : s.weights) cudaFree(w);
  cudaFree(s.x);
  cudaFree(s.out);
  cudaFree(s.partial);
  cudaFree(s.counters);
}

PrefillGemmParams params_for(const Setup& s, const Variant& v, int copy, int rows, bool split) {
  const PrefillShape& shape = v.shape;
  PrefillGemmParams p{};
  p.weight = s.weights[copy % s.weights.size()];
  p.n_rows = p.n_out = s.shape.n;
  p.k = s.shape.k;
  p.x = s.x;
  p.x_stride = s.shape.k;
  p.rows = rows;
  p.out = s.out;
  p.out_stride = s.shape.n;
  if (split) {
    p.steps_per_split = v.wgmma_tokens > 0 ? prefill_wgmma_split(rows, s.shape.n, s.shape.k, s.sms, v.wgmma_tokens).steps_per_split
                                           : prefill_split(rows, s.shape.n, s.shape.k, shape.blocks_per_sm, s.sms, shape).steps_per_split;
    p.partial = s.partial;
    p.counters = s.counters;
  }
  return p;
}

void run(const Setup& s, const Variant& v, int copy, int rows, bool split, cudaStream_t stream) {
  const PrefillGemmParams p = params_for(s, v, copy, rows, split);
  if (v.wgmma_tokens > 0) {
    gemm_prefill_wgmma(p, PrefillEpilogue::store_bf16, stream, v.wgmma_tokens);
  } else {
    gemm_prefill(p, PrefillEpilogue::store_bf16, stream, v.shape);
  }
}

// The sampled outputs of weight copy 0 at `rows` against the fp64 reference; true when within tolerance.
bool check(const Setup& s, const Variant& v, int rows, bool split) {
  const int n = s.shape.n, k = s.shape.k;
  std::vector<uint16_t> poison(static_cast<size_t>(rows + 1) * n, 0x7fc1);  // a quiet NaN in every output
  A2D_CUDA_CHECK(cudaMemcpy(s.out, poison.data(), poison.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
  run(s, v, 0, rows, split, nullptr);
  A2D_CUDA_CHECK(cudaGetLastError());
  std::vector<uint16_t> out(poison.size());
  A2D_CUDA_CHECK(cudaMemcpy(out.data(), s.out, out.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  Rng rng{static_cast<uint64_t>(rows) * 7 + n};
  double err = 0, norm = 0;
  bool finite = true;
  for (int i = 0; i < 512; ++i) {
    const int t = static_cast<int>(rng.next() % rows), col = static_cast<int>(rng.next() % n);
    double want = 0;
    for (int j = 0; j < k; ++j) {
      want += static_cast<double>(bf16_value(s.x_host[static_cast<size_t>(t) * k + j])) *
              bf16_value(weight_bf16(1, static_cast<uint64_t>(col) * k + j));
    }
    const double got = bf16_value(out[static_cast<size_t>(t) * n + col]);
    finite = finite && std::isfinite(got);
    err += (got - want) * (got - want);
    norm += want * want;
  }
  bool poison_kept = true;
  for (int col = 0; col < n; ++col) poison_kept = poison_kept && out[static_cast<size_t>(rows) * n + col] == 0x7fc1;
  const double rel = std::sqrt(err / std::max(norm, 1e-30));
  const bool ok = finite && poison_kept && rel <= 5e-3;
  std::printf("CHECK %-36s %-8s %5d rows %-7s rel err %.2e%s%s  %s\n", v.name().c_str(), s.shape.name, rows,
              split ? "split" : "unsplit", rel, finite ? "" : ", non-finite output",
              poison_kept ? "" : ", a row past the last written", ok ? "ok" : "FAIL");
  return ok;
}

// Microseconds a GEMM: a graph of kLayers launches over the weight copies, replayed kReplays times.
double time_us(const Setup& s, const Variant& v, int rows, bool split) {
  cudaStream_t stream;
  A2D_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  A2D_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int layer = 0; layer < kLayers; ++layer) {
    run(s, v, layer, rows, split, stream);
  }
  A2D_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  A2D_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  A2D_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  cudaEvent_t start, stop;
  A2D_CUDA_CHECK(cudaEventCreate(&start));
  A2D_CUDA_CHECK(cudaEventCreate(&stop));
  A2D_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int r = 0; r < kReplays; ++r) A2D_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  A2D_CUDA_CHECK(cudaEventRecord(stop, stream));
  A2D_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  A2D_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return ms * 1000.0 / (kLayers * kReplays);
}

}  // namespace

int main() {
  std::printf("gemm_prefill_bench\n");
  int failures = 0;
  std::vector<std::string> table = {"| shape | GEMM | rows | unsplit us | split us | weights TB/s (best) | TFLOP/s (best) |",
                                    "|---|---|---|---|---|---|---|"};
  // The by-rows pick (prefill_shape, split as planned): microseconds of the layer's four GEMMs at each row count.
  std::vector<double> picked(std::size(kTimeRows), 0.0), engine(std::size(kTimeRows), 0.0);
  // The warpgroup kernel: each GEMM at its fastest block tokens, summed over the layer.
  std::vector<double> wgmma_best(std::size(kTimeRows), 0.0);
  try {
    gemm_prefill_prepare();
    for (const Shape& gemm : kShapes) {
      Setup setup = make_setup(gemm);
      for (const Variant& v : variants()) {
        for (int rows : kCheckRows) {
          for (bool split : {false, true}) failures += !check(setup, v, rows, split);
        }
      }
      std::vector<double> gemm_wgmma(std::size(kTimeRows), 1e30);
      for (const Variant& v : variants()) {
        const PrefillShape& shape = v.shape;
        for (size_t r = 0; r < std::size(kTimeRows); ++r) {
          const int rows = kTimeRows[r];
          const double unsplit = time_us(setup, v, rows, false), split = time_us(setup, v, rows, true);
          const double best = std::min(unsplit, split);
          const double bytes = static_cast<double>(tiled_elements(gemm.n, gemm.k)) * sizeof(bf16);
          const double flops = 2.0 * rows * gemm.n * gemm.k;
          std::printf("TIME  %s  %-8s %5d rows  unsplit %8.2f us  split %8.2f us\n", v.name().c_str(), gemm.name,
                      rows, unsplit, split);
          char line[256];
          std::snprintf(line, sizeof line, "| %s | %s | %d | %.2f | %.2f | %.2f | %.1f |", v.name().c_str(), gemm.name,
                        rows, unsplit, split, bytes / best / 1e6, flops / best / 1e6);
          table.push_back(line);
          if (v.wgmma_tokens > 0) {
            gemm_wgmma[r] = std::min(gemm_wgmma[r], best);
            continue;
          }
          const PrefillShape pick = prefill_shape(rows, true);
          if (pick.block_tokens == shape.block_tokens) picked[r] += split;
          if (shape.block_tokens == kPrefillShapes[0].block_tokens) engine[r] += split;
        }
      }
      for (size_t r = 0; r < std::size(kTimeRows); ++r) wgmma_best[r] += gemm_wgmma[r];
      free_setup(setup);
    }
    for (const Shape& odd : kOddShapes) {
      Setup setup = make_setup(odd);
      for (const Variant& v : variants()) {
        for (int rows : kCheckRows) {
          for (bool split : {false, true}) failures += !check(setup, v, rows, split);
        }
      }
      free_setup(setup);
    }
  } catch (const std::exception& e) {
    std::printf("FAIL error: %s\n", e.what());
    ++failures;
  }
  for (const std::string& row : table) std::printf("%s\n", row.c_str());
  std::printf("\n| rows | a layer's four GEMMs, 128-token blocks (us) | by rows (prefill_shape) | ratio | wgmma, best tokens each | ratio to by rows |\n|---|---|---|---|---|---|\n");
  for (size_t r = 0; r < std::size(kTimeRows); ++r) {
    std::printf("| %d | %.1f | %.1f | %.2f | %.1f | %.2f |\n", kTimeRows[r], engine[r], picked[r],
                picked[r] > 0 ? engine[r] / picked[r] : 0.0, wgmma_best[r], wgmma_best[r] > 0 ? picked[r] / wgmma_best[r] : 0.0);
  }
  std::printf("failures: %d\n", failures);
  return failures == 0 ? 0 : 1;
}
