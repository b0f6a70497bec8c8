// The model on the GPU: bf16 (or an FP8 model's e4m3 GEMM) weights in the kernels' layout, the KV cache for the whole
// context in one slot per sequence decoded at once, the activation buffers of one forward, and one CUDA graph per
// row bucket (8, 16, ..., 64 rows, then 96, 128, ... up to ModelOptions::max_forward_rows) and number of sequences
// (1, 2, 4, ... up to the slots) replayed with the forward's inputs in device memory (StepState).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "attention.cuh"
#include "common.cuh"
#include "gemm.cuh"
#include "gemm_prefill.cuh"
#include "reveal.cuh"
#include "rope.cuh"
#include "step_state.cuh"
#include "weights.cuh"

namespace a2d::cuda {

struct ModelShape {
  int hidden = 0;
  int intermediate = 0;
  int layers = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  float rms_eps = 1e-6f;
  double rope_theta = 10000.0;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  bool o_bias = false;
  bool qk_norm = false;
  int mask_token_id = -1;
  int max_context = 0;  // per slot
  // KV cache slots asked for: sequences one forward may hold (continuous batching). The model holds as many as fit
  // in the GPU's free memory after everything else, at least one (DeviceModel::slots()).
  int kv_slots = 1;
  // A row adapter: the rank of each target, which projections carry it (bit i: AdapterTarget i; 0: none), and its
  // rule: every window row (the window adapter) or the rows holding the mask token (the mask adapter). The window
  // rule (a2d.window_rule) is adapter_on_window with rank 0: the window adapter's attention, no factors.
  int adapter_rank = 0;
  unsigned adapter_targets = 0;
  bool adapter_on_window = false;
  // An FP8 model (a2d.precision "fp8-e4m3"): every projection, and the lm_head unless it is the embedding, is
  // uploaded as e4m3 with its fp32 row scales (WeightSource::scale) and streamed as such.
  bool fp8 = false;
};

// The projections a row adapter may target, in the order of config.h's kAdapterTargets.
enum class AdapterTarget { q, k, v, o, gate, up, down };

enum class WeightName {
  embed, lm_head, final_norm,
  input_norm, post_norm, q, k, v, o, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm, gate, up, down,
};

struct WeightSource {
  const void* data;
  SourceType type;
  bool on_device;  // false: host memory (a mapped file), copied through pinned staging buffers
  const float* scale = nullptr;  // f8_e4m3: [rows] fp32 scales, in the same memory as `data`
};

// The RoPE fields of a QKV GEMM's epilogue (GemmParams, PrefillGemmParams; rope_qkv) or of the rope kernel
// (RopeParams) that the model's shape and the layer give: the rope table, the heads, and where the roped q rows and
// the layer's K and V cache rows go. The caller completes them with the rows' positions (`cached`, or a forward's
// `state` and `kv_slot_stride`).
template <typename Params>
void set_rope_epilogue(Params& p, const ModelShape& s, const float2* rope_table, bf16* q_out, bf16* k_cache, bf16* v_cache) {
  p.rope_table = rope_table;
  p.head_dim = s.head_dim;
  p.num_heads = s.heads;
  p.num_kv_heads = s.kv_heads;
  p.max_context = s.max_context;
  p.q_out = q_out;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
}

// The fields every attention launch takes from the model's shape (AttentionParams, PrefillAttentionParams): q
// ([rows][heads][head_dim_padded], roped), one layer's K and V cache, the heads and the softmax scale.
template <typename Params>
void set_attention_shape(Params& p, const ModelShape& s, int head_dim_padded, const bf16* q, const bf16* k_cache,
                         const bf16* v_cache) {
  p.q = q;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.max_context = s.max_context;
  p.num_heads = s.heads;
  p.num_kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.head_dim_padded = head_dim_padded;
  p.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
}

struct ModelOptions {
  bool graphs = true;  // replay captured graphs; false launches every kernel (debugging, comparisons)
  bool pdl = true;     // programmatic dependent launch between consecutive kernels
  // RoPE in the QKV GEMM's epilogue (no rope kernel) where the shape allows: no QK-norm, head_dim a
  // multiple of 16 that needs no padding. Fixed at construction (it decides the weight layout).
  bool fuse_rope = true;
  GemmTuning gemm;     // sm_count is filled in from the device
  // AttentionParams::early_trigger (bench/NOTES.md, runs 36-37 and 49).
  AttentionTrigger attention_early_trigger = AttentionTrigger::short_kv;
  // AttentionParams::split_keys (false: never split keys).
  bool attention_split_keys = true;
  // Prefill chunks of at most kMaxRows rows attend through the decode forwards' kernels (attention.cu: keys split
  // over blocks, then the combine) instead of attention_prefill, whose grid holds ceil(rows x group / 64) x KV heads
  // blocks that each walk every key (at 32 rows of the 2B shape after 1,024 cached: 8 blocks, 39 us a layer on the
  // H100; bench/NOTES.md, run 122). With it, 0.74 ms against 1.63 for that call's attention (run 123).
  bool prefill_split_attention = true;
  // Decode forwards of at least this many rows (a graph's row bucket) run their four projections on the prefill
  // GEMMs' warpgroup kernel, the norms before them as rmsnorm_prefill, the RoPE by each row's sequence
  // (PrefillGemmParams::state). Only where the warpgroup kernel runs (prefill_wgmma, sm_90a code loaded), for bf16
  // models without a row adapter whose RoPE the QKV epilogue does; the lm_head stays on the decode GEMM. 0: never.
  // The 2B shape at KV 1k on the H200 (bench/NOTES.md, run 127), ms a forward, decode GEMMs against these: 32 rows
  // 3.88 / 3.95, 34 rows 4.56 / 4.11, 40 rows 4.65 / 4.13, 64 rows 6.47 / 4.84; so from 33 rows.
  int decode_prefill_gemm_rows = 33;
  // Those forwards' kernels chained by programmatic dependent launch (with `pdl`): each warpgroup GEMM copies its
  // first ring of weights while the kernel before it still runs, and the norms, attention and lm_head launch early.
  // The 2B shape at KV 1k on the H100 (bench/NOTES.md, run 132), ms a forward without / with: 34 rows 4.76 / 4.40,
  // 40 rows 4.79 / 4.44, 64 rows 5.51 / 5.18.
  bool decode_prefill_pdl = true;
  // Most rows of one forward (continuous batching: 32 sequences at block 4 are 160 rows). Above kMaxRows (up to
  // kMaxForwardRows) only where those forwards run on the prefill GEMMs (decode_prefill_gemm_rows: bf16 models
  // without a row adapter, sm_90a), in row buckets of 32, the lm_head in passes of kMaxRows logits rows; elsewhere
  // kMaxRows. Fixed at construction (the activations are sized for it; reconfigure keeps the construction's). The
  // 2B shape at KV 1k on the H100, block 4 (bench/NOTES.md, run 141), ms for 32 sequences: 7.23 in one forward of 160
  // rows against 13.41 in forwards of at most 64; 48 sequences 8.74 against 18.75.
  int max_forward_rows = kMaxForwardRows;
  // The attention's key splits of forwards of several sequences planned by the blocks of query rows they mostly run
  // (attention_max_splits' typical_blocks) instead of the grid's bound: at 32 sequences of 5 rows on the 2B shape,
  // 4 splits instead of 2. Fixed at construction (it sizes the partials). The 2B shape at KV 1k on the H100
  // (bench/NOTES.md, run 138), one forward of 32 sequences at block 4: 9.43 ms against 10.04, 48: 11.05 against 12.26.
  bool attention_typical_blocks = true;
  // The attention's combine of at most 16 key splits (forwards of several sequences) by one warp per query row
  // instead of one block of 256 threads per row (attention.cu, combine_warp_kernel). The 2B shape at KV 1k on the
  // H100 (bench/NOTES.md, run 146), one forward at block 4: 32 sequences 6.74 ms against 7.14, 48 8.05 against 8.72.
  bool attention_warp_combine = true;
  // AttentionParams::prefetch_cached: a split's first key tile, where it was cached before the forward, copied while
  // the previous kernel finishes (PDL). The 2B shape at KV 1k (bench/NOTES.md, runs 175-176), ms a forward without /
  // with: H100 8 sequences 3.711 / 3.688, 12 3.893 / 3.850, 32 6.306 / 6.261, 48 7.146 / 7.066; H200 8 3.412 / 3.409,
  // 32 6.083 / 6.045.
  bool attention_prefetch = true;
  GemmTrace gemm_trace;  // per-block GEMM records (trace.cuh): only builds with A2D_GEMM_TRACE write them
};

// One sequence's part of a forward of several (ForwardInputs::entries): its slot, its cached tokens before the
// forward, and its rows, commit rows first.
struct ForwardEntry {
  int slot = 0;
  int cached = 0;
  int commit = 0;
  int rows = 0;
};

// The inputs of one forward of at most DeviceModel::max_forward_rows() rows (see StepState): one sequence on `slot`
// (entry_count 0), or the rows of entry_count sequences one after another (entries; cached, commit and slot unused),
// each of at most kMaxRows rows.
struct ForwardInputs {
  int cached = 0;
  int commit = 0;
  int slot = 0;
  const int32_t* tokens = nullptr;  // commit tokens then window tokens (of each entry in turn)
  int rows = 0;
  const int32_t* logit_rows = nullptr;
  int logit_count = 0;
  bool write_logits = false;
  const ForwardEntry* entries = nullptr;
  int entry_count = 0;
};

// The inputs of one forward of these rows (commit then window tokens of each entry in turn) and logits rows: one
// entry runs as that sequence alone (cached, commit and slot), more as several. The vectors must outlive the forward.
inline ForwardInputs forward_inputs(const std::vector<int32_t>& tokens, const std::vector<int32_t>& logit_rows,
                                    const std::vector<ForwardEntry>& entries, bool write_logits) {
  ForwardInputs in;
  in.tokens = tokens.data();
  in.rows = static_cast<int>(tokens.size());
  in.logit_rows = logit_rows.data();
  in.logit_count = static_cast<int>(logit_rows.size());
  in.write_logits = write_logits;
  if (entries.size() == 1) {
    in.slot = entries[0].slot;
    in.cached = entries[0].cached;
    in.commit = entries[0].commit;
  } else {
    in.entries = entries.data();
    in.entry_count = static_cast<int>(entries.size());
  }
  return in;
}

// The sequence counts a forward's graph is captured for: 1, 2, 4, ... 64 (the most a forward of kMaxRows rows holds).
constexpr int kEntryBuckets = 7;
inline int entry_bucket(int entries) {
  int bucket = 0;
  while ((1 << bucket) < entries) ++bucket;
  return bucket;
}

// A forward's row bucket (1-based): the row count its graph and kernels are built for, 8, 16, ... kMaxRows, then
// kMaxRows + 32, + 64, ... kMaxForwardRows.
constexpr int kRowBuckets = kMaxRows / 8 + (kMaxForwardRows - kMaxRows) / 32;
inline int row_bucket(int rows) { return rows <= kMaxRows ? ceil_div(rows, 8) : kMaxRows / 8 + ceil_div(rows - kMaxRows, 32); }
inline int bucket_rows(int bucket) { return bucket <= kMaxRows / 8 ? bucket * 8 : kMaxRows + (bucket - kMaxRows / 8) * 32; }

// Most rows of one prefill forward (DeviceModel::prefill); the model's buffers for them are allocated at
// construction (about 80 MB on the 2B shape).
constexpr int kPrefillMaxRows = 2048;

// Wall-clock phases of bringing the model up, for the cold-start figures.
struct StartupTimes {
  double context_s = 0;
  double upload_s = 0;
  double capture_s = 0;
  int64_t weight_bytes = 0;
};

// GPU time of prefill calls by kernel kind, summed over the calls since timing was switched on
// (DeviceModel::time_prefill; engine/bench/prefill_check.cu prints it per call).
struct PrefillTimes {
  enum Kind { embed_norms, qkv, attention, o, gate_up, down, kinds };
  std::array<double, kinds> ms{};
  int calls = 0;
};

class DeviceModel {
 public:
  DeviceModel(const ModelShape& shape, const ModelOptions& options);
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  // Places one stored tensor (HF layout, shape implied by the name) into the kernels' layout.
  void upload(WeightName name, int layer, const WeightSource& source);
  // One projection's row adapter factors, a [rank][in] and b [out][rank], from host memory: a into its GEMM's
  // weight as extra tiles (GemmParams::adapter_tiles), b into the site's B rows.
  void upload_adapter(AdapterTarget target, int layer, const WeightSource& a, const WeightSource& b);
  // Waits for the uploads, releases the staging buffers and captures the graphs.
  void finish_upload();
  // Switches graphs / PDL / tuning (benchmarks compare them on one set of weights) and recaptures the graphs.
  void reconfigure(const ModelOptions& options);
  const ModelOptions& options() const { return options_; }

