// The model config: one struct read from config.json (docs/model-format.md), mirrored by the Python
// reference in convert/. Everything the backends need to know about the architecture lives here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace a2d {

// The choices of engine/decoding-params.json, in the table's order (decode_params.h names and parses them).
enum class Remasking { low_confidence, random, leftmost };
enum class Advance { block, slide };
// "a2d.precision" (docs/model-format.md): bf16, the projections in a float dtype (bf16, or f16/f32); fp8_e4m3,
// every projection and the lm_head stored as e4m3 with one fp32 scale per output row.
enum class WeightPrecision { bf16, fp8_e4m3 };
enum class CommitPolicy { fused, separate };
enum class RevealOrder { any, prefix };
// Which rows a row adapter's factors act on (ModelConfig::adapter_rule): none, the rows holding the mask token,
// or every window row; each with its attention rule for the window rows holding a real token. The window rule
// (a2d.window_rule) is `window` with no factors (adapter_rank 0).
enum class AdapterRule { none, mask, window };
const char* adapter_rule_name(AdapterRule rule);  // "none", "mask", "window"

// Decoding parameters of docs/decoding.md (defined in engine/decoding-params.json; the defaults below are
// the table's, which a test checks). The config's "a2d.decoding" section gives a model's defaults; a request
// overrides any of them.
struct DecodeParams {
  int block_size = 4;
  double threshold = 0.9;
  int min_per_step = 1;
  int steps = 0;  // 0: no top-k schedule
  double temperature = 0.0;
  double top_p = 1.0;
  Remasking remasking = Remasking::low_confidence;
  Advance advance = Advance::block;
  CommitPolicy commit = CommitPolicy::fused;
  RevealOrder reveal_order = RevealOrder::any;
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
  // A row adapter (docs/model-format.md): low-rank factors on these projections, added only on the rows its
  // rule names, with an attention rule for the window rows holding real tokens (docs/decoding.md). "a2d.mask_adapter":
  // the rows holding the mask token, revealed rows causal over revealed positions; "a2d.window_adapter": every
  // window row, the window opening with its anchor, revealed rows seeing every revealed position. rank 0: no
  // factors (with `window`: "a2d.window_rule", the window adapter's window and attention rule alone).
  AdapterRule adapter_rule = AdapterRule::none;
  int adapter_rank = 0;
  std::vector<std::string> adapter_targets;  // in the order q, k, v, o, gate, up, down (a subset)
  bool has_adapter(const std::string& target) const;
  // The window starts at the anchor, the last finished token, which enters the cache one move later.
  bool anchor_in_window() const { return adapter_rule == AdapterRule::window; }
  WeightPrecision precision = WeightPrecision::bf16;
};

// "bf16" or "fp8-e4m3", as config.json spells it.
const char* precision_name(WeightPrecision precision);

// The projections a row adapter may target, in their fixed order.
extern const char* const kAdapterTargets[7];

// Reads and validates `dir/config.json`. Throws std::runtime_error naming the file, the field and the fix.
ModelConfig read_config(const std::string& config_path);

}  // namespace a2d
