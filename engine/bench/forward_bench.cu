// The CUDA engine's standalone harness: a C interface over DeviceModel that bench/cuda_check.py drives
// through ctypes on the GPU machine. Python builds random weights with PyTorch, hands their device
// pointers (or host copies) to the engine, compares every forward with a PyTorch fp32 reference on the
// same weights, and times graph replays for each row count and KV length. Errors come back as text.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"
#include "decode.h"
#include "model.cuh"
#include "model.h"

using namespace a2d::cuda;

namespace {

void set_error(char* error, int size, const char* message) {
  if (error != nullptr && size > 0) {
    std::strncpy(error, message, size - 1);
    error[size - 1] = '\0';
  }
}

template <typename F>
int guarded(char* error, int size, F&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    set_error(error, size, e.what());
    return -1;
  }
}

// Deterministic pseudo-random bf16 in [-1, 1): long-context timings must not run on zeros.
__global__ void fill_random_kernel(bf16* data, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * uint64_t(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    data[i] = __float2bfloat16(float(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// An empty kernel that, like every engine kernel, waits for its predecessor: launch-overhead probe.
__global__ void empty_kernel(int) { wait_for_previous_grid(); }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The synthetic forward the timings run: `rows` fixed tokens after `cached` cached ones, logits for the
// last `logit_count` rows. Owns the arrays its ForwardInputs points to.
struct TimedForward {
  std::vector<int32_t> tokens, logit_rows;
  ForwardInputs in;
  TimedForward(const DeviceModel& model, int cached, int commit, int rows, int logit_count)
      : tokens(rows), logit_rows(logit_count) {
    for (int i = 0; i < rows; ++i) tokens[i] = (i * 7919 + 13) % model.shape().vocab;
    for (int i = 0; i < logit_count; ++i) logit_rows[i] = rows - logit_count + i;
    in.cached = cached;
    in.commit = commit;
    in.tokens = tokens.data();
    in.rows = rows;
    in.logit_rows = logit_rows.data();
    in.logit_count = logit_count;
  }
  TimedForward(const TimedForward&) = delete;  // `in` points into this object's own arrays
  TimedForward& operator=(const TimedForward&) = delete;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Which kernels the captured forwards run, for the timing breakdowns: bit 0 the GEMMs (a row adapter's factors
// fused into them), bit 1 attention (rope, attention, combine), bit 2 the rest (embed, rmsnorm rows, reveal);
// 7 all. The other kernels' graph nodes are disabled (a partial forward's outputs are meaningless) until the
// model recaptures its graphs (DeviceModel::reconfigure). The production forward knows nothing of this: the
// nodes are told apart here, by their kernels' names.
void run_only(DeviceModel* model, unsigned kernels) {
  if (!model->options().graphs) throw std::runtime_error("a kernel breakdown needs graphs (graphs=1)");
  model->synchronize();
  for (int bucket = 1; bucket <= kMaxRows / 8; ++bucket) {
    const DeviceModel::CapturedForward& captured = model->captured(bucket);
    size_t count = 0;
    A2D_CUDA_CHECK(cudaGraphGetNodes(captured.graph, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    A2D_CUDA_CHECK(cudaGraphGetNodes(captured.graph, nodes.data(), &count));
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type;
      A2D_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
      if (type != cudaGraphNodeTypeKernel) continue;
      cudaKernelNodeParams params{};
      A2D_CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &params));
      const char* name = nullptr;
      A2D_CUDA_CHECK(cudaFuncGetName(&name, params.func));
      const std::string kernel = name != nullptr ? name : "";
      auto named = [&](const char* part) { return kernel.find(part) != std::string::npos; };
      unsigned group = 4;  // embed, rmsnorm rows, reveal
      if (named("gemm_")) {
        group = 1;
      } else if (named("rope_kernel") || named("attention_kernel") || named("combine_kernel")) {
        group = 2;
      }
      A2D_CUDA_CHECK(cudaGraphNodeSetEnabled(captured.exec, node, (kernels & group) != 0 ? 1 : 0));
    }
  }
}

#if defined(A2D_GEMM_TRACE)
// With the model reconfigured to write the GEMMs' block records (ModelOptions::gemm_trace, capacity of them):
// `warm` runs, then `traced`, whose records (at most capacity) go to records[] and whose count of them to *count;
// then the trace is off again and `after` runs.
template <typename Warm, typename Traced, typename After>
void with_gemm_trace(DeviceModel* model, int capacity, void* records, int* count, Warm&& warm, Traced&& traced,
                     After&& after) {
  GemmTrace trace;
  trace.capacity = static_cast<unsigned>(capacity);
  A2D_CUDA_CHECK(cudaMalloc(&trace.records, sizeof(GemmBlockRecord) * capacity));
  A2D_CUDA_CHECK(cudaMalloc(&trace.count, sizeof(unsigned)));
  ModelOptions options = model->options();
  options.gemm_trace = trace;
  model->reconfigure(options);
  warm();
  model->synchronize();
  A2D_CUDA_CHECK(cudaMemset(trace.count, 0, sizeof(unsigned)));
  traced();
  model->synchronize();
  unsigned written = 0;
  A2D_CUDA_CHECK(cudaMemcpy(&written, trace.count, sizeof(unsigned), cudaMemcpyDeviceToHost));
  A2D_CUDA_CHECK(cudaMemcpy(records, trace.records, sizeof(GemmBlockRecord) * std::min<unsigned>(written, capacity),
                            cudaMemcpyDeviceToHost));
  *count = static_cast<int>(written);
  options.gemm_trace = GemmTrace{};
  model->reconfigure(options);
  after();
  A2D_CUDA_CHECK(cudaFree(trace.records));
  A2D_CUDA_CHECK(cudaFree(trace.count));
}
#endif

}  // namespace

extern "C" {

struct BenchShape {
  int hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_context, mask_token_id;
  int tied, qkv_bias, o_bias, qk_norm;
  int fp8;  // ModelShape::fp8: the projections (and an untied lm_head) come through a2d_bench_upload_fp8
  double rms_eps, rope_theta;
  // ModelShape's row adapter: its rank on every target of the bits of adapter_targets (AdapterTarget order; 0:
  // none), on the window rows (1) or the mask-token rows (0); the factors come through a2d_bench_upload_adapter.
  int adapter_rank, adapter_targets, adapter_on_window;
};

// fuse_rope: ModelOptions::fuse_rope.
void* a2d_bench_create(const BenchShape* b, int graphs, int pdl, int fuse_rope, char* error, int size) {
  DeviceModel* model = nullptr;
  guarded(error, size, [&] {
    ModelShape s;
    s.hidden = b->hidden;
    s.intermediate = b->intermediate;
    s.layers = b->layers;
    s.heads = b->heads;
    s.kv_heads = b->kv_heads;
    s.head_dim = b->head_dim;
    s.vocab = b->vocab;
    s.max_context = b->max_context;
    s.mask_token_id = b->mask_token_id;
    s.tied_embeddings = b->tied;
    s.qkv_bias = b->qkv_bias;
    s.o_bias = b->o_bias;
    s.qk_norm = b->qk_norm;
    s.fp8 = b->fp8 != 0;
    s.rms_eps = static_cast<float>(b->rms_eps);
    s.rope_theta = b->rope_theta;
    s.adapter_rank = b->adapter_rank;
    s.adapter_targets = static_cast<unsigned>(b->adapter_targets);
    s.adapter_on_window = b->adapter_on_window != 0;
    ModelOptions options;
    options.graphs = graphs;
    options.pdl = pdl;
    options.fuse_rope = fuse_rope != 0;
    model = new DeviceModel(s, options);
  });
  return model;
}

void a2d_bench_destroy(void* handle) { delete static_cast<DeviceModel*>(handle); }

int a2d_bench_upload(void* handle, int name, int layer, const void* data, int type, int on_device, char* error,
                     int size) {
  return guarded(error, size, [&] {
    static_cast<DeviceModel*>(handle)->upload(static_cast<WeightName>(name), layer,
                                              WeightSource{data, static_cast<SourceType>(type), on_device != 0});
  });
}

// An FP8 model's projection or lm_head: e4m3 bytes [rows][cols] and their fp32 row scales, in the same memory.
int a2d_bench_upload_fp8(void* handle, int name, int layer, const void* data, const float* scale, int on_device,
                         char* error, int size) {
  return guarded(error, size, [&] {
    static_cast<DeviceModel*>(handle)->upload(static_cast<WeightName>(name), layer,
                                              WeightSource{data, SourceType::f8_e4m3, on_device != 0, scale});
  });
}

// A row adapter's factors for one projection of one layer (target: AdapterTarget), in host memory: a [rank][in] and
// b [out][rank], both of source type `type`.
int a2d_bench_upload_adapter(void* handle, int target, int layer, const void* a, const void* b, int type, char* error,
                             int size) {
  return guarded(error, size, [&] {
    if (target < 0 || target > static_cast<int>(AdapterTarget::down)) throw std::runtime_error("adapter target out of range");
    static_cast<DeviceModel*>(handle)->upload_adapter(static_cast<AdapterTarget>(target), layer,
                                                      WeightSource{a, static_cast<SourceType>(type), false},
                                                      WeightSource{b, static_cast<SourceType>(type), false});
  });
}

// times: context_s, upload_s, capture_s, weight_bytes
int a2d_bench_finish(void* handle, double* times, char* error, int size) {
  return guarded(error, size, [&] {
    DeviceModel* model = static_cast<DeviceModel*>(handle);
    model->finish_upload();
    const StartupTimes& t = model->startup();
    times[0] = t.context_s;
    times[1] = t.upload_s;
    times[2] = t.capture_s;
    times[3] = static_cast<double>(t.weight_bytes);
  });
}

// The options a run is timed under: ModelOptions and its GemmTuning (gemm.cuh), field for field; -1 keeps the
// engine's default. Mirrored by bench/cuda_check.py's BenchOptions, which sets struct_size to its own size.
struct BenchOptions {
  int struct_size;  // sizeof(BenchOptions): a caller built against another layout is refused
  int graphs, pdl;  // 0 or 1, not defaulted
  int loads, blocks_per_sm, small_loads, stage_ssq;
  int attention_trigger;  // ModelOptions::attention_early_trigger: 0 never, 1 at short KV, 2 always
  int attention_split_keys;
  int wide_from_rows, wide_min_tiles_per_sm, wide_split_blocks_per_sm, wide_split_chunks;
  int decode_prefill_gemm_rows;  // ModelOptions::decode_prefill_gemm_rows (0: never)
  int decode_prefill_pdl;        // ModelOptions::decode_prefill_pdl (0/1)
  int wgmma_cluster;             // GemmTuning::prefill_wgmma_cluster (0/1)
};

// Recaptures the model's graphs under `b` (every kernel enabled again, see a2d_bench_kernels).
int a2d_bench_reconfigure(void* handle, const BenchOptions* b, char* error, int size) {
  return guarded(error, size, [&] {
    if (b->struct_size != static_cast<int>(sizeof(BenchOptions))) {
      throw std::runtime_error("BenchOptions of " + std::to_string(b->struct_size) + " bytes, the harness's are " +
                               std::to_string(sizeof(BenchOptions)) +
                               ": update bench/cuda_check.py's BenchOptions to engine/bench/forward_bench.cu's");
    }
    if (b->attention_trigger > 2) throw std::runtime_error("attention_trigger: 0 never, 1 at short KV, 2 always");
    ModelOptions options;
    options.graphs = b->graphs != 0;
    options.pdl = b->pdl != 0;
    GemmTuning& g = options.gemm;
    if (b->loads >= 0) g.loads = b->loads;
    if (b->blocks_per_sm >= 0) g.blocks_per_sm = b->blocks_per_sm;
    if (b->small_loads >= 0) g.small_loads = b->small_loads;
    if (b->stage_ssq >= 0) g.stage_ssq = b->stage_ssq != 0;
    if (b->attention_trigger >= 0) options.attention_early_trigger = static_cast<AttentionTrigger>(b->attention_trigger);
    if (b->attention_split_keys >= 0) options.attention_split_keys = b->attention_split_keys != 0;
    if (b->wide_from_rows >= 0) g.wide_from_rows = b->wide_from_rows;
    if (b->wide_min_tiles_per_sm >= 0) g.wide_min_tiles_per_sm = b->wide_min_tiles_per_sm;
    if (b->wide_split_blocks_per_sm >= 0) g.wide_split_blocks_per_sm = b->wide_split_blocks_per_sm;
    if (b->wide_split_chunks >= 0) g.wide_split_chunks = b->wide_split_chunks;
    if (b->decode_prefill_gemm_rows >= 0) options.decode_prefill_gemm_rows = b->decode_prefill_gemm_rows;
    if (b->decode_prefill_pdl >= 0) options.decode_prefill_pdl = b->decode_prefill_pdl != 0;
    if (b->wgmma_cluster >= 0) g.prefill_wgmma_cluster = b->wgmma_cluster != 0;
    static_cast<DeviceModel*>(handle)->reconfigure(options);
  });
}

// Which kernels the captured forwards run (a2d_bench_kernels); 7 all.
int a2d_bench_kernels(void* handle, unsigned kernels, char* error, int size) {
  return guarded(error, size, [&] { run_only(static_cast<DeviceModel*>(handle), kernels); });
}

int a2d_bench_forward(void* handle, int cached, int commit, const int* tokens, int rows, const int* logit_rows,
                      int logit_count, float* logits, int* choice_tokens, float* choice_confidence, char* error,
                      int size) {
  return guarded(error, size, [&] {
    DeviceModel* model = static_cast<DeviceModel*>(handle);
    ForwardInputs in;
    in.cached = cached;
    in.commit = commit;
    in.tokens = tokens;
    in.rows = rows;
    in.logit_rows = logit_rows;
    in.logit_count = logit_count;
    in.write_logits = logits != nullptr;
    model->forward(in);
    std::vector<TokenChoice> choices(logit_count);
    if (logit_count > 0) model->copy_choices(choices.data(), logit_count);
    if (logits != nullptr && logit_count > 0) model->copy_logits(logits, 0, logit_count);
    model->synchronize();
    for (int i = 0; i < logit_count; ++i) {
      choice_tokens[i] = choices[i].token;
      choice_confidence[i] = choices[i].confidence;
    }
  });
}

// Microseconds per kernel of a captured graph of `count` empty dependent kernels (8 blocks each).
int a2d_bench_launch_overhead(int count, int pdl, double* us_per_kernel, char* error, int size) {
  return guarded(error, size, [&] {
    cudaStream_t stream;
    A2D_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    A2D_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < count; ++i) launch(empty_kernel, dim3(8), dim3(128), 0, stream, pdl != 0, i);
    A2D_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    A2D_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, stop;
    A2D_CUDA_CHECK(cudaEventCreate(&start));
    A2D_CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<double> times;
    for (int it = -3; it < 20; ++it) {
      A2D_CUDA_CHECK(cudaEventRecord(start, stream));
      A2D_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      A2D_CUDA_CHECK(cudaEventRecord(stop, stream));
      A2D_CUDA_CHECK(cudaStreamSynchronize(stream));
      float ms = 0;
      A2D_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (it >= 0) times.push_back(ms);
    }
    *us_per_kernel = median(times) * 1e3 / count;
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  });
}

int a2d_bench_fill_kv(void* handle, unsigned long long seed, char* error, int size) {
  return guarded(error, size, [&] {
    DeviceModel* model = static_cast<DeviceModel*>(handle);
    fill_random_kernel<<<2048, 256, 0, model->stream()>>>(model->kv_storage(), model->kv_storage_elements(), seed);
    A2D_CUDA_CHECK_LAUNCH();
    model->synchronize();
  });
}

// One forward per iteration as the decode loop runs it (state upload, graph replay, choices back).
// device_ms: CUDA events around the forward; step_ms: host wall time including the copy back.
int a2d_bench_time(void* handle, int cached, int commit, int rows, int logit_count, int iterations,
                   double* device_ms, double* step_ms, char* error, int size) {
  return guarded(error, size, [&] {
    DeviceModel* model = static_cast<DeviceModel*>(handle);
    const TimedForward forward(*model, cached, commit, rows, logit_count);
    const ForwardInputs& in = forward.in;
    std::vector<TokenChoice> choices(std::max(1, logit_count));
    cudaEvent_t start, stop;
    A2D_CUDA_CHECK(cudaEventCreate(&start));
    A2D_CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<double> device, wall;
    for (int it = -3; it < iterations; ++it) {
      const double t0 = now_s();
      A2D_CUDA_CHECK(cudaEventRecord(start, model->stream()));
      model->forward(in);
      A2D_CUDA_CHECK(cudaEventRecord(stop, model->stream()));
      if (logit_count > 0) model->copy_choices(choices.data(), logit_count);
      model->synchronize();
      const double t1 = now_s();
      float ms = 0;
      A2D_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (it >= 0) {
        device.push_back(ms);
        wall.push_back((t1 - t0) * 1e3);
      }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    *device_ms = median(device);
    *step_ms = median(wall);
  });
}

// The trace build's per-block records of one prompt's prefill call (DeviceModel::prefill of `rows` tokens on slot 0
// after `cached`; the warpgroup GEMM writes them, the mma.sync one does not), after one untraced call: records[]
// gets min(count, capacity) of them, count is what the call wrote. The model is reconfigured with the trace on and
// off again afterwards.
int a2d_bench_trace_prefill(void* handle, int cached, int rows, int capacity, void* records, int* count, char* error,
                            int size) {
  return guarded(error, size, [&] {
#if !defined(A2D_GEMM_TRACE)
    (void)handle, (void)cached, (void)rows, (void)capacity, (void)records, (void)count;
    throw std::runtime_error("this harness was built without A2D_GEMM_TRACE: stage it with TRACE=1 bash bench/stage-device.sh");
#else
    DeviceModel* model = static_cast<DeviceModel*>(handle);
    if (rows < 1 || rows > model->prefill_rows()) {
      throw std::runtime_error("rows must be 1.." + std::to_string(model->prefill_rows()) + " (the prefill call's capacity)");
    }
    std::vector<int32_t> tokens(rows);
    for (int i = 0; i < rows; ++i) tokens[i] = static_cast<int32_t>((int64_t(i) * 7919 + 13) % model->shape().vocab);
    with_gemm_trace(
        model, capacity, records, count, [&] { model->prefill(0, cached, tokens.data(), rows); },
        [&] { model->prefill(0, cached, tokens.data(), rows); }, [] {});
#endif
  });
}

// The trace build's per-block GEMM records (engine/cuda/trace.cuh) of one forward, run as a2d_bench_time
// runs it (three forwards before it warm up) with the kernels of a2d_bench_kernels' `kernels`: records[] gets
// min(count, capacity) of them; count is what the forward wrote. The model is recaptured with the trace on,
// and again without it afterwards (both running only those kernels).
int a2d_bench_trace(void* handle, unsigned kernels, int cached, int rows, int capacity, void* records, int* count,
                    char* error, int size) {
  return guarded(error, size, [&] {
#if !defined(A2D_GEMM_TRACE)
    (void)handle, (void)kernels, (void)cached, (void)rows, (void)capacity, (void)records, (void)count;
    throw std::runtime_error("this harness was built without A2D_GEMM_TRACE: stage it with TRACE=1 bash bench/stage-device.sh");
#else
    DeviceModel* model = static_cast<DeviceModel*>(handle);
    const TimedForward forward(*model, cached, 0, rows, rows);
    const ForwardInputs& in = forward.in;
    with_gemm_trace(
        model, capacity, records, count,
        [&] {
          run_only(model, kernels);
          for (int it = 0; it < 3; ++it) model->forward(in);
        },
        [&] { model->forward(in); }, [&] { run_only(model, kernels); });
#endif
  });
}

// The engine's real load path for a model folder: load_model (mmap + checks), then the CUDA backend
// (context, KV cache, upload, graph capture, warm-up). seconds: load_model_s, backend_s.
int a2d_bench_load_folder(const char* dir, double* seconds, char* error, int size) {
  return guarded(error, size, [&] {
    const double t0 = now_s();
    std::unique_ptr<a2d::Model> model = a2d::load_model(dir);
    const double t1 = now_s();
    std::unique_ptr<a2d::Backend> backend = a2d::make_cuda_backend(*model, a2d::BackendOptions{});
    const double t2 = now_s();
    seconds[0] = t1 - t0;
    seconds[1] = t2 - t1;
  });
}

namespace {

std::unique_ptr<a2d::Backend> make_backend(const a2d::Model& model, const char* device, int32_t max_batch = 1) {
  a2d::BackendOptions options;
  options.max_context = 8192;
  options.max_batch = max_batch;
  if (std::string(device) == "cuda") return a2d::make_cuda_backend(model, options);
  return a2d::make_cpu_backend(model, options);
}

}  // namespace

// Parity of the two backends through the Backend interface (the chunking of long commits included):
// one forward from an empty cache, logits of every row, row-major [n_commit + n_window][vocab].
int a2d_bench_backend_logits(const char* dir, const char* device, const int* commit, int n_commit, const int* window,
                             int n_window, float* logits, char* error, int size) {
  return guarded(error, size, [&] {
    std::unique_ptr<a2d::Model> model = a2d::load_model(dir);
    std::unique_ptr<a2d::Backend> backend = make_backend(*model, device);
    a2d::ForwardArgs args;
    args.commit.assign(commit, commit + n_commit);
    args.window.assign(window, window + n_window);
    for (int r = 0; r < n_commit + n_window; ++r) args.logit_rows.push_back(r);
    backend->forward(args, logits);
  });
}

// Continuous batching against alone through the Backend interface. Sequence e makes two forwards: its prompt
// (`first[e]` tokens, chunked when long) with a window of `width`, then a commit of `second[e]` tokens with another
// window. `tokens` holds, sequence after sequence, [prompt | window | commit | window]. The forwards run once with
// every sequence at a time on slots 0..n_seq-1 of one backend (forward_batch), once with each sequence alone on a
// backend of one slot; each writes, sequence after sequence, the logits of the first forward's window rows and of
// every row of the second, row-major [sum over e of (2 width + second[e])][vocab].
int a2d_bench_backend_batch_logits(const char* dir, const char* device, int n_seq, const int* first, const int* second,
                                   int width, const int* tokens, float* together, float* alone, char* error, int size) {
  return guarded(error, size, [&] {
    std::unique_ptr<a2d::Model> model = a2d::load_model(dir);
    const size_t vocab = static_cast<size_t>(model->config.vocab_size);
    std::vector<a2d::ForwardArgs> forwards(2 * static_cast<size_t>(n_seq));
    std::vector<size_t> offset(n_seq + 1, 0);  // row offset of sequence e in the output
    const int* at = tokens;
    for (int e = 0; e < n_seq; ++e) {
      for (int k = 0; k < 2; ++k) {
        a2d::ForwardArgs& args = forwards[2 * e + k];
        const int commit = k == 0 ? first[e] : second[e];
        args.commit.assign(at, at + commit);
        args.window.assign(at + commit, at + commit + width);
        at += commit + width;
        for (int r = k == 0 ? commit : 0; r < commit + width; ++r) args.logit_rows.push_back(r);
      }
      offset[e + 1] = offset[e] + forwards[2 * e].logit_rows.size() + forwards[2 * e + 1].logit_rows.size();
    }
    {
      std::unique_ptr<a2d::Backend> backend = make_backend(*model, device, n_seq);
      if (backend->max_batch() < n_seq) throw std::runtime_error("the backend holds fewer slots than sequences");
      std::vector<float> logits;
      for (int k = 0; k < 2; ++k) {
        std::vector<a2d::SlotForward> batch;
        size_t rows = 0;
        for (int e = 0; e < n_seq; ++e) {
          batch.push_back({e, &forwards[2 * e + k], nullptr});
          rows += forwards[2 * e + k].logit_rows.size();
        }
        logits.resize(rows * vocab);
        backend->forward_batch(batch, logits.data());
        size_t row = 0;
        for (int e = 0; e < n_seq; ++e) {
          const size_t n = forwards[2 * e + k].logit_rows.size();
          const size_t into = offset[e] + (k == 0 ? 0 : forwards[2 * e].logit_rows.size());
          std::copy_n(logits.data() + row * vocab, n * vocab, together + into * vocab);
          row += n;
        }
      }
    }
    for (int e = 0; e < n_seq; ++e) {
      std::unique_ptr<a2d::Backend> backend = make_backend(*model, device);
      backend->forward(forwards[2 * e], alone + offset[e] * vocab);
      backend->forward(forwards[2 * e + 1], alone + (offset[e] + forwards[2 * e].logit_rows.size()) * vocab);
    }
  });
}

// A greedy generation with the model's default decoding and the given block size and threshold.
int a2d_bench_backend_generate(const char* dir, const char* device, const int* prompt, int n_prompt, int max_tokens,
                               int block_size, double threshold, int* tokens, int* n_tokens, long long* forwards,
                               char* error, int size) {
  return guarded(error, size, [&] {
    std::unique_ptr<a2d::Model> model = a2d::load_model(dir);
    std::unique_ptr<a2d::Backend> backend = make_backend(*model, device);
    a2d::DecodeParams params = model->config.decoding;
    params.max_tokens = max_tokens;
    params.block_size = block_size;
    params.threshold = threshold;
    const a2d::GenerateResult result =
        a2d::generate(*backend, std::vector<int32_t>(prompt, prompt + n_prompt), params, nullptr, nullptr);
    *n_tokens = static_cast<int>(result.tokens.size());
    std::copy(result.tokens.begin(), result.tokens.end(), tokens);
    *forwards = result.forward_passes;
  });
}

}  // extern "C"