  // Enqueues one forward; results are read with the copy functions below (which synchronize).
  void forward(const ForwardInputs& inputs);
  void copy_logits(float* host, int first, int count);  // logits rows first.. of the last forward
  void copy_choices(TokenChoice* host, int count);
  // Enqueues the causal forward of `rows` (<= prefill_rows()) prompt tokens after `cached` ones, on the
  // many-row kernels (gemm_prefill.cuh, attention_prefill.cuh): their keys and values go into the KV cache at
  // positions cached.. of slot `slot`, and no logits are computed. Commit rows only: a row adapter acts on none of them.
  void prefill(int slot, int cached, const int32_t* tokens, int rows);
  int prefill_rows() const { return prefill_capacity_; }
  // Times every kernel of the prefill calls that follow by kind (an event pair around each), until switched off;
  // prefill_times() synchronizes and returns the sums since the last switch on. For benchmarks: it costs a launch
  // pair per kernel.
  void time_prefill(bool on);
  PrefillTimes prefill_times();
  // Keeps logits row `index` of the last forward on the device as slot `slot`'s anchor (the next block's anchor row).
  void keep_anchor(int slot, int index);
  void copy_anchor_logits(int slot, float* host);
  void synchronize();
  // KV cache slots: sequences one forward may hold (ModelShape::kv_slots, as many as fitted).
  int slots() const { return slots_; }
  // Most rows one forward takes under the current options (ModelOptions::max_forward_rows where it applies).
  int max_forward_rows() const;

