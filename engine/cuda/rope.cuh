// RoPE (HF rotate-half layout) on the q and k heads of the fused QKV output, with the optional per-head
// QK-norm (qwen3) before it; writes the roped q for attention and appends k and v to the KV cache at
// the rows' absolute positions, each in its own sequence's slot (step_state.cuh). Heads are stored padded to
// `head_dim_padded` (a multiple of 32, zeros beyond head_dim) so attention works on whole tensor-core tiles for
// any head size.
#pragma once

#include "common.cuh"
#include "step_state.cuh"

namespace a2d::cuda {

struct RopeParams {
  const bf16* qkv;  // [rows][(num_heads + 2 * num_kv_heads) * head_dim]: q heads, k heads, v heads
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int head_dim_padded;
  const float2* rope_table;  // [max_context][head_dim / 2]: (cos, sin) of position * inv_freq[i]
  const bf16* q_norm;        // optional [head_dim]
  const bf16* k_norm;        // optional [head_dim]
  float norm_eps;
  const StepState* state;
  bf16* q_out;    // [rows][num_heads * head_dim_padded]
  bf16* k_cache;  // slot 0's [num_kv_heads][max_context][head_dim_padded] of this layer
  bf16* v_cache;
  int max_context;
  size_t kv_slot_stride;  // elements from one slot's cache of this layer to the next's (each row writes its own slot's)
};

void rope(const RopeParams& params, int max_rows, cudaStream_t stream, bool pdl);

// Fills `table` ([max_context][head_dim / 2] float2) with cos and sin of float(position) * inv_freq[i],
// inv_freq[i] = 1 / theta^(2i / head_dim) rounded to fp32 as the PyTorch reference computes it.
void fill_rope_table(float2* table, int max_context, int head_dim, double theta, cudaStream_t stream);

}  // namespace a2d::cuda
