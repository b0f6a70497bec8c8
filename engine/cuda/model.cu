#include "model.cuh"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>

#include "attention.cuh"
#include "attention_prefill.cuh"
#include "embed.cuh"
#include "gemm_prefill.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"

namespace a2d::cuda {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

size_t source_size(SourceType type) { return type == SourceType::f32 ? 4 : type == SourceType::f8_e4m3 ? 1 : 2; }

constexpr int64_t kAlignElements = 128;  // 256 bytes: every weight starts 16-byte aligned for the loads
int64_t aligned(int64_t elements) { return (elements + kAlignElements - 1) / kAlignElements * kAlignElements; }

// Zeroed on the model's stream: a plain cudaMemset goes to the legacy default stream, which does not order
// with the model's non-blocking stream, so a kernel could read the memory before it is cleared (memory that
// an earlier engine of the process freed holds its old bytes until then).
template <typename T>
T* device_alloc(size_t count, cudaStream_t stream) {
  void* pointer = nullptr;
  A2D_CUDA_CHECK(cudaMalloc(&pointer, count * sizeof(T)));
  A2D_CUDA_CHECK(cudaMemsetAsync(pointer, 0, count * sizeof(T), stream));
  return static_cast<T*>(pointer);
}

}  // namespace

DeviceModel::DeviceModel(const ModelShape& shape, const ModelOptions& options) : shape_(shape), options_(options) {
  const double started = now_s();
  int device_count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&device_count);
  if (probe != cudaSuccess || device_count == 0) {
    const std::string why = probe == cudaSuccess ? "no GPU found"
                            : probe == cudaErrorInsufficientDriver
                                ? "no NVIDIA driver (libcuda.so.1) new enough for CUDA 13 was found"
                                : cudaGetErrorString(probe);
    throw std::runtime_error("no CUDA device is available (" + why + "); load the model with device 'cpu' instead");
  }
  cudaDeviceProp properties{};
  A2D_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  if (properties.major < 9) {
    throw std::runtime_error(std::string("the CUDA backend is built for compute capability 9.0 (H100/H200); ") +
                             properties.name + " is " + std::to_string(properties.major) + "." +
                             std::to_string(properties.minor));
  }
  std::strncpy(device_name_, properties.name, sizeof(device_name_) - 1);
  sm_count_ = properties.multiProcessorCount;
  A2D_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  attention_prepare();
  attention_prefill_prepare();
  gemm_prefill_prepare();

  const ModelShape& s = shape_;
  if (s.heads % s.kv_heads != 0) throw std::runtime_error("num_attention_heads must be a multiple of num_key_value_heads");
  if (s.hidden % 8 != 0 || s.intermediate % 8 != 0 || (s.heads * s.head_dim) % 8 != 0) {
    throw std::runtime_error("the CUDA backend needs hidden_size, intermediate_size and heads*head_dim to be multiples of 8");
  }
  head_dim_padded_ = s.head_dim <= 32 ? 32 : (s.head_dim <= 64 ? 64 : 128);
  fused_rope_ = options.fuse_rope && !s.qk_norm && s.head_dim == head_dim_padded_ && s.head_dim % 16 == 0;
  if (s.head_dim > 128) throw std::runtime_error("the CUDA backend supports head_dim up to 128, got " + std::to_string(s.head_dim));
  qkv_rows_ = (s.heads + 2 * s.kv_heads) * s.head_dim;
  gate_up_rows_ = ceil_div(s.intermediate, 8) * 16;
  hidden_tiles_ = ceil_div(s.hidden, kGemmTileRows);
  vocab_tiles_ = ceil_div(s.vocab, kGemmTileRows);
  const int group = s.heads / s.kv_heads;
  forward_capacity_ = options.max_forward_rows > kMaxRows && decode_prefill_gemms_possible()
                          ? bucket_rows(row_bucket(std::min(options.max_forward_rows, kMaxForwardRows)))
                          : kMaxRows;
  attention_row_capacity_ = forward_capacity_ * group;
  if (s.adapter_rank > 0 && s.fp8) {
    throw std::runtime_error("the CUDA backend runs a row adapter (a2d.mask_adapter / a2d.window_adapter) on bf16 weights "
                             "only; serve the bf16 model, or this FP8 one on the CPU backend");
  }

  // Weights. A row adapter's factors A ride their GEMM's weight as extra tiles (gemm_rows).
  const int64_t H = s.hidden;
  // GEMM weights are tiled (weights.cuh); a tied lm_head gets its own tiled copy of the embedding. An FP8
  // model's GEMM weights are e4m3 bytes and fp32 row scales, carved from the same arena.
  const bool fp8_head = s.fp8 && !s.tied_embeddings;
  auto gemm_elements = [&](bool fp8, int64_t rows, int64_t cols) {
    return fp8 ? aligned((tiled_fp8_bytes(rows, cols) + 1) / 2) + aligned(2 * rows) : aligned(tiled_elements(rows, cols));
  };
  int64_t total = aligned(int64_t(s.vocab) * H) + gemm_elements(fp8_head, s.vocab, H) + aligned(H);
  const int64_t per_layer = gemm_elements(s.fp8, gemm_rows(qkv_rows_, site_rank(kQkvSite)), H) + aligned(qkv_rows_) +
                            gemm_elements(s.fp8, gemm_rows(H, site_rank(kOSite)), s.heads * s.head_dim) + aligned(H) +
                            gemm_elements(s.fp8, gemm_rows(gate_up_rows_, site_rank(kGateUpSite)), H) +
                            gemm_elements(s.fp8, gemm_rows(H, site_rank(kDownSite)), s.intermediate) +
                            2 * aligned(H) + 2 * aligned(s.head_dim);
  total += per_layer * s.layers;
  weight_arena_elements_ = total;
  weight_arena_ = device_alloc<bf16>(total, stream_);
  embed_ = allocate_weight(int64_t(s.vocab) * H);
  if (fp8_head) {
    lm_head_fp8_ = allocate_fp8(s.vocab, H);
  } else {
    lm_head_ = allocate_weight(tiled_elements(s.vocab, H));
  }
  final_norm_ = allocate_weight(H);
  layers_.resize(s.layers);
  for (LayerWeights& L : layers_) {
    if (s.fp8) {
      L.qkv_fp8 = allocate_fp8(qkv_rows_, H);
      L.o_fp8 = allocate_fp8(H, s.heads * s.head_dim);
      L.gate_up_fp8 = allocate_fp8(gate_up_rows_, H);
      L.down_fp8 = allocate_fp8(H, s.intermediate);
    } else {
      L.qkv = allocate_weight(tiled_elements(gemm_rows(qkv_rows_, site_rank(kQkvSite)), H));
      L.o = allocate_weight(tiled_elements(gemm_rows(H, site_rank(kOSite)), s.heads * s.head_dim));
      L.gate_up = allocate_weight(tiled_elements(gemm_rows(gate_up_rows_, site_rank(kGateUpSite)), H));
      L.down = allocate_weight(tiled_elements(gemm_rows(H, site_rank(kDownSite)), s.intermediate));
    }
    L.qkv_bias = allocate_weight(qkv_rows_);
    L.o_bias = allocate_weight(H);
    L.input_norm = allocate_weight(H);
    L.post_norm = allocate_weight(H);
    L.q_norm = allocate_weight(s.head_dim);
    L.k_norm = allocate_weight(s.head_dim);
  }
  startup_.weight_bytes = weight_arena_elements_ * 2;
  allocate_adapters();

  if (s.kv_slots < 1 || s.kv_slots > kMaxRows) throw std::runtime_error("kv_slots must be 1.." + std::to_string(kMaxRows));
  rope_table_ = device_alloc<float2>(size_t(s.max_context) * (s.head_dim / 2), stream_);
  fill_rope_table(rope_table_, s.max_context, s.head_dim, s.rope_theta, stream_);

  // Activations of one forward, sized for forward_capacity_ rows (the decode GEMMs' sums of squares and the
  // adapter's t for kMaxRows: larger forwards run on the prefill GEMMs).
  const int row_buckets = row_bucket(forward_capacity_);
  for (int bucket = 1; bucket <= row_buckets; ++bucket) {
    for (int e = 0; e < kEntryBuckets; ++e) {
      attention_splits_[bucket][e] = attention_max_splits(bucket_rows(bucket), 1 << e, s.heads, s.kv_heads, sm_count_,
                                                          options.attention_typical_blocks);
    }
  }
  const size_t R = forward_capacity_;
  A2D_CUDA_CHECK(cudaMalloc(&state_, sizeof(StepState)));
  A2D_CUDA_CHECK(cudaMallocHost(&state_host_, sizeof(StepState)));
  std::memset(state_host_, 0, sizeof(StepState));
  residual_ = device_alloc<float>(R * H, stream_);
  ssq_attention_ = device_alloc<float>(size_t(hidden_tiles_) * kMaxRows, stream_);
  // The embedding writes one part of every row's sum (embed.cuh), whatever the path.
  ssq_layer_ = device_alloc<float>(std::max(size_t(hidden_tiles_) * kMaxRows, R), stream_);
  qkv_out_ = device_alloc<bf16>(size_t(kMaxRows) * qkv_rows_, stream_);
  q_roped_ = device_alloc<bf16>(R * s.heads * head_dim_padded_, stream_);
  attention_out_ = device_alloc<bf16>(R * s.heads * s.head_dim, stream_);
  mlp_act_ = device_alloc<bf16>(R * s.intermediate, stream_);
  normed_ = device_alloc<bf16>(R * H, stream_);
  // Splits x KV heads x rows: the largest over the buckets, each bucket's grid covers rows up to its size.
  size_t partial_slots = 0;
  for (int bucket = 1; bucket <= row_buckets; ++bucket) {
    for (int e = 0; e < kEntryBuckets; ++e) {
      partial_slots = std::max(partial_slots, size_t(attention_splits_[bucket][e]) * s.kv_heads * attention_row_capacity_);
    }
  }
  attention_partial_o_ = device_alloc<float>(partial_slots * head_dim_padded_, stream_);
  attention_partial_ml_ = device_alloc<float2>(partial_slots, stream_);
  logits_ = device_alloc<float>(R * s.vocab, stream_);
  argmax_partials_ = device_alloc<ArgmaxPartial>(size_t(ceil_div(forward_capacity_, kMaxRows)) * vocab_tiles_ * kMaxRows, stream_);
  choices_ = device_alloc<TokenChoice>(R, stream_);
  options_.gemm.sm_count = sm_count_;
  gemm_split_counters_ = device_alloc<unsigned>(
      size_t(std::max({vocab_tiles_, gemm_rows(H, std::max(site_rank(kOSite), site_rank(kDownSite))) / kGemmTileRows,
                       gemm_rows(qkv_rows_, site_rank(kQkvSite)) / kGemmTileRows,
                       gemm_rows(gate_up_rows_, site_rank(kGateUpSite)) / kGemmTileRows})),
      stream_);
  prepare_gemm_scratch();
  allocate_prefill();

  for (int i = 0; i < 2; ++i) {
    A2D_CUDA_CHECK(cudaMallocHost(&staging_host_[i], kStagingBytes));
    A2D_CUDA_CHECK(cudaMalloc(&staging_device_[i], kStagingBytes));
    A2D_CUDA_CHECK(cudaEventCreateWithFlags(&staging_free_[i], cudaEventDisableTiming));
  }

  // KV cache for the whole context, last: as many slots as were asked for and fit beside everything above, leaving
  // room for the graphs that follow and some to spare (a GPU shared with other processes).
  kv_slot_elements_ = int64_t(s.kv_heads) * s.max_context * head_dim_padded_;
  const size_t slot_bytes = size_t(2) * s.layers * (kv_slot_elements_ * sizeof(bf16)) + size_t(s.vocab) * sizeof(float);
  size_t free_bytes = 0, total_bytes = 0;
  A2D_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t reserve = (size_t(1) << 30) + total_bytes / 32;
  const size_t fitting = free_bytes > reserve ? (free_bytes - reserve) / slot_bytes : 0;
  slots_ = static_cast<int>(std::max<size_t>(1, std::min<size_t>(s.kv_slots, fitting)));
  kv_elements_ = int64_t(2) * s.layers * slots_ * kv_slot_elements_;
  kv_cache_ = device_alloc<bf16>(kv_elements_, stream_);
  anchor_logits_ = device_alloc<float>(size_t(slots_) * s.vocab, stream_);
  A2D_CUDA_CHECK(cudaStreamSynchronize(stream_));
  startup_.context_s = now_s() - started;
}