  const ModelShape& shape() const { return shape_; }
  const StartupTimes& startup() const { return startup_; }
  cudaStream_t stream() const { return stream_; }
  // The KV cache as raw storage (benchmarks fill it with random data to time long contexts).
  bf16* kv_storage() const { return kv_cache_; }
  int64_t kv_storage_elements() const { return kv_elements_; }
  const char* device_name() const { return device_name_; }
  // The captured forward of a row bucket (bucket_rows(bucket) rows) of one sequence: the graph and its instance, both
  // null without graphs. engine/bench disables nodes of an instance for its per-kernel timing breakdowns.
  struct CapturedForward {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
  };
  const CapturedForward& captured(int bucket) const { return graphs_[bucket][0]; }

 private:
  // A GEMM weight of an FP8 model: e4m3 in the FP8 tiled layout and one fp32 scale per row, both in GEMM row order.
  struct Fp8Weight {
    uint8_t* data = nullptr;
    float* scale = nullptr;
  };
  struct LayerWeights {
    bf16* qkv;  // [(heads + 2 kv_heads) * head_dim][hidden]
    bf16* qkv_bias;
    bf16* o;
    bf16* o_bias;
    bf16* gate_up;  // [ceil(inter / 8) * 16][hidden]: 8 gate rows, then the 8 up rows of the same outputs
    bf16* down;
    // An FP8 model's GEMM weights instead of the four above (which are then null).
    Fp8Weight qkv_fp8, o_fp8, gate_up_fp8, down_fp8;
    bf16* input_norm;
    bf16* post_norm;
    bf16* q_norm;
    bf16* k_norm;
  };
  // The row adapter of one GEMM of a layer: its targets' A stacked [total_rank][k] in the GEMM's weight after its
  // own tiles, B [n_rows][rank] (each output row's own target's B row, zeros for outputs no target covers) and
  // each row's offset in t, in the GEMM's row order. total_rank 0: no adapter on this GEMM.
  struct AdapterSite {
    int total_rank = 0;
    int n_rows = 0;
    bf16* b = nullptr;
    int* offset = nullptr;
    unsigned long long* t = nullptr;  // [kMaxRows][total_rank] tagged values: GemmParams::adapter_t
    std::vector<uint16_t> host_b;  // assembled here while uploading, copied by finish_upload
    std::vector<int> host_offset;
  };
  enum Site { kQkvSite, kOSite, kGateUpSite, kDownSite, kSites };
  // The factor rows a layer's GEMM `site` carries (0: none), from the shape.
  int site_rank(int site) const;
  bf16* site_weight(int layer, int site) const;

