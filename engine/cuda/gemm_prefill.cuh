// Many-row GEMM for prompt chunks (hundreds to thousands of token rows): out[t, n] = sum_k x[t, k] * W[n, k]
// on the tensor cores, reading the weights in the tiled layout of weights.cuh that the decode GEMMs stream.
//
// Why not cuBLASLt: the engine keeps each weight once, in that fragment layout, which no library reads; a
// row-major copy would add the model's size again in device memory (or an untiling pass per forward), the
// FP8 weight-only format has no cuBLASLt mode (its FP8 GEMMs want both operands in FP8), and the library
// (about half a gigabyte for libcublasLt) would ship in the offline folder and load at every cold start.
// The target, 20k prompt tokens/s on the 2B shape, is about 100 TFLOP/s: a tenth of the tensor cores.
//
// A block multiplies 128 weight rows (8 tiles) by 32, 64 or 128 token rows (PrefillShape), 64 k per stage through
// a cp.async ring in shared memory (weights and inputs both 512 contiguous bytes per warp read, no bank
// conflicts); each of its 8 warps owns 4 tiles x a quarter of the tokens and runs the epilogue from its
// registers. Fragments are those of the decode GEMMs (mma.sync m16n8k16, the weight as the 16-row A operand,
// the k permutation of gemm.cu), so a thread holds output rows g and g + 8 of a tile for the same tokens: the
// RoPE pairs of the rope-pair row order and the gate/up pairs of the SiLU layout meet in one thread, and the
// epilogues compute what the decode GEMMs' epilogues compute.
#pragma once

#include "common.cuh"
#include "step_state.cuh"
#include "trace.cuh"

namespace a2d::cuda {

enum class PrefillEpilogue { store_bf16, silu_mul, residual_add, rope_qkv };

struct PrefillGemmParams {
  const bf16* weight;  // tiled (weights.cuh): tiled_elements(n_rows, k)
  int n_rows;          // weight rows (the silu_mul layout: gate and up rows interleaved 8 by 8)
  int n_out;           // valid output columns: n_rows, or the intermediate size for silu_mul
  int k;               // multiple of 8
  const bf16* bias;    // optional [n_rows], in the weight's row order
  const bf16* x;       // [rows][x_stride] bf16 input rows
  int x_stride;
  int rows;            // token rows

  bf16* out;        // store_bf16 / silu_mul: [rows][out_stride]
  int out_stride;
  float* residual;  // residual_add: residual[rows][out_stride] += result

  // rope_qkv: the QKV projection with q and k rows in rope-pair order (weights.cuh); token row t sits at
  // position and cache slot cached + t. head_dim is a multiple of 16 and needs no padding.
  const float2* rope_table;  // [max_context][head_dim / 2] (cos, sin)
  int head_dim;
  int num_heads;
  int num_kv_heads;
  int max_context;
  int cached;
  bf16* q_out;    // [rows][num_heads][head_dim]
  bf16* k_cache;  // [num_kv_heads][max_context][head_dim]
  bf16* v_cache;
  // rope_qkv of a forward's rows (several sequences, step_state.cuh) instead of one prompt's: row t takes its
  // sequence's position (row_position) and KV slot (k_cache + slot x kv_slot_stride), `cached` unused; rows from
  // state->rows up to `rows` (a captured graph's row bucket) write nothing.
  const StepState* state;
  size_t kv_slot_stride;

