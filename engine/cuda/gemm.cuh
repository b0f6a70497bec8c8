// Small-M GEMM: out[m, n] = sum_k x[m, k] * W[n, k] for m <= 64 rows against a bf16 weight streamed
// once from memory, or an e4m3 one with a scale per row (an FP8 model: half the bytes; fp8.cuh turns each
// weight fragment into bf16 before its mma, the epilogue multiplies row n by its scale). The work is bound by the weight bytes, so the kernel is shaped around one goal:
// every weight byte is read with a 16-byte load, with many loads in flight. Tensor cores (mma.sync
// m16n8k16) do the arithmetic with the weight as the 16-row A operand and the activations as B
// ("swap AB"), so 1..8 token rows cost the same instruction count as 8.
//
// Fusions (template flags): the input may be (up to 8 rows) the fp32 residual stream normalised on the fly (RMSNorm:
// the producer left per-tile partial sums of squares, so no separate norm kernel runs), and the
// epilogue may store bf16, apply SiLU(gate) * up, add into the residual (writing the next norm's
// partial sums of squares), write logits with per-tile argmax / softmax partials, or apply RoPE to the
// q and k heads of a QKV projection whose rows are in rope-pair order (weights.cuh) and write q for
// attention and k, v into the KV cache (the rope kernel's work, without the kernel).
#pragma once

#include "common.cuh"
#include "step_state.cuh"
#include "trace.cuh"
#include "weights.cuh"