  // Graphs are captured for sequence counts 1 << entries (entry_bucket) that a forward of max_rows rows can hold.
  bool captures(int bucket, int entries) const {
    return bucket_rows(bucket) <= max_forward_rows() && (entries == 0 || (1 << (entries - 1)) < std::min(slots_, bucket_rows(bucket)));
  }
  void enqueue_forward(int max_rows, int entries);
  void describe_entries(const ForwardInputs& in, StepState& st) const;
  // The rope kernel's parameters for layer L: RoPE (and QK-norm) on the q and k heads of `qkv`, q to q_out, k and
  // v into the layer's cache rows; positions from `state` (enqueue_forward and prefill).
  RopeParams rope_params(const LayerWeights& L, const bf16* qkv, const StepState* state, bf16* q_out, bf16* k_cache,
                         bf16* v_cache) const;
  // The split attention's parameters (attention.cuh) for one layer's cache rows: roped q, positions from `state`,
  // the forwards' partials, `max_splits` blocks along the keys; no early trigger and no row adapter's rule (the
  // caller sets those where they apply).
  AttentionParams attention_params(const bf16* q, const bf16* k_cache, const bf16* v_cache, const StepState* state, int max_splits,
                                   bf16* out) const;
  void capture_graphs();
  void capture_graph(int bucket, int entries);
  void destroy_graphs();
  void place(const WeightSource& source, int64_t rows, int64_t cols, bf16* destination, RowPlacement placement,
             bool tiled);
  void place_fp8(const WeightSource& source, int64_t rows, int64_t cols, const Fp8Weight& destination,
                 RowPlacement placement);
  void stage_rows(const void* source, bool on_device, size_t row_bytes, int64_t rows,
                  const std::function<void(const void* chunk, int64_t first_row, int64_t count)>& convert);
  Fp8Weight allocate_fp8(int64_t rows, int64_t cols);
  void prepare_gemm_scratch();
  bf16* allocate_weight(int64_t elements);
  void allocate_adapters();
  void allocate_prefill();
  // A prefill GEMM's split-K scratch (PrefillSplit): partials and zeroed counters, grown to the largest split asked.
  struct SplitScratch {
    float* partial = nullptr;
    size_t floats = 0;
    int* counters = nullptr;  // zero between launches
    int count = 0;
  };
  // How a prefill GEMM launches under the tuning: the kernel, its block shape and its K split (prefill.cu).
  struct PrefillLaunch {
    bool wgmma = false;
    int wgmma_tokens = 0;
    PrefillShape shape;
    PrefillSplit split;
  };
  PrefillLaunch prefill_launch(const PrefillGemmParams& params) const;
  // A prefill GEMM of `rows` token rows of x against a weight of n_rows rows.
  static PrefillGemmParams prefill_params(const bf16* weight, int n_rows, int n_out, int k, const bf16* x, int x_stride,
                                          int rows);
  // Grows `scratch` to hold `split`; `growable` false (inside a graph capture) throws instead.
  void reserve_split(SplitScratch& scratch, const PrefillSplit& split, bool growable);
  // A prefill GEMM with its K split as the tuning says (prefill.cu), its partials in `scratch` (the prefill's own
  // by default).
  void prefill_gemm(PrefillGemmParams params, PrefillEpilogue epilogue);
  void prefill_gemm(PrefillGemmParams params, PrefillEpilogue epilogue, SplitScratch& scratch, bool growable,
                    bool pdl = false);
  // Whether a decode forward of `max_rows` rows runs its projections on the prefill GEMMs
  // (ModelOptions::decode_prefill_gemm_rows), and the split scratch its graphs read, reserved before capture.
  bool decode_on_prefill_gemms(int max_rows) const;
  // Whether any decode forward may (the shape, the device and the options, whatever the rows).
  bool decode_prefill_gemms_possible() const;
  void reserve_decode_prefill_splits();