  // Split K (prefill_split): 0 or every step in one block; otherwise each block of grid.z takes this many 64-k
  // steps, leaves its fp32 accumulators in `partial`, and the last of an output block's splits to arrive adds
  // them up in split order (the same sums whichever arrives last) and runs the epilogue. `counters` (one per
  // output block, zero) are left zero.
  int steps_per_split;
  float* partial;
  int* counters;
  // The warpgroup kernel at 64-token blocks only: > 1 launches each output block's splits as one thread-block
  // cluster of this many (grid.z, at most kMaxClusterSplits) that sum their accumulators through each other's
  // shared memory, each block one share of the output block's 16-row tiles, in split order (the same sums), and
  // run that share's epilogue: no partials, no counters, and no block left alone with the sums and the epilogue
  // (prefill_wgmma_cluster_split).
  int cluster_splits = 0;
  // The warpgroup kernel at 64-token blocks only: > 0 launches stream-K, a grid of this many blocks (a wave) that
  // share every (output block, 64-k step) pair equally, in order, so that a block may end one output block's steps,
  // run whole ones and start another's. An output block whose steps span several blocks has each leave its fp32
  // partial in `partial` (two places a block: 2 x stream_blocks partials of an output block) and the last to arrive
  // add them in block order (the same sums whichever arrives last) and run the epilogue; `counters` (one per output
  // block, zero) are left zero. steps_per_split and cluster_splits are 0 (prefill_wgmma_stream_split).
  int stream_blocks = 0;