namespace a2d::cuda {

enum class GemmInput { bf16_rows, rmsnorm_residual };
enum class GemmEpilogue { store_bf16, silu_mul, residual_add, logits, rope_qkv };

// Rows of the weight processed by one block (the tiled layout's tile, weights.cuh); the block's 8 warps
// split its K range. Small matrices also split K across blocks (GemmTuning): each block leaves an fp32
// partial tile, and the last block of a tile to finish adds them up in a fixed order (deterministic)
// and runs the epilogue.
constexpr int kGemmTileRows = 16;
constexpr int kGemmWarps = 8;

struct GemmTuning {
  // Tile per block: a grid of one block per 16-row tile (and per K split); each lane keeps `loads` pairs of
  // 16-byte weight loads in flight, and K is split until a GEMM has about `blocks_per_sm` blocks per SM
  // (0: never split).
  int loads = 4;  // 4 or 8
  int blocks_per_sm = 2;
  int sm_count = 132;
  // Tile per block, up to 16 rows: a GEMM whose tiles number at most blocks_per_sm per SM and whose K fits
  // one round of `small_loads` loads per lane (qkv and o of the 2B shape) runs one round at that depth (at 4
  // where a round of 4 holds K: e4m3 qkv and o)
  // and does not split K: a split's publish-and-merge costs more there than the deeper round (at 32 rows
  // the deeper round measured slower). 0: off (every GEMM takes `loads` and the split rule).
  int small_loads = 8;
  // Tile per block, up to 16 rows, normalised input: the row scale multiplies the dot products after the K
  // loop, with the producer's sums of squares copied to shared memory meanwhile (gemm.cu); false: scale first.
  bool stage_ssq = true;
  // Tile per block, more than 16 rows: the K-split target in blocks per SM (their blocks hold 96-122
  // registers, two per SM, and split K measured slower there).
  int wide_blocks_per_sm = 1;
  // Tile per block, forwards of at least this many rows (and more than 8): the wide kernel (gemm.cu), one
  // tile per warp and each chunk of the input rows staged once per block in shared memory, for GEMMs of
  // at least wide_min_tiles_per_sm tiles per SM. On the 2B shape that is gate/up and the lm_head; with
  // fewer tiles (qkv, o, down) it measured slower than tile per block, its grid then holding too few warps,
  // and so did it below 32 rows. 0: never.
  int wide_from_rows = 32;
  int wide_min_tiles_per_sm = 4;
  // The wide kernel's K split: towards this many blocks per SM, each split at least this many chunks. More
  // splits (4 or 5 blocks per SM, splits of 2-4 chunks) did not make it win on GEMMs of few tiles, and made
  // 64-row forwards slower.
  int wide_split_blocks_per_sm = 2;
  int wide_split_chunks = 8;
  // The prefill GEMM's K split (gemm_prefill.cuh, prefill_split): towards this many blocks per SM where its output
  // blocks are fewer. 0: off. On the H200, 2B shape after 1024 cached, a 64-row prefill call took 9.6 ms split
  // against 18.1 unsplit, 128 rows 10.3 against 19.1; from 2048 rows nothing splits (bench/NOTES.md, run 111).
  int prefill_split_blocks_per_sm = 1;
  // The prefill GEMM's block shape by the call's rows (gemm_prefill.cuh, prefill_shape): 32 token rows a block up
  // to 32 rows, 64 (two blocks a SM) up to 256, then 128; off: 128 for every call. The split above then aims at
  // the shape's blocks per SM times prefill_split_blocks_per_sm. On the H100, 2B shape after 1024 cached, a 32-row
  // prefill call took 5.9 ms against 9.7 in 128-token blocks, 64 rows 7.2 against 9.7, 128 rows 8.9 against 10.3;
  // nothing changes from 512 rows (bench/NOTES.md, run 122, prefill_check --shapes 1 with every parity check).
  bool prefill_shape_by_rows = true;
  // The warpgroup kernel (gemm_wgmma.cu: wgmma fed by TMA) for prefill GEMMs of at least prefill_wgmma_min_rows
  // rows, its token rows a block by the call's rows and the weight's (prefill_wgmma_tokens), K split towards a
  // block per SM where prefill_split_blocks_per_sm is on (prefill_wgmma_split). Faster than the mma.sync kernel at
  // every row count (H100, 2B layer's four GEMMs: 60 against 72 us at 8 rows, 90 against 179 at 160, 410 against
  // 1,283 at 2,048), so on wherever the device runs its sm_90a code (gemm_wgmma_available) and the operands suit
  // TMA; prefill_check --wgmma 1 holds it to the decode forwards (bench/NOTES.md, run 123).
  bool prefill_wgmma = true;
  int prefill_wgmma_min_rows = 1;
  // The warpgroup kernel's token rows a block for every call (one of kWgmmaTokens); 0: by the call's rows
  // (prefill_wgmma_tokens).
  int prefill_wgmma_tokens = 0;
  // The warpgroup kernel's K splits as clusters that sum through each other's shared memory and share the
  // epilogue (PrefillGemmParams::cluster_splits, prefill_wgmma_cluster_split) instead of the tile's last split
  // summing every split's partials from global memory and running the whole epilogue: 1-4 % faster forwards of
  // 8 to 16 sequences, about even beyond (bench/NOTES.md, runs 153, 154 and 162; `--wgmma-cluster 0` turns it off).
  bool prefill_wgmma_cluster = true;
  // Stream-K for the warpgroup kernel's calls of two or more 64-token blocks where it ends sooner than the split
  // above (prefill_wgmma_stream_split): every SM an equal share of the (output block, 64-k step) pairs, where the
  // split leaves SMs idle or runs a second wave. H100, 2B shape at block 4 after 1,024 cached: forwards of 13-32
  // sequences 3-6 % faster (32: 6.84 -> 6.43 ms), 40-48 even (bench/NOTES.md, run 183).
  bool prefill_wgmma_stream = true;
  // The fewest 64-token blocks a call takes stream-K at: calls of one (up to 64 rows) keep their split, which
  // stream-K made 8-9 % slower at 8-12 sequences (run 183); 1 lets them take it too, for measuring.
  int prefill_wgmma_stream_min_blocks = 2;
};

// How one GEMM launches under a tuning, and the split scratch it needs.
struct GemmPlan {
  int blocks = 0;            // grid.x: tiles, or the wide kernel's blocks of kWideWarps tiles
  int loads = 4;             // tile per block: 16-byte load pairs in flight per lane (4 or 8)
  int splits = 1;            // blocks per tile along K
  int chunks_per_split = 0;  // 32-column chunks each split covers
  bool wide = false;         // the wide kernel: blocks of 8 tiles (GemmTuning::wide_from_rows)
  size_t scratch_floats = 0;
};
// `fp8`: the weight is e4m3 (GemmParams::weight_fp8), whose chunks hold 64 columns instead of 32. n_rows counts
// the weight's output rows; a fused adapter's `adapter_tiles` ride the weight's plan (blocks and split scratch).
GemmPlan gemm_plan(int n_rows, int k, int max_rows, const GemmTuning& tuning, bool fp8, int adapter_tiles = 0);

// GemmParams::adapter_t holds each value of t as one 8-byte word: the fp32 value's bits in the low half and the
// step serial of the forward that wrote it (StepState::serial) in the high half. A weight tile reads a value once its
// serial is this forward's: the value and its tag arrive in one single-copy-atomic load, so no count, fence or
// barrier stands between the adapter tiles' stores and the weight tiles' reads (bench/NOTES.md, run 163). Each
// adapter GEMM of a forward has a t of its own, so that a tag names one launch.
__host__ __device__ inline unsigned long long tag_t(float value, unsigned serial) {
#ifdef __CUDA_ARCH__
  return (static_cast<unsigned long long>(serial) << 32) | __float_as_uint(value);
#else
  unsigned bits;
  __builtin_memcpy(&bits, &value, 4);
  return (static_cast<unsigned long long>(serial) << 32) | bits;
#endif
}
// The rows a GEMM of n_rows output rows streams with a fused adapter of total_rank factor rows: the weight's tiles,
// then the adapter's (GemmParams::adapter_tiles).
inline int adapter_tile_count(int total_rank) { return (total_rank + kGemmTileRows - 1) / kGemmTileRows; }
inline int gemm_rows(int n_rows, int total_rank) {
  return ((n_rows + kGemmTileRows - 1) / kGemmTileRows + adapter_tile_count(total_rank)) * kGemmTileRows;
}

// Per-tile partials of the logits epilogue: max logit, sum of exp(logit - max), argmax.
struct ArgmaxPartial {
  float max;
  float sum;
  int index;
};

struct GemmParams {
  const bf16* weight;  // tiled (weights.cuh): tiled_elements(n_rows, k); null when weight_fp8 is set
  // An FP8 model's weight instead: e4m3 in the FP8 tiled layout (weights.cuh, tiled_fp8_bytes(n_rows, k)), and
  // [n_rows] fp32 scales by which the epilogue multiplies each output row (before the bias and the adapter).
  const uint8_t* weight_fp8;
  const float* weight_scale;
  int n_rows;          // rows of `weight` (the silu_mul layout: ceil(inter / 8) tiles of 8 gate + 8 up rows)
  int n_out;           // valid output columns: n_rows, or `inter` for silu_mul
  int k;               // multiple of 8
  const bf16* bias;    // optional [n_rows]
  const StepState* state;  // row count: state->rows, or state->logit_count for the logits epilogue