  ModelShape shape_;
  ModelOptions options_;
  StartupTimes startup_;
  char device_name_[256] = {};
  int sm_count_ = 0;
  cudaStream_t stream_ = nullptr;

  // One allocation for all weights, carved in a fixed order.
  bf16* weight_arena_ = nullptr;
  int64_t weight_arena_elements_ = 0;
  int64_t weight_arena_used_ = 0;
  bf16* embed_ = nullptr;
  bf16* lm_head_ = nullptr;
  Fp8Weight lm_head_fp8_;  // an FP8 model's untied lm_head (lm_head_ is then null)
  bf16* final_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<std::array<AdapterSite, kSites>> adapters_;  // per layer, when the model has a row adapter
  // The decode forwards' serial (StepState::serial): each forward takes the next, 0 skipped; when it wraps, every
  // adapter t is cleared, so that no value left from 2^32 forwards before carries a current tag.
  unsigned serial_ = 0;

  bf16* kv_cache_ = nullptr;  // K then V: [layers][slots][kv_heads][max_context][head_dim_padded] each
  int64_t kv_elements_ = 0;
  int slots_ = 1;
  int64_t kv_slot_elements_ = 0;  // one slot's K (or V) of one layer
  float2* rope_table_ = nullptr;

  int head_dim_padded_ = 0;
  bool fused_rope_ = false;  // ModelOptions::fuse_rope where the shape allows it
  int qkv_rows_ = 0;
  int gate_up_rows_ = 0;
  int hidden_tiles_ = 0;
  int vocab_tiles_ = 0;
  int attention_row_capacity_ = 0;
  int attention_splits_[kRowBuckets + 1][kEntryBuckets] = {};
  // The rows the activations are sized for: ModelOptions::max_forward_rows at construction where the shape and the
  // device take forwards that large (decode_on_prefill_gemms), else kMaxRows.
  int forward_capacity_ = kMaxRows;

