// The model config: one struct read from config.json (docs/model-format.md), mirrored by the Python
// reference in convert/. Everything the backends need to know about the architecture lives here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace a2d {

enum class Remasking { low_confidence, random, leftmost, verify, tree };
// "a2d.precision" (docs/model-format.md): bf16, the projections in a float dtype (bf16, or f16/f32); fp8_e4m3,
// every projection and the lm_head stored as e4m3 with one fp32 scale per output row.
enum class WeightPrecision { bf16, fp8_e4m3 };
enum class CommitPolicy { fused, separate };

// Decoding parameters of docs/decoding.md. The config's "a2d.decoding" section gives the defaults; a
// request overrides any of them.
struct DecodeParams {
  int block_size = 4;
  double threshold = 0.9;
  int min_per_step = 1;
  int steps = 0;  // 0: no top-k schedule
  double temperature = 0.0;
  double top_p = 1.0;
  Remasking remasking = Remasking::low_confidence;
  CommitPolicy commit = CommitPolicy::fused;
  int tree_width = 1;  // remasking tree: guesses for the first position (docs/decoding.md, "Tree")
  int lookup_ngram = 0;  // verify and tree: drafts from the context's latest match of its last 1..n tokens; 0: none
  int64_t max_tokens = 0;
  uint64_t seed = 0;
  std::vector<int32_t> eos_token_ids;
  bool trace = false;
};

struct ModelConfig {
  std::string architecture;  // architectures[0], e.g. "LlamaForCausalLM"
  std::string model_type;    // "llama" | "qwen2" | "qwen3"
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // q, k, v projections carry a bias
  bool o_bias = false;    // o projection carries a bias
  bool qk_norm = false;   // per-head RMSNorm on q and k before RoPE (qwen3)

  // The "a2d" section.
  int format_version = 1;
  int32_t mask_token_id = -1;
  std::string mask_token;
  bool shift_logits = true;
  bool trained = false;
  DecodeParams decoding;  // defaults; block_size and eos_token_ids filled from the section
  // "a2d.mask_adapter" (docs/model-format.md): low-rank factors on these projections, added only on rows
  // that hold the mask token; revealed window rows attend causally over revealed positions. rank 0: none.
  int mask_adapter_rank = 0;
  std::vector<std::string> mask_adapter_targets;  // in the order q, k, v, o, gate, up, down (a subset)
  bool has_mask_adapter(const std::string& target) const;
  WeightPrecision precision = WeightPrecision::bf16;
};

// "bf16" or "fp8-e4m3", as config.json spells it.
const char* precision_name(WeightPrecision precision);

// The projections a mask adapter may target, in their fixed order.
extern const char* const kMaskAdapterTargets[7];

// Reads and validates `dir/config.json`. Throws std::runtime_error naming the file, the field and the fix.
ModelConfig read_config(const std::string& config_path);

// The names docs/decoding.md gives the remasking rules: "low_confidence", "random", "leftmost", "verify",
// "tree".
const char* remasking_name(Remasking remasking);
// false when `name` is none of them.
bool parse_remasking(const std::string& name, Remasking* out);

// Verify and tree confirm tokens by the model's reading (docs/decoding.md, "Verify").
inline bool confirms_by_reading(Remasking remasking) {
  return remasking == Remasking::verify || remasking == Remasking::tree;
}

// Rows of the largest tree window (docs/decoding.md, "Tree"): W(B-1) nodes and a group of B masks for the
// root and each node. A tree window holds at most 64 rows (one bit each in ForwardArgs::window_visible).
inline int64_t tree_window_rows(int64_t block_size, int64_t tree_width) {
  const int64_t nodes = tree_width * (block_size - 1);
  return nodes + block_size * (nodes + 1);
}
constexpr int64_t kMaxTreeWindow = 64;
// Rows of the largest tree window of these parameters: tree_width branches, one more with lookup_ngram.
inline int64_t tree_window_rows(const DecodeParams& p) {
  return tree_window_rows(p.block_size, p.tree_width + (p.lookup_ngram > 0 ? 1 : 0));
}

// Checks decoding parameters against the ranges of docs/decoding.md; throws naming the parameter.
void validate_decode_params(const DecodeParams& params, const ModelConfig& config);

}  // namespace a2d