  // Per-block timing records (trace.cuh), written by the warpgroup kernel of trace builds only, and which GEMM of
  // a decode forward this is (its `site`, as GemmParams::site).
  GemmTrace trace;
  int site = -1;
};

// A block's shape: token rows (32, 64 or 128), cp.async ring stages, blocks per SM (__launch_bounds__). The kernel
// is built at kPrefillShapes only. Run 120 (bench/NOTES.md, H100, the 2B layer's four GEMMs) timed them: at 32 rows
// 32-token blocks take 73 us a layer against 128 us for 128-token blocks (a block of 128 token rows holding 32 real
// ones issues four times the instructions that carry anything, and the block is issue-bound: run 121); at 64-160
// rows 64-token blocks two a SM are best; from 512 rows 128-token blocks. A deeper ring (6 stages) was slower everywhere.
struct PrefillShape {
  int block_tokens = 128;
  int stages = 4;
  int blocks_per_sm = 1;
};
inline constexpr PrefillShape kPrefillShapes[] = {{128, 4, 1}, {64, 3, 2}, {32, 4, 1}};

// The shape for a GEMM of `rows` token rows: the 128-token one for every call, or with `by_rows`
// (GemmTuning::prefill_shape_by_rows) 32 tokens up to 32 rows, 64 up to 256, then 128.
PrefillShape prefill_shape(int rows, bool by_rows);

// How a prefill GEMM splits K: into as many splits as keep its blocks within one wave of `blocks_per_sm` per SM,
// when its output blocks (the shape's tokens x 128 weight rows) fill at most half of that wave, each split at least
// kPrefillMinSplitSteps steps of 64 k. Few rows (a short prompt, the
// tail of a long one) otherwise leave most SMs idle, each streaming its whole K (bench/NOTES.md, run 86).
constexpr int kPrefillMinSplitSteps = 2;
struct PrefillSplit {
  int splits = 1;
  int steps_per_split = 0;  // 0: no split
  size_t partial_floats = 0;
  int counters = 0;
  bool cluster = false;  // the splits of an output block as one cluster (PrefillGemmParams::cluster_splits)
  int stream_blocks = 0;  // stream-K's grid (PrefillGemmParams::stream_blocks); splits and steps_per_split unused
};
PrefillSplit prefill_split(int rows, int n_rows, int k, int blocks_per_sm, int sm_count, PrefillShape shape = {});
// The rule both prefill kernels split by (prefill_split, prefill_wgmma_split): `blocks` output blocks against a wave
// of `wave` blocks, K in 64-k steps, each split's partial of an output block `floats_per_block` floats.
PrefillSplit plan_prefill_split(int blocks, int wave, int k, size_t floats_per_block);
// Throws where `epilogue` cannot run on `params` (the RoPE epilogue needs whole heads of a multiple of 16 dims);
// `caller` names the launcher in the message.
void check_prefill_epilogue(const PrefillGemmParams& params, PrefillEpilogue epilogue, const char* caller);

// Raises the kernels' shared-memory limit (every shape's, and the warpgroup kernel's); call once per process before
// the first launch.
void gemm_prefill_prepare();
void gemm_wgmma_prepare();

// `shape`: one of kPrefillShapes (std::invalid_argument otherwise); a split K (params.steps_per_split) planned by
// prefill_split for the same shape.
void gemm_prefill(const PrefillGemmParams& params, PrefillEpilogue epilogue, cudaStream_t stream, PrefillShape shape = {});

// The same GEMM on the warpgroup tensor cores with TMA loads (gemm_wgmma.cu, sm_90a): 128 weight rows and
// `block_tokens` (one of kWgmmaTokens) token rows a block, a split K (params.steps_per_split) planned by
// prefill_wgmma_split for the same block tokens, the same epilogues. k and x_stride multiples of 8, both operands
// 16-byte aligned. `pdl`: launched with programmatic dependent launch (common.cuh's launch); the kernel copies its
// first ring of weights before it waits for the previous kernel, and lets the next one be scheduled at once.
inline constexpr int kWgmmaTokens[] = {64, 128, 256};
void gemm_prefill_wgmma(const PrefillGemmParams& params, PrefillEpilogue epilogue, cudaStream_t stream, int block_tokens,
                        bool pdl = false);
// Whether the warpgroup kernel's sm_90a code runs here (a probe launch, once): false on other GPUs, or where the
// driver loaded the addon's sm_90 code.
bool gemm_wgmma_available();
// How the warpgroup kernel splits K: as prefill_split, towards one block per SM.
PrefillSplit prefill_wgmma_split(int rows, int n_rows, int k, int sm_count, int block_tokens);
// The same split with each output block's splits as one cluster (PrefillGemmParams::cluster_splits; 64-token
// blocks only, others keep the unclustered split): at most kMaxClusterSplits of them, and as many as let every
// output block's cluster be resident at once (a cluster's blocks share one GPC, one block an SM:
// cudaOccupancyMaxActiveClusters). Where no cluster of two or more fits that, the unclustered split.
inline constexpr int kMaxClusterSplits = 8;
PrefillSplit prefill_wgmma_cluster_split(int rows, int n_rows, int k, int sm_count, int block_tokens);
// Stream-K for calls of several 64-token blocks (PrefillGemmParams::stream_blocks: a wave of sm_count blocks,
// each an equal share of the (output block, 64-k step) pairs) where it ends sooner than `otherwise` (the split
// planned above): in steps of the busiest SM, ceil(pairs / sm_count) plus kStreamFixupSteps for the partials against
// otherwise's waves times its steps a block. Returns `otherwise` where it does not, and for calls of fewer than
// `min_token_blocks` token blocks (GemmTuning::prefill_wgmma_stream_min_blocks).
inline constexpr int kStreamFixupSteps = 2;
PrefillSplit prefill_wgmma_stream_split(int rows, int n_rows, int k, int sm_count, int block_tokens,
                                        const PrefillSplit& otherwise, int min_token_blocks = 2);
// The warpgroup kernel's block tokens for a call of `rows` rows of a weight of `n_rows` rows: 64 up to 64 rows;
// up to 256 rows, one token block of all of them (128 or 256) where the weight's 128-row blocks fill half the SMs
// (gate_up: its weights stream once) and 64 where they do not (qkv, o, down: the K split fills the SMs, and its
// reduction tail is shortest); above 256 rows 256 for such a wide weight, and for the others 128 up to 1,024 rows,
// then 256. (The 2B shape on the H100, bench/NOTES.md: at 512 rows every GEMM's best is 128 but gate_up's, 256
// (run 123); a 1,023-row prompt's gate_up 119 us a call at 256 against 147 at 128, qkv 88 against 82, o and down
// 71 against 60 together (run 164).)
inline int prefill_wgmma_tokens(int rows, int n_rows, int sm_count) {
  const bool wide = 2 * ((n_rows + 127) / 128) >= sm_count;
  if (rows <= 64) return 64;
  if (rows <= 256) return wide ? (rows <= 128 ? 128 : 256) : 64;
  return wide || rows > 1024 ? 256 : 128;
}

}  // namespace a2d::cuda
