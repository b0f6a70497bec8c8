// The prefill forward: a prompt chunk of up to kPrefillMaxRows commit rows, top to bottom, on the many-row
// kernels. The same model as enqueue_forward (model.cu) for causal rows: embed -> for each layer (norm, qkv
// with RoPE and the KV write, attention, o-proj + residual, norm, gate_up with SiLU, down + residual). No
// final norm or lm_head: a prompt's logits come from the forward of its last rows (cuda_backend.cu), and no
// mask adapter: it acts on window rows only. No graphs either: each kernel of a chunk runs for tens of
// microseconds or more, so launches cost little, and the chunk's row count fixes every grid.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "attention.cuh"
#include "attention_prefill.cuh"
#include "embed.cuh"
#include "gemm_prefill.cuh"
#include "model.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"

namespace a2d::cuda {

namespace {

template <typename T>
T* zeroed(size_t count, cudaStream_t stream) {
  void* pointer = nullptr;
  A2D_CUDA_CHECK(cudaMalloc(&pointer, std::max<size_t>(1, count) * sizeof(T)));
  A2D_CUDA_CHECK(cudaMemsetAsync(pointer, 0, std::max<size_t>(1, count) * sizeof(T), stream));
  return static_cast<T*>(pointer);
}

}  // namespace

void DeviceModel::allocate_prefill() {
  const ModelShape& s = shape_;
  // The many-row GEMM reads the bf16 tiled layout; an FP8 model's prompts go through the decode forwards
  // (prefill_rows() 0).
  if (s.fp8) {
    prefill_capacity_ = 0;
    return;
  }
  prefill_capacity_ = std::min(kPrefillMaxRows, s.max_context);
  const size_t rows = prefill_capacity_;
  prefill_residual_ = zeroed<float>(rows * s.hidden, stream_);
  prefill_normed_ = zeroed<bf16>(rows * s.hidden, stream_);
  if (!fused_rope_) prefill_qkv_ = zeroed<bf16>(rows * qkv_rows_, stream_);
  prefill_q_ = zeroed<bf16>(rows * s.heads * head_dim_padded_, stream_);
  prefill_attention_ = zeroed<bf16>(rows * s.heads * s.head_dim, stream_);
  prefill_act_ = zeroed<bf16>(rows * s.intermediate, stream_);
  prefill_tokens_ = zeroed<int32_t>(rows, stream_);
  A2D_CUDA_CHECK(cudaMallocHost(&prefill_tokens_host_, rows * sizeof(int32_t)));
  A2D_CUDA_CHECK(cudaMalloc(&prefill_state_, sizeof(StepState)));
  A2D_CUDA_CHECK(cudaMallocHost(&prefill_state_host_, sizeof(StepState)));
  std::memset(prefill_state_host_, 0, sizeof(StepState));
}

DeviceModel::PrefillLaunch DeviceModel::prefill_launch(const PrefillGemmParams& params) const {
  const GemmTuning& tuning = options_.gemm;
  PrefillLaunch launch;
  // TMA reads both operands: K and the input's row stride in 16-byte steps, both operands 16-byte aligned.
  const bool tma_fits = params.k % 8 == 0 && params.x_stride % 8 == 0 && reinterpret_cast<uintptr_t>(params.x) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(params.weight) % 16 == 0;
  launch.wgmma =
      tuning.prefill_wgmma && tma_fits && params.rows >= tuning.prefill_wgmma_min_rows && gemm_wgmma_available();
  launch.wgmma_tokens = tuning.prefill_wgmma_tokens > 0 ? tuning.prefill_wgmma_tokens : prefill_wgmma_tokens(params.rows, params.n_rows, tuning.sm_count);
  launch.shape = prefill_shape(params.rows, tuning.prefill_shape_by_rows);
  const int wgmma_wave = tuning.prefill_split_blocks_per_sm > 0 ? tuning.sm_count : 0;
  launch.split = launch.wgmma ? (tuning.prefill_wgmma_cluster
                                     ? prefill_wgmma_cluster_split(params.rows, params.n_rows, params.k, wgmma_wave,
                                                                   launch.wgmma_tokens)
                                     : prefill_wgmma_split(params.rows, params.n_rows, params.k, wgmma_wave,
                                                           launch.wgmma_tokens))
                              : prefill_split(params.rows, params.n_rows, params.k,
                                              tuning.prefill_split_blocks_per_sm * launch.shape.blocks_per_sm, tuning.sm_count,
                                              launch.shape);
  if (launch.wgmma && tuning.prefill_wgmma_stream && wgmma_wave > 0) {
    launch.split = prefill_wgmma_stream_split(params.rows, params.n_rows, params.k, wgmma_wave, launch.wgmma_tokens,
                                              launch.split, tuning.prefill_wgmma_stream_min_blocks);
  }
  return launch;
}

PrefillGemmParams DeviceModel::prefill_params(const bf16* weight, int n_rows, int n_out, int k, const bf16* x, int x_stride,
                                              int rows) {
  PrefillGemmParams g{};
  g.weight = weight;
  g.n_rows = n_rows;
  g.n_out = n_out;
  g.k = k;
  g.x = x;
  g.x_stride = x_stride;
  g.rows = rows;
  return g;
}

void DeviceModel::reserve_split(SplitScratch& scratch, const PrefillSplit& split, bool growable) {
  if ((split.steps_per_split == 0 && split.stream_blocks == 0) ||
      (split.partial_floats <= scratch.floats && split.counters <= scratch.count)) {
    return;
  }
  if (!growable) throw std::logic_error("prefill GEMM: a split larger than the scratch reserved before the graphs");
  // Grown between kernels of one stream: the launches before this one are done with the old scratch.
  A2D_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (scratch.partial != nullptr) A2D_CUDA_CHECK(cudaFree(scratch.partial));
  if (scratch.counters != nullptr) A2D_CUDA_CHECK(cudaFree(scratch.counters));
  scratch.floats = std::max(scratch.floats, split.partial_floats);
  scratch.count = std::max(scratch.count, split.counters);
  A2D_CUDA_CHECK(cudaMalloc(&scratch.partial, scratch.floats * sizeof(float)));
  scratch.counters = zeroed<int>(scratch.count, stream_);
}

void DeviceModel::prefill_gemm(PrefillGemmParams params, PrefillEpilogue epilogue) {
  prefill_gemm(params, epilogue, prefill_split_, true);
}

void DeviceModel::prefill_gemm(PrefillGemmParams params, PrefillEpilogue epilogue, SplitScratch& scratch, bool growable,
                               bool pdl) {
  const PrefillLaunch launch = prefill_launch(params);
  if (launch.split.steps_per_split > 0 || launch.split.stream_blocks > 0) {
    reserve_split(scratch, launch.split, growable);
    params.steps_per_split = launch.split.steps_per_split;
    params.partial = scratch.partial;
    params.counters = scratch.counters;
    params.cluster_splits = launch.split.cluster ? launch.split.splits : 0;
    params.stream_blocks = launch.split.stream_blocks;
  }
  if (launch.wgmma) return gemm_prefill_wgmma(params, epilogue, stream_, launch.wgmma_tokens, pdl);
  gemm_prefill(params, epilogue, stream_, launch.shape);  // the mma.sync kernel has no PDL wait: launched after the last
}

bool DeviceModel::decode_prefill_gemms_possible() const {
  // The warpgroup kernel only: the mma.sync one is slower than the decode GEMMs at these rows (bench/NOTES.md, run 116).
  return options_.decode_prefill_gemm_rows > 0 && fused_rope_ && !shape_.fp8 && shape_.adapter_rank == 0 &&
         options_.gemm.prefill_wgmma && gemm_wgmma_available();
}

bool DeviceModel::decode_on_prefill_gemms(int max_rows) const {
  // More than 8 rows: the decode forward's inputs are bf16 rows (enqueue_forward's `prenormalise`), which the
  // lm_head then reads.
  return decode_prefill_gemms_possible() && max_rows >= options_.decode_prefill_gemm_rows && max_rows > 8 &&
         max_rows <= prefill_capacity_;
}

// The splits of the four projections at every row bucket that runs on the prefill GEMMs, before any graph holds
// the scratch's address.
void DeviceModel::reserve_decode_prefill_splits() {
  const ModelShape& s = shape_;
  for (int bucket = 1; bucket <= row_bucket(forward_capacity_); ++bucket) {
    if (!decode_on_prefill_gemms(bucket_rows(bucket))) continue;
    if (layers_.empty()) return;
    // Layer 0's weights stand for every layer's: the plan reads their alignment, which the arena gives them all.
    const LayerWeights& L = layers_[0];
    const struct {
      const bf16* weight;
      int n_rows, k;
      const bf16* x;
    } gemms[] = {{L.qkv, qkv_rows_, s.hidden, normed_},
                 {L.o, s.hidden, s.heads * s.head_dim, attention_out_},
                 {L.gate_up, gate_up_rows_, s.hidden, normed_},
                 {L.down, s.hidden, s.intermediate, mlp_act_}};
    for (const auto& g : gemms) {
      reserve_split(decode_split_,
                    prefill_launch(prefill_params(g.weight, g.n_rows, g.n_rows, g.k, g.x, g.k, bucket_rows(bucket))).split,
                    true);
    }
  }
}

void DeviceModel::prefill(int slot, int cached, const int32_t* tokens, int rows) {
  const ModelShape& s = shape_;
  if (prefill_capacity_ == 0) throw std::runtime_error("prefill: the prefill kernels read bf16 weights; this model's are FP8");
  if (slot < 0 || slot >= slots_) throw std::runtime_error("prefill: slot out of range");
  if (rows < 1 || rows > prefill_capacity_) {
    throw std::runtime_error("prefill: rows must be 1.." + std::to_string(prefill_capacity_));
  }
  if (cached < 0 || int64_t(cached) + rows > s.max_context) {
    throw std::runtime_error("prefill: " + std::to_string(int64_t(cached) + rows) + " positions exceed the KV cache of " +
                             std::to_string(s.max_context));
  }
  for (int i = 0; i < rows; ++i) {
    if (tokens[i] < 0 || tokens[i] >= s.vocab) throw std::runtime_error("prefill: token id out of range");
  }
  // The previous forward's copies from the pinned buffers must be done before they are rewritten.
  A2D_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(prefill_tokens_host_, tokens, sizeof(int32_t) * rows);
  A2D_CUDA_CHECK(cudaMemcpyAsync(prefill_tokens_, prefill_tokens_host_, sizeof(int32_t) * rows, cudaMemcpyHostToDevice,
                                 stream_));
  StepState& state = *prefill_state_host_;  // what the rope kernel reads: commit rows at cached + t (of slot 0 of
  state.cached = cached;                    // the layer pointers below, which are the slot's)
  state.commit = rows;
  state.rows = rows;
  state.slot = 0;
  state.entries = 1;
  A2D_CUDA_CHECK(cudaMemcpyAsync(prefill_state_, prefill_state_host_, sizeof(StepState), cudaMemcpyHostToDevice, stream_));

  cudaStream_t st = stream_;
  // time_prefill: an event pair around each kernel, by kind.
  auto timed = [&](int kind, auto&& launch_kernel) {
    if (!prefill_timing_) return launch_kernel();
    PrefillEvent e{kind, nullptr, nullptr};
    A2D_CUDA_CHECK(cudaEventCreate(&e.start));
    A2D_CUDA_CHECK(cudaEventCreate(&e.stop));
    A2D_CUDA_CHECK(cudaEventRecord(e.start, st));
    launch_kernel();
    A2D_CUDA_CHECK(cudaEventRecord(e.stop, st));
    prefill_events_.push_back(e);
  };
  if (prefill_timing_) ++prefill_timed_calls_;
  // This slot's K and V of layer 0; a layer's slots lie one after another (model.cu, enqueue_forward).
  const int64_t kv_layer = int64_t(slots_) * kv_slot_elements_;
  bf16* k_cache = kv_cache_ + kv_slot_elements_ * slot;
  bf16* v_cache = kv_cache_ + kv_layer * s.layers + kv_slot_elements_ * slot;
  // `site`: which GEMM of the call (4 x layer + qkv 0, o 1, gate_up 2, down 3, as the decode forward's), for the
  // trace build's records (ModelOptions::gemm_trace).
  auto gemm_params = [&](const bf16* weight, int n_rows, int n_out, int k, const bf16* x, int x_stride, int site) {
    PrefillGemmParams g = prefill_params(weight, n_rows, n_out, k, x, x_stride, rows);
    g.trace = options_.gemm_trace;
    g.site = site;
    return g;
  };

  timed(PrefillTimes::embed_norms, [&] { embed_tokens(embed_, s.hidden, prefill_tokens_, rows, prefill_residual_, st); });
  for (int l = 0; l < s.layers; ++l) {
    const LayerWeights& L = layers_[l];
    bf16* layer_k = k_cache + kv_layer * l;
    bf16* layer_v = v_cache + kv_layer * l;

    timed(PrefillTimes::embed_norms, [&] { rmsnorm_prefill(prefill_residual_, s.hidden, L.input_norm, s.rms_eps, rows, prefill_normed_, st); });
    PrefillGemmParams qkv = gemm_params(L.qkv, qkv_rows_, qkv_rows_, s.hidden, prefill_normed_, s.hidden, 4 * l);
    qkv.bias = s.qkv_bias ? L.qkv_bias : nullptr;
    if (fused_rope_) {
      set_rope_epilogue(qkv, s, rope_table_, prefill_q_, layer_k, layer_v);
      qkv.cached = cached;
      timed(PrefillTimes::qkv, [&] { prefill_gemm(qkv, PrefillEpilogue::rope_qkv); });
    } else {
      // QK-norm or padded heads: the QKV rows in plain order, then the rope kernel (as enqueue_forward does).
      qkv.out = prefill_qkv_;
      qkv.out_stride = qkv_rows_;
      const RopeParams rp = rope_params(L, prefill_qkv_, prefill_state_, prefill_q_, layer_k, layer_v);
      timed(PrefillTimes::qkv, [&] {
        prefill_gemm(qkv, PrefillEpilogue::store_bf16);
        rope(rp, rows, st, false);
      });
    }

    if (options_.prefill_split_attention && rows <= kMaxRows) {
      // A short chunk: the decode forwards' attention (keys split over blocks, then the combine) on the chunk's
      // step state, whose rows are all commit rows of slot 0 of the layer pointers below; its partials are the
      // decode forwards', which this stream does not run meanwhile.
      const AttentionParams ap = attention_params(prefill_q_, layer_k, layer_v, prefill_state_,
                                                  attention_splits_[ceil_div(rows, 8)][0], prefill_attention_);
      timed(PrefillTimes::attention, [&] {
        attention(ap, rows, 1, st, false);
        attention_combine(ap, rows, st, false);
      });
    } else {
      PrefillAttentionParams ap{};
      set_attention_shape(ap, s, head_dim_padded_, prefill_q_, layer_k, layer_v);
      ap.cached = cached;
      ap.rows = rows;
      ap.out = prefill_attention_;
      timed(PrefillTimes::attention, [&] { attention_prefill(ap, st); });
    }

    PrefillGemmParams o =
        gemm_params(L.o, s.hidden, s.hidden, s.heads * s.head_dim, prefill_attention_, s.heads * s.head_dim, 4 * l + 1);
    o.bias = s.o_bias ? L.o_bias : nullptr;
    o.residual = prefill_residual_;
    o.out_stride = s.hidden;
    timed(PrefillTimes::o, [&] { prefill_gemm(o, PrefillEpilogue::residual_add); });

    timed(PrefillTimes::embed_norms, [&] { rmsnorm_prefill(prefill_residual_, s.hidden, L.post_norm, s.rms_eps, rows, prefill_normed_, st); });
    PrefillGemmParams gate_up =
        gemm_params(L.gate_up, gate_up_rows_, s.intermediate, s.hidden, prefill_normed_, s.hidden, 4 * l + 2);
    gate_up.out = prefill_act_;
    gate_up.out_stride = s.intermediate;
    timed(PrefillTimes::gate_up, [&] { prefill_gemm(gate_up, PrefillEpilogue::silu_mul); });

    PrefillGemmParams down =
        gemm_params(L.down, s.hidden, s.hidden, s.intermediate, prefill_act_, s.intermediate, 4 * l + 3);
    down.residual = prefill_residual_;
    down.out_stride = s.hidden;
    timed(PrefillTimes::down, [&] { prefill_gemm(down, PrefillEpilogue::residual_add); });
  }
}

void DeviceModel::release_prefill_events() {
  for (const PrefillEvent& e : prefill_events_) {
    cudaEventDestroy(e.start);
    cudaEventDestroy(e.stop);
  }
  prefill_events_.clear();
  prefill_timed_calls_ = 0;
}

void DeviceModel::time_prefill(bool on) {
  A2D_CUDA_CHECK(cudaStreamSynchronize(stream_));
  release_prefill_events();
  prefill_timing_ = on;
}

PrefillTimes DeviceModel::prefill_times() {
  A2D_CUDA_CHECK(cudaStreamSynchronize(stream_));
  PrefillTimes times;
  for (const PrefillEvent& e : prefill_events_) {
    float ms = 0;
    A2D_CUDA_CHECK(cudaEventElapsedTime(&ms, e.start, e.stop));
    times.ms[e.kind] += ms;
  }
  times.calls = prefill_timed_calls_;
  release_prefill_events();
  return times;
}

}  // namespace a2d::cuda
