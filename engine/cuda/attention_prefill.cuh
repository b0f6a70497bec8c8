// Causal attention of a prompt chunk's rows over the KV cache (which already holds the chunk's own k and v):
// token row t at position cached + t sees keys 0..cached + t. attention.cu is shaped for a few query rows
// (a split over the KV length, then a combine); here the rows alone fill the GPU, so a block takes 64 query
// rows (tokens x the q heads of one KV head's group, which share every K/V tile) and walks the key tiles up
// to its last token's position with an online softmax (flash attention), writing normalised rows.
// Blocks of the latest tokens, which see the most keys, are scheduled first.
#pragma once

#include "common.cuh"

namespace a2d::cuda {

struct PrefillAttentionParams {
  const bf16* q;        // [rows][num_heads][head_dim_padded], roped
  const bf16* k_cache;  // [num_kv_heads][max_context][head_dim_padded] of this layer
  const bf16* v_cache;
  int max_context;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int head_dim_padded;  // 32, 64 or 128
  float scale;          // 1 / sqrt(head_dim)
  int cached;           // positions before the chunk
  int rows;             // the chunk's tokens
  bf16* out;            // [rows][num_heads * head_dim]
};

// Raises the kernels' shared-memory limits; call once per process before the first launch.
void attention_prefill_prepare();

void attention_prefill(const PrefillAttentionParams& params, cudaStream_t stream);

}  // namespace a2d::cuda