  // Input rows: bf16 [rows][x_stride], or for rmsnorm_residual the fp32 residual [rows][x_stride]
  // normalised by norm_weight with the sum of squares from ssq_in[part][row] summed over ssq_in_parts.
  const bf16* x;
  const float* residual_in;
  int x_stride;
  const float* ssq_in;
  int ssq_in_parts;
  const bf16* norm_weight;
  float norm_eps;
  bool use_row_map;  // logits: token row t reads input row state->logit_rows[logit_first + t]
  // logits: this launch's first logits row. A forward of more than kMaxRows logits rows runs the lm_head in passes of
  // kMaxRows, each with its own `logits` and `argmax_out` (DeviceModel::enqueue_forward); token row t of a pass is
  // logits row logit_first + t, and a pass takes min(state->logit_count - logit_first, kMaxRows) of them.
  int logit_first;

  // Outputs.
  bf16* out;            // store_bf16 / silu_mul: [rows][out_stride]
  int out_stride;
  float* residual_out;  // residual_add: residual[rows][out_stride] += result
  float* ssq_out;       // residual_add: [n_tiles][kMaxRows] sums of squares of the new residual rows
  float* logits;        // logits: [rows][out_stride] when state->write_logits
  ArgmaxPartial* argmax_out;  // logits: [n_tiles][kMaxRows]
  int mask_token_id;          // logits: excluded from the argmax (its logit counts as -inf)