DeviceModel::~DeviceModel() {
  // Errors are ignored here: a destructor must not throw, and the process may be tearing down the context.
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  release_prefill_events();
  for (auto& bucket : graphs_) {
    for (CapturedForward& captured : bucket) {
      if (captured.exec != nullptr) cudaGraphExecDestroy(captured.exec);
      if (captured.graph != nullptr) cudaGraphDestroy(captured.graph);
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (staging_host_[i] != nullptr) cudaFreeHost(staging_host_[i]);
    if (staging_device_[i] != nullptr) cudaFree(staging_device_[i]);
    if (staging_free_[i] != nullptr) cudaEventDestroy(staging_free_[i]);
  }
  for (void* pointer : {static_cast<void*>(weight_arena_), static_cast<void*>(kv_cache_),
                        static_cast<void*>(rope_table_), static_cast<void*>(state_), static_cast<void*>(residual_),
                        static_cast<void*>(ssq_attention_), static_cast<void*>(ssq_layer_),
                        static_cast<void*>(qkv_out_), static_cast<void*>(q_roped_),
                        static_cast<void*>(attention_out_), static_cast<void*>(mlp_act_), static_cast<void*>(normed_),
                        static_cast<void*>(attention_partial_o_), static_cast<void*>(attention_partial_ml_),
                        static_cast<void*>(logits_), static_cast<void*>(anchor_logits_),
                        static_cast<void*>(argmax_partials_), static_cast<void*>(choices_),
                        static_cast<void*>(gemm_split_partials_), static_cast<void*>(gemm_split_counters_),
                        static_cast<void*>(prefill_residual_), static_cast<void*>(prefill_normed_),
                        static_cast<void*>(prefill_qkv_), static_cast<void*>(prefill_q_),
                        static_cast<void*>(prefill_attention_), static_cast<void*>(prefill_act_),
                        static_cast<void*>(prefill_tokens_), static_cast<void*>(prefill_state_),
                        static_cast<void*>(prefill_split_.partial), static_cast<void*>(prefill_split_.counters),
                        static_cast<void*>(decode_split_.partial), static_cast<void*>(decode_split_.counters)}) {
    if (pointer != nullptr) cudaFree(pointer);
  }
  for (auto& sites : adapters_) {
    for (AdapterSite& site : sites) {
      if (site.b != nullptr) cudaFree(site.b);
      if (site.offset != nullptr) cudaFree(site.offset);
      if (site.t != nullptr) cudaFree(site.t);
    }
  }
  if (state_host_ != nullptr) cudaFreeHost(state_host_);
  if (prefill_tokens_host_ != nullptr) cudaFreeHost(prefill_tokens_host_);
  if (prefill_state_host_ != nullptr) cudaFreeHost(prefill_state_host_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

bf16* DeviceModel::allocate_weight(int64_t elements) {
  bf16* pointer = weight_arena_ + weight_arena_used_;
  weight_arena_used_ += aligned(elements);
  if (weight_arena_used_ > weight_arena_elements_) throw std::logic_error("weight arena overflow");
  return pointer;
}

DeviceModel::Fp8Weight DeviceModel::allocate_fp8(int64_t rows, int64_t cols) {
  Fp8Weight w;
  w.data = reinterpret_cast<uint8_t*>(allocate_weight((tiled_fp8_bytes(rows, cols) + 1) / 2));
  w.scale = reinterpret_cast<float*>(allocate_weight(2 * rows));
  return w;
}

// `convert(chunk, first_row, count)` places rows first_row.. of a source from device memory: the whole source at
// once when it is on the device; from a host source, row chunks copied into pinned memory (the CPU copy of one
// chunk overlaps the DMA and the conversion of the previous one).
void DeviceModel::stage_rows(const void* source, bool on_device, size_t row_bytes, int64_t rows,
                             const std::function<void(const void*, int64_t, int64_t)>& convert) {
  if (upload_started_ < 0) upload_started_ = now_s();
  if (on_device) return convert(source, 0, rows);
  const int64_t chunk_rows = std::max<int64_t>(1, int64_t(kStagingBytes / row_bytes));
  if (row_bytes > kStagingBytes) throw std::runtime_error("a weight row is larger than the staging buffer");
  const char* bytes = static_cast<const char*>(source);
  for (int64_t row = 0; row < rows; row += chunk_rows) {
    const int64_t count = std::min(chunk_rows, rows - row);
    const int slot = staging_next_;
    staging_next_ = 1 - staging_next_;
    A2D_CUDA_CHECK(cudaEventSynchronize(staging_free_[slot]));
    std::memcpy(staging_host_[slot], bytes + size_t(row) * row_bytes, size_t(count) * row_bytes);
    A2D_CUDA_CHECK(cudaMemcpyAsync(staging_device_[slot], staging_host_[slot], size_t(count) * row_bytes,
                                   cudaMemcpyHostToDevice, stream_));
    convert(staging_device_[slot], row, count);
    A2D_CUDA_CHECK(cudaEventRecord(staging_free_[slot], stream_));
  }
}

void DeviceModel::place(const WeightSource& source, int64_t rows, int64_t cols, bf16* destination,
                        RowPlacement placement, bool tiled) {
  if (source.type == SourceType::f8_e4m3) {
    throw std::runtime_error("upload: e4m3 weights for a tensor this model holds in bf16 (only an FP8 model's "
                             "projections and untied lm_head are e4m3)");
  }
  stage_rows(source.data, source.on_device, size_t(cols) * source_size(source.type), rows,
             [&](const void* chunk, int64_t first_row, int64_t count) {
               RowPlacement at = placement;  // the kernel indexes the chunk from its first row; source_row0 shifts it
               at.source_row0 = first_row;
               convert_rows(chunk, source.type, count, cols, destination, at, tiled, stream_);
             });
}

void DeviceModel::place_fp8(const WeightSource& source, int64_t rows, int64_t cols, const Fp8Weight& destination,
                            RowPlacement placement) {
  if (source.type != SourceType::f8_e4m3 || source.scale == nullptr) {
    throw std::runtime_error("upload: an FP8 model's projections and lm_head are e4m3 weights with their row scales "
                             "(make the model with `python -m a2d_convert quantize`)");
  }
  auto at = [&](int64_t first_row) {
    RowPlacement shifted = placement;
    shifted.source_row0 = first_row;
    return shifted;
  };
  stage_rows(source.data, source.on_device, size_t(cols), rows, [&](const void* chunk, int64_t first_row, int64_t count) {
    place_fp8_rows(chunk, count, cols, destination.data, at(first_row), stream_);
  });
  stage_rows(source.scale, source.on_device, sizeof(float), rows, [&](const void* chunk, int64_t first_row, int64_t count) {
    place_scales(chunk, count, destination.scale, at(first_row), stream_);
  });
}

void DeviceModel::upload(WeightName name, int layer, const WeightSource& source) {
  const ModelShape& s = shape_;
  const int64_t H = s.hidden, D = s.head_dim;
  const bool per_layer = name != WeightName::embed && name != WeightName::lm_head && name != WeightName::final_norm;
  if (per_layer && (layer < 0 || layer >= s.layers)) throw std::runtime_error("upload: layer out of range");
  LayerWeights* L = per_layer ? &layers_[layer] : nullptr;
  // q, k and v rows (and biases) in the fused QKV matrix (row_placement.h).
  auto qkv = [&](QkvPart part) { return qkv_rows(part, s.heads, s.kv_heads, D, fused_rope_); };
  // A GEMM weight: bf16 tiled, or in an FP8 model e4m3 in the FP8 layout with its scales.
  auto place_gemm = [&](int64_t rows, int64_t cols, bf16* bf16_weight, const Fp8Weight& fp8_weight, RowPlacement placement) {
    if (fp8_weight.data != nullptr) return place_fp8(source, rows, cols, fp8_weight, placement);
    place(source, rows, cols, bf16_weight, placement, true);
  };
  switch (name) {
    case WeightName::embed:
      place(source, s.vocab, H, embed_, contiguous_rows(0), false);
      if (s.tied_embeddings) place(source, s.vocab, H, lm_head_, contiguous_rows(0), true);
      return;
    case WeightName::lm_head:
      if (s.tied_embeddings) throw std::runtime_error("upload: lm_head of a model with tied embeddings");
      return place_gemm(s.vocab, H, lm_head_, lm_head_fp8_, contiguous_rows(0));
    case WeightName::final_norm: return place(source, 1, H, final_norm_, contiguous_rows(0), false);
    case WeightName::input_norm: return place(source, 1, H, L->input_norm, contiguous_rows(0), false);
    case WeightName::post_norm: return place(source, 1, H, L->post_norm, contiguous_rows(0), false);
    case WeightName::q: return place_gemm(s.heads * D, H, L->qkv, L->qkv_fp8, qkv(QkvPart::q));
    case WeightName::k: return place_gemm(s.kv_heads * D, H, L->qkv, L->qkv_fp8, qkv(QkvPart::k));
    case WeightName::v: return place_gemm(s.kv_heads * D, H, L->qkv, L->qkv_fp8, qkv(QkvPart::v));
    case WeightName::q_bias: return place(source, s.heads * D, 1, L->qkv_bias, qkv(QkvPart::q), false);
    case WeightName::k_bias: return place(source, s.kv_heads * D, 1, L->qkv_bias, qkv(QkvPart::k), false);
    case WeightName::v_bias: return place(source, s.kv_heads * D, 1, L->qkv_bias, qkv(QkvPart::v), false);
    case WeightName::o: return place_gemm(H, s.heads * D, L->o, L->o_fp8, contiguous_rows(0));
    case WeightName::o_bias: return place(source, H, 1, L->o_bias, contiguous_rows(0), false);
    case WeightName::q_norm: return place(source, 1, D, L->q_norm, contiguous_rows(0), false);
    case WeightName::k_norm: return place(source, 1, D, L->k_norm, contiguous_rows(0), false);
    case WeightName::gate: return place_gemm(s.intermediate, H, L->gate_up, L->gate_up_fp8, gate_up_rows(false));
    case WeightName::up: return place_gemm(s.intermediate, H, L->gate_up, L->gate_up_fp8, gate_up_rows(true));
    case WeightName::down: return place_gemm(H, s.intermediate, L->down, L->down_fp8, contiguous_rows(0));
  }
}

namespace {

int site_of(AdapterTarget target) {
  switch (target) {
    case AdapterTarget::q:
    case AdapterTarget::k:
    case AdapterTarget::v: return 0;
    case AdapterTarget::o: return 1;
    case AdapterTarget::gate:
    case AdapterTarget::up: return 2;
    case AdapterTarget::down: return 3;
  }
  return 0;
}

// A stored tensor's values as bf16 bits (round to nearest even), on the host.
std::vector<uint16_t> host_bf16(const WeightSource& source, size_t count) {
  std::vector<uint16_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    float value;
    switch (source.type) {
      case SourceType::bf16: out[i] = static_cast<const uint16_t*>(source.data)[i]; continue;
      case SourceType::f16: value = __half2float(static_cast<const __half*>(source.data)[i]); break;
      case SourceType::f32: value = static_cast<const float*>(source.data)[i]; break;
    }
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    out[i] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
  return out;
}

}  // namespace

int DeviceModel::site_rank(int site) const {
  const ModelShape& s = shape_;
  int total = 0;
  for (int t = 0; t < 7; ++t) {
    if (((s.adapter_targets >> t) & 1u) && site_of(static_cast<AdapterTarget>(t)) == site) total += s.adapter_rank;
  }
  return total;
}

bf16* DeviceModel::site_weight(int layer, int site) const {
  const LayerWeights& L = layers_[layer];
  return site == kQkvSite ? L.qkv : site == kOSite ? L.o : site == kGateUpSite ? L.gate_up : L.down;
}

void DeviceModel::allocate_adapters() {
  const ModelShape& s = shape_;
  if (s.adapter_rank <= 0) return;
  const int n_rows[kSites] = {qkv_rows_, s.hidden, gate_up_rows_, s.hidden};
  adapters_.resize(s.layers);
  for (auto& sites : adapters_) {
    for (int i = 0; i < kSites; ++i) {
      AdapterSite& site = sites[i];
      site.total_rank = site_rank(i);
      if (site.total_rank == 0) continue;
      site.n_rows = n_rows[i];
      site.b = device_alloc<bf16>(size_t(site.n_rows) * s.adapter_rank, stream_);
      site.offset = device_alloc<int>(site.n_rows, stream_);
      site.t = device_alloc<unsigned long long>(size_t(kMaxRows) * site.total_rank, stream_);
      site.host_b.assign(size_t(site.n_rows) * s.adapter_rank, 0);
      site.host_offset.assign(site.n_rows, 0);
      startup_.weight_bytes += int64_t(site.n_rows) * s.adapter_rank * 2;
    }
  }
}

void DeviceModel::upload_adapter(AdapterTarget target, int layer, const WeightSource& a, const WeightSource& b) {
  const ModelShape& s = shape_;
  const int R = s.adapter_rank;
  if (R <= 0 || !((s.adapter_targets >> static_cast<int>(target)) & 1u)) {
    throw std::runtime_error("upload_adapter: the model's shape announces no adapter on this projection");
  }
  if (layer < 0 || layer >= s.layers) throw std::runtime_error("upload_adapter: layer out of range");
  if (a.on_device || b.on_device) throw std::runtime_error("upload_adapter: the factors must be in host memory");
  if (upload_started_ < 0) upload_started_ = now_s();
  const int site_index = site_of(target);
  AdapterSite& site = adapters_[layer][site_index];
  // This target's place in its site: after the site's other targets that come before it.
  int offset = 0;
  for (int t = 0; t < static_cast<int>(target); ++t) {
    if (site_of(static_cast<AdapterTarget>(t)) == site_index && ((s.adapter_targets >> t) & 1u)) offset += R;
  }
  // b's rows in its GEMM's row order, as upload places the GEMM's own rows; a's after the GEMM's tiles.
  const int64_t D = s.head_dim;
  int64_t out_rows = 0, in = 0;
  RowPlacement placement = contiguous_rows(0);
  switch (target) {
    case AdapterTarget::q: out_rows = s.heads * D; in = s.hidden; placement = qkv_rows(QkvPart::q, s.heads, s.kv_heads, D, fused_rope_); break;
    case AdapterTarget::k: out_rows = s.kv_heads * D; in = s.hidden; placement = qkv_rows(QkvPart::k, s.heads, s.kv_heads, D, fused_rope_); break;
    case AdapterTarget::v: out_rows = s.kv_heads * D; in = s.hidden; placement = qkv_rows(QkvPart::v, s.heads, s.kv_heads, D, fused_rope_); break;
    case AdapterTarget::o: out_rows = s.hidden; in = s.heads * D; break;
    case AdapterTarget::down: out_rows = s.hidden; in = s.intermediate; break;
    case AdapterTarget::gate: out_rows = s.intermediate; in = s.hidden; placement = gate_up_rows(false); break;
    case AdapterTarget::up: out_rows = s.intermediate; in = s.hidden; placement = gate_up_rows(true); break;
  }
  const int64_t a_row0 = int64_t(ceil_div(site.n_rows, kGemmTileRows)) * kGemmTileRows + offset;
  place(a, R, in, site_weight(layer, site_index), contiguous_rows(a_row0), true);
  const std::vector<uint16_t> b_bits = host_bf16(b, size_t(out_rows) * R);
  for (int64_t r = 0; r < out_rows; ++r) {
    const int64_t row = placed_row(placement, r);
    std::memcpy(&site.host_b[size_t(row) * R], &b_bits[size_t(r) * R], size_t(R) * 2);
    site.host_offset[row] = offset;
  }
}

void DeviceModel::finish_upload() {
  for (auto& sites : adapters_) {
    for (AdapterSite& site : sites) {
      if (site.total_rank == 0) continue;
      A2D_CUDA_CHECK(cudaMemcpy(site.b, site.host_b.data(), site.host_b.size() * 2, cudaMemcpyHostToDevice));
      A2D_CUDA_CHECK(cudaMemcpy(site.offset, site.host_offset.data(), site.host_offset.size() * sizeof(int),
                                cudaMemcpyHostToDevice));
      site.host_b = {};
      site.host_offset = {};
    }
  }
  A2D_CUDA_CHECK(cudaStreamSynchronize(stream_));
  startup_.upload_s = upload_started_ < 0 ? 0 : now_s() - upload_started_;
  for (int i = 0; i < 2; ++i) {
    A2D_CUDA_CHECK(cudaFreeHost(staging_host_[i]));
    A2D_CUDA_CHECK(cudaFree(staging_device_[i]));
    staging_host_[i] = staging_device_[i] = nullptr;
  }
  capture_graphs();
}

void DeviceModel::reconfigure(const ModelOptions& options) {
  synchronize();
  destroy_graphs();
  options_ = options;
  options_.gemm.sm_count = sm_count_;
  prepare_gemm_scratch();
  capture_graphs();
}

// Split-K partials for the largest of the forward's GEMMs under the current tuning.
void DeviceModel::prepare_gemm_scratch() {
  const ModelShape& s = shape_;
  const struct {
    int rows, k;
    bool fp8;
    int adapter_tiles;
  } shapes[] = {{qkv_rows_, s.hidden, s.fp8, adapter_tile_count(site_rank(kQkvSite))},
                {s.hidden, s.heads * s.head_dim, s.fp8, adapter_tile_count(site_rank(kOSite))},
                {gate_up_rows_, s.hidden, s.fp8, adapter_tile_count(site_rank(kGateUpSite))},
                {s.hidden, s.intermediate, s.fp8, adapter_tile_count(site_rank(kDownSite))},
                {s.vocab, s.hidden, s.fp8 && !s.tied_embeddings, 0}};
  size_t needed = 0;
  for (const auto& shape : shapes) {
    for (int bucket = 1; bucket <= kMaxRows / 8; ++bucket) {
      needed = std::max(needed, gemm_plan(shape.rows, shape.k, bucket * 8, options_.gemm, shape.fp8, shape.adapter_tiles)
                                    .scratch_floats);
    }
  }
  if (needed <= gemm_split_floats_) return;
  if (gemm_split_partials_ != nullptr) A2D_CUDA_CHECK(cudaFree(gemm_split_partials_));
  gemm_split_partials_ = device_alloc<float>(needed, stream_);
  gemm_split_floats_ = needed;
}

void DeviceModel::capture_graphs() {
  reserve_decode_prefill_splits();
  if (!options_.graphs) return;
  const double started = now_s();
  for (int bucket = 1; bucket <= kRowBuckets; ++bucket) {
    for (int entries = 0; entries < kEntryBuckets; ++entries) {
      if (captures(bucket, entries)) capture_graph(bucket, entries);
    }
  }
  startup_.capture_s = now_s() - started;
}

void DeviceModel::destroy_graphs() {
  for (auto& bucket : graphs_) {
    for (CapturedForward& captured : bucket) {
      if (captured.exec != nullptr) A2D_CUDA_CHECK(cudaGraphExecDestroy(captured.exec));
      if (captured.graph != nullptr) A2D_CUDA_CHECK(cudaGraphDestroy(captured.graph));
      captured = CapturedForward{};
    }
  }
}

AttentionParams DeviceModel::attention_params(const bf16* q, const bf16* k_cache, const bf16* v_cache, const StepState* state,
                                              int max_splits, bf16* out) const {
  AttentionParams ap{};
  set_attention_shape(ap, shape_, head_dim_padded_, q, k_cache, v_cache);
  ap.kv_slot_stride = size_t(kv_slot_elements_);
  ap.state = state;
  ap.max_splits = max_splits;
  ap.row_capacity = attention_row_capacity_;
  ap.partial_o = attention_partial_o_;
  ap.partial_ml = attention_partial_ml_;
  ap.out = out;
  ap.early_trigger = AttentionTrigger::never;
  ap.split_keys = options_.attention_split_keys;
  ap.warp_combine = options_.attention_warp_combine;
  ap.prefetch_cached = options_.attention_prefetch;
  ap.revealed_rule_mask_token = -1;
  return ap;
}

RopeParams DeviceModel::rope_params(const LayerWeights& L, const bf16* qkv, const StepState* state, bf16* q_out,
                                    bf16* k_cache, bf16* v_cache) const {
  const ModelShape& s = shape_;
  RopeParams rp{};
  set_rope_epilogue(rp, s, rope_table_, q_out, k_cache, v_cache);
  rp.qkv = qkv;
  rp.head_dim_padded = head_dim_padded_;
  rp.q_norm = s.qk_norm ? L.q_norm : nullptr;
  rp.k_norm = s.qk_norm ? L.k_norm : nullptr;
  rp.norm_eps = s.rms_eps;
  rp.state = state;
  rp.kv_slot_stride = size_t(kv_slot_elements_);
  return rp;
}

// The whole forward, top to bottom. Kernels read the row count and positions from state_, so one
// enqueue (or one captured graph) serves every forward of up to max_rows rows.
void DeviceModel::enqueue_forward(int max_rows, int entries) {
  const ModelShape& s = shape_;
  const int bucket = row_bucket(max_rows);
  const bool pdl = options_.pdl;
  cudaStream_t st = stream_;
  // A layer's K (or V): every slot's, slot after slot; a row's kernels add its slot's offset (step_state.cuh).
  const int64_t kv_layer = int64_t(slots_) * kv_slot_elements_;
  bf16* k_cache = kv_cache_;
  bf16* v_cache = kv_cache_ + kv_layer * s.layers;

  // A GEMM's shape with what every GEMM of the forward shares: the step state and the split-K scratch.
  // `site`: which GEMM of the forward (the trace records name it).
  auto gemm_params = [&](const bf16* weight, const Fp8Weight& fp8, int n_rows, int n_out, int k, int site) {
    GemmParams g{};
    g.trace = options_.gemm_trace;
    g.site = site;
    g.weight = weight;
    g.weight_fp8 = fp8.data;
    g.weight_scale = fp8.scale;
    g.n_rows = n_rows;
    g.n_out = n_out;
    g.k = k;
    g.state = state_;
    g.split_partials = gemm_split_partials_;
    g.split_counters = gemm_split_counters_;
    return g;
  };
  embed(EmbedParams{embed_, s.hidden, state_, residual_, ssq_layer_}, max_rows, st, false);
  // More than 8 rows (tile-per-block GEMMs): the normalised inputs are written once as bf16 rows and the
  // GEMMs read those, instead of each re-normalising the fp32 residual rows at every weight chunk.
  const bool prenormalise = max_rows > 8;
  auto normalise_input = [&](GemmParams& g) {
    if (!prenormalise) return;
    rmsnorm_rows(RmsNormParams{g.residual_in, s.hidden, g.ssq_in, g.ssq_in_parts, g.norm_weight, g.norm_eps, state_, normed_},
                 max_rows, st, pdl);
    g.x = normed_;
  };
  const GemmInput normalised = prenormalise ? GemmInput::bf16_rows : GemmInput::rmsnorm_residual;
  // Many rows (ModelOptions::decode_prefill_gemm_rows): the projections on the prefill GEMMs, which leave no sums
  // of squares behind, so each norm before them reads its residual rows whole (rmsnorm_prefill). Rows past the
  // forward's, up to the bucket's, are computed and dropped: the RoPE epilogue writes nothing for them.
  const bool on_prefill_gemms = decode_on_prefill_gemms(max_rows);
  const bool chain = on_prefill_gemms && pdl && options_.decode_prefill_pdl;  // those forwards' kernels by PDL
  auto many_rows = [&](const bf16* weight, int n_rows, int n_out, int k, const bf16* x, const bf16* bias, int site) {
    PrefillGemmParams g = prefill_params(weight, n_rows, n_out, k, x, k, max_rows);
    g.bias = bias;
    g.trace = options_.gemm_trace;
    g.site = site;
    return g;
  };
  auto on_prefill = [&](PrefillGemmParams g, PrefillEpilogue epilogue) {
    prefill_gemm(g, epilogue, decode_split_, false, chain);  // reserved before capture (reserve_decode_prefill_splits)
  };
  // A layer's attention and combine over its cache (slot 0's pointers; each row's kernel adds its slot's offset).
  auto attend = [&](const bf16* layer_k, const bf16* layer_v, bool launch_pdl) {
    AttentionParams ap = attention_params(q_roped_, layer_k, layer_v, state_, attention_splits_[bucket][entries], attention_out_);
    ap.early_trigger = options_.attention_early_trigger;
    ap.revealed_rule_mask_token = s.adapter_rank > 0 || s.adapter_on_window ? s.mask_token_id : -1;
    ap.revealed_rule_causal = !s.adapter_on_window;
    attention(ap, max_rows, 1 << entries, st, launch_pdl);
    attention_combine(ap, max_rows, st, launch_pdl);
  };
  for (int l = 0; l < s.layers; ++l) {
    const LayerWeights& L = layers_[l];
    bf16* layer_k = k_cache + kv_layer * l;
    bf16* layer_v = v_cache + kv_layer * l;
    if (on_prefill_gemms) {
      rmsnorm_prefill(residual_, s.hidden, L.input_norm, s.rms_eps, max_rows, normed_, st, chain);
      PrefillGemmParams qkv = many_rows(L.qkv, qkv_rows_, qkv_rows_, s.hidden, normed_, s.qkv_bias ? L.qkv_bias : nullptr, 4 * l);
      set_rope_epilogue(qkv, s, rope_table_, q_roped_, layer_k, layer_v);
      qkv.state = state_;
      qkv.kv_slot_stride = size_t(kv_slot_elements_);
      on_prefill(qkv, PrefillEpilogue::rope_qkv);
      attend(layer_k, layer_v, chain);

      PrefillGemmParams o = many_rows(L.o, s.hidden, s.hidden, s.heads * s.head_dim, attention_out_, s.o_bias ? L.o_bias : nullptr,
                                      4 * l + 1);
      o.residual = residual_;
      o.out_stride = s.hidden;
      on_prefill(o, PrefillEpilogue::residual_add);

      rmsnorm_prefill(residual_, s.hidden, L.post_norm, s.rms_eps, max_rows, normed_, st, chain);
      PrefillGemmParams gate_up = many_rows(L.gate_up, gate_up_rows_, s.intermediate, s.hidden, normed_, nullptr, 4 * l + 2);
      gate_up.out = mlp_act_;
      gate_up.out_stride = s.intermediate;
      on_prefill(gate_up, PrefillEpilogue::silu_mul);

      PrefillGemmParams down = many_rows(L.down, s.hidden, s.hidden, s.intermediate, mlp_act_, nullptr, 4 * l + 3);
      down.residual = residual_;
      down.out_stride = s.hidden;
      on_prefill(down, PrefillEpilogue::residual_add);
      continue;
    }

    GemmParams qkv = gemm_params(L.qkv, L.qkv_fp8, qkv_rows_, qkv_rows_, s.hidden, 4 * l);
    qkv.bias = s.qkv_bias ? L.qkv_bias : nullptr;
    qkv.residual_in = residual_;
    qkv.x_stride = s.hidden;
    qkv.ssq_in = ssq_layer_;
    qkv.ssq_in_parts = l == 0 ? 1 : hidden_tiles_;
    qkv.norm_weight = L.input_norm;
    qkv.norm_eps = s.rms_eps;
    qkv.out = qkv_out_;
    qkv.out_stride = qkv_rows_;
    if (fused_rope_) {
      set_rope_epilogue(qkv, s, rope_table_, q_roped_, layer_k, layer_v);
      qkv.kv_slot_stride = size_t(kv_slot_elements_);
    }
    const AdapterSite* sites = adapters_.empty() ? nullptr : adapters_[l].data();
    // The row adapter of one GEMM, fused into it: t = A x from its extra tiles, B t in its epilogue (gemm.cuh).
    auto with_adapter = [&](GemmParams& g, int site_index) {
      if (sites == nullptr || sites[site_index].total_rank == 0) return;
      const AdapterSite& site = sites[site_index];
      g.adapter_tiles = adapter_tile_count(site.total_rank);
      g.adapter_b = site.b;
      g.adapter_offset = site.offset;
      g.adapter_rank = s.adapter_rank;
      g.adapter_total_rank = site.total_rank;
      g.adapter_t = site.t;
      g.adapter_mask_token = s.adapter_on_window ? -1 : s.mask_token_id;
    };
    with_adapter(qkv, kQkvSite);
    normalise_input(qkv);
    gemm(qkv, normalised, fused_rope_ ? GemmEpilogue::rope_qkv : GemmEpilogue::store_bf16, max_rows, options_.gemm, st,
         pdl);

    if (!fused_rope_) rope(rope_params(L, qkv_out_, state_, q_roped_, layer_k, layer_v), max_rows, st, pdl);
    attend(layer_k, layer_v, pdl);

    GemmParams o = gemm_params(L.o, L.o_fp8, s.hidden, s.hidden, s.heads * s.head_dim, 4 * l + 1);
    o.bias = s.o_bias ? L.o_bias : nullptr;
    o.x = attention_out_;
    o.x_stride = s.heads * s.head_dim;
    o.residual_out = residual_;
    o.out_stride = s.hidden;
    o.ssq_out = ssq_attention_;
    with_adapter(o, kOSite);
    gemm(o, GemmInput::bf16_rows, GemmEpilogue::residual_add, max_rows, options_.gemm, st, pdl);

    GemmParams gate_up = gemm_params(L.gate_up, L.gate_up_fp8, gate_up_rows_, s.intermediate, s.hidden, 4 * l + 2);
    gate_up.residual_in = residual_;
    gate_up.x_stride = s.hidden;
    gate_up.ssq_in = ssq_attention_;
    gate_up.ssq_in_parts = hidden_tiles_;
    gate_up.norm_weight = L.post_norm;
    gate_up.norm_eps = s.rms_eps;
    gate_up.out = mlp_act_;
    gate_up.out_stride = s.intermediate;
    with_adapter(gate_up, kGateUpSite);
    normalise_input(gate_up);
    gemm(gate_up, normalised, GemmEpilogue::silu_mul, max_rows, options_.gemm, st, pdl);

    GemmParams down = gemm_params(L.down, L.down_fp8, s.hidden, s.hidden, s.intermediate, 4 * l + 3);
    down.x = mlp_act_;
    down.x_stride = s.intermediate;
    down.residual_out = residual_;
    down.out_stride = s.hidden;
    down.ssq_out = ssq_layer_;
    with_adapter(down, kDownSite);
    gemm(down, GemmInput::bf16_rows, GemmEpilogue::residual_add, max_rows, options_.gemm, st, pdl);
  }

  GemmParams head = gemm_params(lm_head_, lm_head_fp8_, s.vocab, s.vocab, s.hidden, 4 * s.layers);
  head.residual_in = residual_;
  head.x_stride = s.hidden;
  head.ssq_in = ssq_layer_;
  head.ssq_in_parts = s.layers == 0 ? 1 : hidden_tiles_;
  head.norm_weight = final_norm_;
  head.norm_eps = s.rms_eps;
  head.use_row_map = true;
  head.logits = logits_;
  head.out_stride = s.vocab;
  head.argmax_out = argmax_partials_;
  head.mask_token_id = s.mask_token_id;
  if (on_prefill_gemms) {
    // The last down projection left no sums of squares: the final norm reads the residual rows whole.
    rmsnorm_prefill(residual_, s.hidden, final_norm_, s.rms_eps, max_rows, normed_, st, chain);
    head.x = normed_;
  } else {
    normalise_input(head);
  }
  // The decode GEMM takes kMaxRows logits rows a launch: a forward of more rows runs it in passes, each pass's
  // logits and argmax partials after the last one's (GemmParams::logit_first).
  for (int first = 0; first < max_rows; first += kMaxRows) {
    GemmParams pass = head;
    pass.logit_first = first;
    pass.logits = logits_ + size_t(first) * s.vocab;
    pass.argmax_out = argmax_partials_ + size_t(first / kMaxRows) * vocab_tiles_ * kMaxRows;
    gemm(pass, normalised, GemmEpilogue::logits, std::min(max_rows - first, kMaxRows), options_.gemm, st,
         on_prefill_gemms ? chain : pdl);
  }
  reveal_argmax(RevealParams{argmax_partials_, vocab_tiles_, state_, choices_}, max_rows, st, pdl);
}

void DeviceModel::capture_graph(int bucket, int entries) {
  cudaGraph_t graph = nullptr;
  A2D_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue_forward(bucket_rows(bucket), entries);
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  A2D_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  CapturedForward& captured = graphs_[bucket][entries];
  captured.graph = graph;  // kept for captured(): the instance's nodes are named by the graph's
  A2D_CUDA_CHECK(cudaGraphInstantiate(&captured.exec, graph, 0));
}

// The step state of a forward of several sequences: each row's entry, each entry's fields, and the attention's
// blocks of query rows (each entry's (token, q head) rows cut into blocks of 64, attention_tile.cuh).
void DeviceModel::describe_entries(const ForwardInputs& in, StepState& st) const {
  const int group = shape_.heads / shape_.kv_heads;
  std::vector<bool> taken(slots_, false);
  int row = 0;
  for (int e = 0; e < in.entry_count; ++e) {
    const ForwardEntry& entry = in.entries[e];
    if (entry.slot < 0 || entry.slot >= slots_ || taken[entry.slot]) {
      throw std::runtime_error("forward: slot " + std::to_string(entry.slot) + " is not a free slot of 0.." +
                               std::to_string(slots_ - 1));
    }
    taken[entry.slot] = true;
    if (entry.rows < 1 || entry.commit < 0 || entry.commit > entry.rows || entry.cached < 0 ||
        int64_t(entry.cached) + entry.rows > shape_.max_context) {
      throw std::runtime_error("forward: entry " + std::to_string(e) + " needs " + std::to_string(entry.cached + entry.rows) +
                               " positions, or has its rows out of range (KV cache of " + std::to_string(shape_.max_context) + ")");
    }
    add_entry(st, e, EntryView{entry.slot, entry.cached, entry.commit, row, entry.rows}, group);
    row += entry.rows;
  }
  if (row != in.rows) throw std::logic_error("forward: the entries' rows do not add up to the forward's");
}

int DeviceModel::max_forward_rows() const {
  // The largest row bucket within the option and the activations whose forwards run on the prefill GEMMs.
  const int limit = std::min(options_.max_forward_rows, forward_capacity_);
  int rows = kMaxRows;
  for (int bucket = row_bucket(kMaxRows) + 1; bucket <= kRowBuckets && bucket_rows(bucket) <= limit; ++bucket) {
    if (decode_on_prefill_gemms(bucket_rows(bucket))) rows = bucket_rows(bucket);
  }
  return rows;
}

void DeviceModel::forward(const ForwardInputs& in) {
  const int max_rows = max_forward_rows();
  if (in.rows < 1 || in.rows > max_rows) throw std::runtime_error("forward: rows must be 1.." + std::to_string(max_rows));
  const bool several = in.entry_count > 1;
  if (in.entry_count == 1) throw std::logic_error("forward: one sequence goes in cached, commit and slot");
  if (!several && (in.commit < 0 || in.commit > in.rows)) throw std::runtime_error("forward: commit rows out of range");
  if (!several && (in.cached < 0 || int64_t(in.cached) + in.rows > shape_.max_context)) {
    throw std::runtime_error("forward: " + std::to_string(in.cached + in.rows) +
                             " positions exceed the KV cache of " + std::to_string(shape_.max_context));
  }
  if (!several && (in.slot < 0 || in.slot >= slots_)) throw std::runtime_error("forward: slot out of range");
  if (in.entry_count > in.rows) throw std::runtime_error("forward: more sequences than rows");
  if (in.logit_count < 0 || in.logit_count > in.rows) throw std::runtime_error("forward: logit row count out of range");
  for (int i = 0; i < in.rows; ++i) {
    if (in.tokens[i] < 0 || in.tokens[i] >= shape_.vocab) throw std::runtime_error("forward: token id out of range");
  }
  // The previous forward's copy from the pinned state must be done before it is rewritten.
  A2D_CUDA_CHECK(cudaStreamSynchronize(stream_));
  StepState& st = *state_host_;
  st.cached = several ? 0 : in.cached;
  st.commit = several ? 0 : in.commit;
  st.slot = several ? 0 : in.slot;
  st.rows = in.rows;
  st.logit_count = in.logit_count;
  st.write_logits = in.write_logits ? 1 : 0;
  st.entries = several ? in.entry_count : 1;
  if (++serial_ == 0) {
    serial_ = 1;
    for (auto& sites : adapters_) {
      for (AdapterSite& site : sites) {
        if (site.t != nullptr) A2D_CUDA_CHECK(cudaMemsetAsync(site.t, 0, sizeof(*site.t) * kMaxRows * site.total_rank, stream_));
      }
    }
  }
  st.serial = serial_;
  std::memcpy(st.tokens, in.tokens, sizeof(int32_t) * in.rows);
  for (int i = 0; i < in.logit_count; ++i) {
    if (in.logit_rows[i] < 0 || in.logit_rows[i] >= in.rows) throw std::runtime_error("forward: logit row out of range");
    st.logit_rows[i] = in.logit_rows[i];
  }
  if (several) describe_entries(in, st);
  // One sequence's kernels read nothing past logit_rows: the copy leaves the arrays of several out.
  const size_t state_bytes = several ? sizeof(StepState) : offsetof(StepState, row_entry);
  A2D_CUDA_CHECK(cudaMemcpyAsync(state_, state_host_, state_bytes, cudaMemcpyHostToDevice, stream_));
  const int bucket = row_bucket(in.rows);
  const int entries = several ? entry_bucket(in.entry_count) : 0;
  if (options_.graphs && graphs_[bucket][entries].exec != nullptr) {
    A2D_CUDA_CHECK(cudaGraphLaunch(graphs_[bucket][entries].exec, stream_));
  } else {
    enqueue_forward(bucket_rows(bucket), entries);
  }
}

void DeviceModel::copy_logits(float* host, int first, int count) {
  A2D_CUDA_CHECK(cudaMemcpyAsync(host, logits_ + size_t(first) * shape_.vocab, sizeof(float) * size_t(count) * shape_.vocab,
                                 cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void DeviceModel::copy_choices(TokenChoice* host, int count) {
  A2D_CUDA_CHECK(cudaMemcpyAsync(host, choices_, sizeof(TokenChoice) * count, cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void DeviceModel::keep_anchor(int slot, int index) {
  if (slot < 0 || slot >= slots_) throw std::runtime_error("keep_anchor: slot out of range");
  A2D_CUDA_CHECK(cudaMemcpyAsync(anchor_logits_ + size_t(slot) * shape_.vocab, logits_ + size_t(index) * shape_.vocab,
                                 sizeof(float) * shape_.vocab, cudaMemcpyDeviceToDevice, stream_));
}

void DeviceModel::copy_anchor_logits(int slot, float* host) {
  if (slot < 0 || slot >= slots_) throw std::runtime_error("copy_anchor_logits: slot out of range");
  A2D_CUDA_CHECK(cudaMemcpyAsync(host, anchor_logits_ + size_t(slot) * shape_.vocab, sizeof(float) * shape_.vocab,
                                 cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void DeviceModel::synchronize() { A2D_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace a2d::cuda