  StepState* state_ = nullptr;       // device
  StepState* state_host_ = nullptr;  // pinned
  float* residual_ = nullptr;
  float* ssq_attention_ = nullptr;  // partial sums of squares after the attention residual
  float* ssq_layer_ = nullptr;      // after the MLP residual (and the embedding)
  bf16* qkv_out_ = nullptr;
  bf16* q_roped_ = nullptr;
  bf16* attention_out_ = nullptr;
  bf16* mlp_act_ = nullptr;
  bf16* normed_ = nullptr;  // forwards of more than 16 rows: the RMSNorm'd GEMM inputs (rmsnorm.cuh)
  float* attention_partial_o_ = nullptr;
  float2* attention_partial_ml_ = nullptr;
  float* logits_ = nullptr;
  float* anchor_logits_ = nullptr;  // [slots][vocab]
  ArgmaxPartial* argmax_partials_ = nullptr;  // [logits passes of kMaxRows rows][vocab tiles][kMaxRows]
  TokenChoice* choices_ = nullptr;
  float* gemm_split_partials_ = nullptr;  // split-K scratch, sized for the current tuning
  size_t gemm_split_floats_ = 0;
  unsigned* gemm_split_counters_ = nullptr;  // one per tile of the largest GEMM

  // Prefill forwards (prefill.cu): their own activations, sized for prefill_capacity_ rows.
  int prefill_capacity_ = 0;
  float* prefill_residual_ = nullptr;   // [rows][hidden]
  bf16* prefill_normed_ = nullptr;      // [rows][hidden]
  bf16* prefill_qkv_ = nullptr;         // [rows][qkv_rows]: shapes without RoPE in the QKV epilogue
  bf16* prefill_q_ = nullptr;           // [rows][heads][head_dim_padded]
  bf16* prefill_attention_ = nullptr;   // [rows][heads * head_dim]
  bf16* prefill_act_ = nullptr;         // [rows][intermediate]
  int32_t* prefill_tokens_ = nullptr;   // device [capacity]
  int32_t* prefill_tokens_host_ = nullptr;  // pinned [capacity]
  StepState* prefill_state_ = nullptr;       // device: rows and cached for the rope kernel
  StepState* prefill_state_host_ = nullptr;  // pinned
  // The prefill GEMMs' split-K scratch, grown to the largest split a chunk has needed; and the decode forwards'
  // (decode_prefill_gemm_rows), sized before their graphs are captured and never moved after.
  SplitScratch prefill_split_;
  SplitScratch decode_split_;
  // time_prefill: each timed kernel's kind and event pair, and the calls since it was switched on.
  struct PrefillEvent {
    int kind;
    cudaEvent_t start, stop;
  };
  bool prefill_timing_ = false;
  std::vector<PrefillEvent> prefill_events_;
  int prefill_timed_calls_ = 0;
  void release_prefill_events();

  // Host-to-device staging: two pinned buffers and their device twins, alternated.
  static constexpr size_t kStagingBytes = size_t(64) << 20;
  std::array<void*, 2> staging_host_ = {};
  std::array<void*, 2> staging_device_ = {};
  std::array<cudaEvent_t, 2> staging_free_ = {};
  int staging_next_ = 0;
  double upload_started_ = -1;

  std::array<std::array<CapturedForward, kEntryBuckets>, kRowBuckets + 1> graphs_ = {};
};

}  // namespace a2d::cuda