  // rope_qkv: rows are heads of head_dim (q heads, then k, then v), q and k in rope-pair order; row t sits at its
  // position in its sequence (step_state.cuh), its k and v in its sequence's slot. head_dim is a multiple of 16 and
  // needs no padding.
  const float2* rope_table;  // [max_context][head_dim / 2] (cos, sin)
  int head_dim;
  int num_heads;
  int num_kv_heads;
  int max_context;
  bf16* q_out;    // [rows][num_heads][head_dim]
  bf16* k_cache;  // slot 0's [num_kv_heads][max_context][head_dim] of this layer
  bf16* v_cache;
  size_t kv_slot_stride;  // elements from one slot's cache of this layer to the next's

  // A row adapter fused into this GEMM (docs/model-format.md): the weight holds `adapter_tiles` more 16-row
  // tiles after its ceil(n_rows / 16) tiles, the factors A of the targets this GEMM carries stacked
  // [adapter_total_rank][k] in the same layout. Those tiles' blocks, every K split of them, take the lowest
  // linear block indices, so they are dispatched before every weight tile's, and their epilogue writes
  // t[token row][i] = (A x)[i] for the token rows the adapter acts on (window rows: t >= state->commit; with
  // adapter_mask_token >= 0 only those holding it) and 0 for the others, each tagged with the forward's serial
  // (tag_t). Every weight tile's epilogue reads the t values it needs until their tags are this forward's and adds,
  // before its own work, sum_i adapter_b[n][i] * t[row][adapter_offset[n] + i] to its output row n (on tensor cores,
  // t as a bf16 pair of high part and rest). adapter_tiles 0: no adapter. The GEMM's plan (kernel, splits) is the
  // weight's alone; the adapter's tiles ride it.
  int adapter_tiles;
  const bf16* adapter_b;      // [n_rows][adapter_rank]: each output row's own target's B row (zeros: none)
  const int* adapter_offset;  // [n_rows]: where that target's factors start in t's row
  int adapter_rank;           // rank of one target
  int adapter_total_rank;     // t's row length: the ranks of every target this GEMM carries
  unsigned long long* adapter_t;  // [kMaxRows][adapter_total_rank] tagged values (tag_t), this GEMM's own
  int adapter_mask_token;

  // Split K (set by gemm() from the tuning): [n_tiles][splits][kMaxRows][16] fp32 partials and one
  // arrival counter per tile, zero between launches (the last block resets it).
  float* split_partials;
  unsigned* split_counters;
  int splits;
  int chunks_per_split;
  bool stage_ssq;  // GemmTuning::stage_ssq

  // Per-block timing records (trace.cuh; written only by builds with A2D_GEMM_TRACE) and which GEMM of
  // the forward this is.
  GemmTrace trace;
  int site;
};

// `max_rows` (<= kMaxRows) fixes the tensor-core tile count; state->rows may be smaller at run time.
void gemm(const GemmParams& params, GemmInput input, GemmEpilogue epilogue, int max_rows, const GemmTuning& tuning,
          cudaStream_t stream, bool pdl);

}  // namespace a2d::cuda
