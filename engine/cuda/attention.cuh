// Attention of the forward's rows over the KV cache (which already holds this forward's own k and v),
// split over the KV length (flash-decoding): each block handles one KV head, one slice of keys and up to
// 64 query rows, and leaves an unnormalised partial; `attention_combine` merges the slices.
//
// Query rows are (token, q head of the KV head's group) pairs, so grouped-query attention shares each
// K/V tile across the whole group. The mask is the block-causal rule of docs/decoding.md: commit row t
// sees keys at positions <= cached + t, window rows see every key of this forward. The split count is
// fixed when a graph is captured; the slice length follows the KV length read from device memory. A forward of
// several sequences (step_state.cuh) runs each sequence's rows in blocks of their own, over its own slot's keys
// (split by its own KV length).
#pragma once

#include "common.cuh"
#include "step_state.cuh"

namespace a2d::cuda {

// When attention and its combine let the next kernel's blocks be scheduled (at their start; those blocks still
// wait for their completion), so that the o GEMM streams its weights while they run. short_kv: where at most
// a quarter of the splits hold keys (few attention blocks have work, so the o GEMM's blocks take no SM they
// need; at 132 SMs and 4 rows, KV up to about 2k).
enum class AttentionTrigger : int { never = 0, short_kv = 1, always = 2 };

struct AttentionParams {
  const bf16* q;  // [rows][num_heads * head_dim_padded], roped
  const bf16* k_cache;  // slot 0's [num_kv_heads][max_context][head_dim_padded] of this layer
  const bf16* v_cache;
  int max_context;
  size_t kv_slot_stride;  // elements from one slot's cache of this layer to the next's
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int head_dim_padded;  // 32, 64 or 128
  float scale;          // 1 / sqrt(head_dim)
  const StepState* state;
  int max_splits;    // grid x
  int row_capacity;  // max rows * group size: stride of the partials
  float* partial_o;   // [max_splits][num_kv_heads][row_capacity][head_dim_padded]
  float2* partial_ml;  // [max_splits][num_kv_heads][row_capacity]: (running max in log2 units, sum)
  bf16* out;           // combine: [rows][num_heads * head_dim]
  AttentionTrigger early_trigger;
  // Fewer than 64 query rows per block and more than one key tile per split: idle warps split each key tile
  // with the others (merged through shared memory) rather than running empty row tiles.
  bool split_keys;
  // A row adapter's rule (docs/decoding.md): a window row whose token is not this one skips the window positions
  // that hold it, and attends causally under the mask adapter's rule (`revealed_rule_causal`), to every other
  // window position under the window adapter's. -1: no row adapter (every window row sees the window).
  int revealed_rule_mask_token;
  bool revealed_rule_causal;
  // Combine at most kWarpCombineSplits (16) splits with one warp per query row (ModelOptions::attention_warp_combine).
  bool warp_combine = true;
  // Copy a split's first key tile before waiting for the previous kernel (PDL) where every key of it was cached
  // before this forward: the kernels before attention in a forward write only its own rows' keys.
  bool prefetch_cached = false;
};

// Sets the kernels' shared-memory limits; call once per process before the first launch.
void attention_prepare();

// Split count that gives about two blocks per SM when the KV is long, for forwards of up to max_rows rows of up to
// max_entries sequences. The blocks of query rows it divides by are the grid's bound (attention_row_blocks), or with
// `typical_blocks` the blocks a forward of several sequences mostly runs: the larger of the rows' blocks and the
// sequences (each sequence's rows in one block at block 4), which the bound counts twice.
int attention_max_splits(int max_rows, int max_entries, int num_heads, int num_kv_heads, int sm_count,
                         bool typical_blocks = false);

// max_entries: the most sequences a forward of this launch holds (1: one; the grid then has a block of query rows
// more for each).
void attention(const AttentionParams& params, int max_rows, int max_entries, cudaStream_t stream, bool pdl);
void attention_combine(const AttentionParams& params, int max_rows, cudaStream_t stream, bool pdl);

}  // namespace a2d::cuda
