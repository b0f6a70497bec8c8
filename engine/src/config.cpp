#include "config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "lookup.h"

namespace a2d {

namespace {

using nlohmann::json;

// Reads typed fields of one JSON object and remembers which were read, so that every field the
// engine does not understand can be rejected by name (docs/model-format.md).
class Fields {
 public:
  Fields(const json& object, std::string file, std::string prefix)
      : object_(object), file_(std::move(file)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw std::runtime_error(file_ + ": field '" + prefix_ + key + "' " + what);
  }

  bool has(const std::string& key) const {
    return object_.contains(key) && !object_.at(key).is_null();
  }

  const json& raw(const std::string& key) {
    used_.insert(key);
    return object_.at(key);
  }

  void ignore(const std::string& key) { used_.insert(key); }

  int64_t integer(const std::string& key, int64_t lo, int64_t hi) {
    if (!has(key)) fail(key, "is missing (required by a2d; see docs/model-format.md)");
    return integer_or(key, lo, hi, 0);
  }

  int64_t integer_or(const std::string& key, int64_t lo, int64_t hi, int64_t fallback) {
    used_.insert(key);
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_number_integer()) fail(key, "must be an integer");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      fail(key, "= " + std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
    }
    return x;
  }

  double number(const std::string& key, double lo, double hi) {
    if (!has(key)) fail(key, "is missing (required by a2d; see docs/model-format.md)");
    return number_or(key, lo, hi, 0.0);
  }

  double number_or(const std::string& key, double lo, double hi, double fallback) {
    used_.insert(key);
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    if (!v.is_number()) fail(key, "must be a number");
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) {
      fail(key, "= " + v.dump() + " is out of range [" + json(lo).dump() + ", " + json(hi).dump() + "]");
    }
    return x;
  }

  bool boolean_or(const std::string& key, bool fallback) {
    used_.insert(key);
    if (!has(key)) return fallback;
    if (!object_.at(key).is_boolean()) fail(key, "must be true or false");
    return object_.at(key).get<bool>();
  }

  std::string string_or(const std::string& key, const std::string& fallback) {
    used_.insert(key);
    if (!has(key)) return fallback;
    if (!object_.at(key).is_string()) fail(key, "must be a string");
    return object_.at(key).get<std::string>();
  }

  std::string string(const std::string& key) {
    if (!has(key)) fail(key, "is missing (required by a2d; see docs/model-format.md)");
    return string_or(key, "");
  }

  // Every key not read or ignored is a field the engine would silently mis-handle.
  void reject_unknown(const std::string& fix) const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (used_.count(it.key()) == 0) fail(it.key(), "is not supported by the a2d engine; " + fix);
    }
  }

 private:
  const json& object_;
  std::string file_;
  std::string prefix_;
  std::set<std::string> used_;
};

struct ArchitectureSwitches {
  const char* architecture;
  const char* model_type;
  bool qk_norm;
};

constexpr ArchitectureSwitches kArchitectures[] = {
    {"LlamaForCausalLM", "llama", false},
    {"Qwen2ForCausalLM", "qwen2", false},
    {"Qwen3ForCausalLM", "qwen3", true},
};

// HF bookkeeping and generation defaults that do not change the forward pass. Anything not listed and
// not read below is rejected: an unknown field may change the math (MiniCPM's muP scales, say).
const char* const kMetadataFields[] = {
    "_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "dtype", "torch_dtype", "transformers_version", "use_cache",
    "initializer_range", "attention_dropout", "chunk_size_feed_forward", "is_encoder_decoder",
    "is_decoder", "add_cross_attention", "cross_attention_hidden_size", "tie_encoder_decoder",
    "id2label", "label2id", "output_attentions", "output_hidden_states", "output_scores",
    "return_dict", "return_dict_in_generate", "problem_type", "finetuning_task", "tokenizer_class",
    "prefix", "task_specific_params", "torchscript", "use_bfloat16", "tf_legacy_loss", "pruned_heads",
    "max_window_layers", "sliding_window", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens",
};

void read_rope(Fields& fields, ModelConfig& config) {
  auto reject_scaling = [&](const std::string& key, const std::string& type) {
    fields.fail(key, "asks for RoPE scaling '" + type +
                         "', which a2d does not implement; use a model with plain RoPE");
  };
  const bool top_level_theta = fields.has("rope_theta");
  config.rope_theta = fields.number_or("rope_theta", 1.0, 1e12, 10000.0);
  if (fields.has("rope_scaling")) {
    const json& scaling = fields.raw("rope_scaling");
    const std::string type = scaling.is_object() ? scaling.value("rope_type", scaling.value("type", "?")) : "?";
    if (type != "default") reject_scaling("rope_scaling", type);
  } else {
    fields.ignore("rope_scaling");
  }
  if (fields.has("rope_parameters")) {
    const json& params = fields.raw("rope_parameters");
    if (!params.is_object()) fields.fail("rope_parameters", "must be an object");
    Fields rope(params, "config.json", "rope_parameters.");
    const std::string type = rope.string_or("rope_type", "default");
    if (type != "default") reject_scaling("rope_parameters.rope_type", type);
    const double theta = rope.number_or("rope_theta", 1.0, 1e12, config.rope_theta);
    if (top_level_theta && theta != config.rope_theta) {
      fields.fail("rope_parameters.rope_theta", "disagrees with the top-level rope_theta; keep one of them");
    }
    config.rope_theta = theta;
    rope.reject_unknown("plain RoPE takes only rope_type and rope_theta");
  } else {
    fields.ignore("rope_parameters");
  }
}

void read_a2d_section(const json& section, const std::string& file, ModelConfig& config) {
  if (!section.is_object()) {
    throw std::runtime_error(file + ": field 'a2d' must be an object (docs/model-format.md)");
  }
  Fields a2d(section, file, "a2d.");
  config.format_version = static_cast<int>(a2d.integer("format_version", 0, 1 << 30));
  if (config.format_version != 1) {
    a2d.fail("format_version", "= " + std::to_string(config.format_version) +
                                   " is not supported; re-export the model with this a2d version");
  }
  config.mask_token_id = static_cast<int32_t>(a2d.integer("mask_token_id", 0, config.vocab_size - 1));
  config.mask_token = a2d.string_or("mask_token", "");
  config.decoding.block_size = static_cast<int>(a2d.integer("block_size", 1, 64));
  config.shift_logits = a2d.boolean_or("shift_logits", true);
  config.trained = a2d.boolean_or("trained", false);
  if (!a2d.has("eos_token_ids") || !a2d.raw("eos_token_ids").is_array()) {
    a2d.fail("eos_token_ids", "must be an array of token ids");
  }
  for (const auto& id : a2d.raw("eos_token_ids")) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= config.vocab_size) {
      a2d.fail("eos_token_ids", "holds " + id.dump() + ", not a token id below vocab_size");
    }
    config.decoding.eos_token_ids.push_back(id.get<int32_t>());
  }
  if (a2d.has("decoding")) {
    const json& decoding = a2d.raw("decoding");
    if (!decoding.is_object()) a2d.fail("decoding", "must be an object");
    Fields d(decoding, file, "a2d.decoding.");
    DecodeParams& p = config.decoding;
    p.threshold = d.number_or("threshold", 0.0, 1.0, p.threshold);
    p.min_per_step = static_cast<int>(d.integer_or("min_per_step", 1, p.block_size, p.min_per_step));
    p.steps = static_cast<int>(d.integer_or("steps", 0, p.block_size, p.steps));
    p.temperature = d.number_or("temperature", 0.0, 2.0, p.temperature);
    p.top_p = d.number_or("top_p", 0.0, 1.0, p.top_p);
    if (p.top_p <= 0.0) d.fail("top_p", "must be in (0, 1]");
    const std::string remasking = d.string_or("remasking", "low_confidence");
    if (!parse_remasking(remasking, &p.remasking)) {
      d.fail("remasking", "= '" + remasking + "'; use 'low_confidence', 'random', 'leftmost', 'verify' or 'tree'");
    }
    const std::string commit = d.string_or("commit", "fused");
    if (commit == "fused") {
      p.commit = CommitPolicy::fused;
    } else if (commit == "separate") {
      p.commit = CommitPolicy::separate;
    } else {
      d.fail("commit", "= '" + commit + "'; use 'fused' or 'separate'");
    }
    p.tree_width = static_cast<int>(d.integer_or("tree_width", 1, 8, p.tree_width));
    p.lookup_ngram = static_cast<int>(d.integer_or("lookup_ngram", 0, kMaxLookupNgram, p.lookup_ngram));
    if (p.remasking == Remasking::tree && tree_window_rows(p) > kMaxTreeWindow) {
      d.fail("tree_width", "= " + std::to_string(p.tree_width) + (p.lookup_ngram > 0 ? " with lookup_ngram" : "") +
                               " at block_size " + std::to_string(p.block_size) +
                               " needs tree windows of more than 64 rows; lower it (docs/decoding.md, \"Tree\")");
    }
    if (confirms_by_reading(p.remasking) && !config.shift_logits) {
      d.fail("remasking", std::string("= '") + remasking_name(p.remasking) +
                              "' needs a2d.shift_logits true; use another remasking for this model");
    }
    if (confirms_by_reading(p.remasking) && p.commit != CommitPolicy::fused) {
      d.fail("commit", std::string("must be 'fused' with remasking '") + remasking_name(p.remasking) + "'");
    }
    d.reject_unknown("see docs/decoding.md for the decoding parameters");
  } else {
    a2d.ignore("decoding");
  }
  if (a2d.has("mask_adapter")) {
    const json& adapter = a2d.raw("mask_adapter");
    if (!adapter.is_object()) a2d.fail("mask_adapter", "must be an object {\"rank\", \"targets\"}");
    Fields m(adapter, file, "a2d.mask_adapter.");
    config.mask_adapter_rank = static_cast<int>(m.integer("rank", 1, 256));
    if (!m.has("targets") || !m.raw("targets").is_array() || m.raw("targets").empty()) {
      m.fail("targets", "must be a non-empty array of projection names (q_proj ... down_proj)");
    }
    std::vector<std::string> listed;
    for (const auto& t : m.raw("targets")) {
      if (!t.is_string()) m.fail("targets", "holds " + t.dump() + ", not a projection name");
      listed.push_back(t.get<std::string>());
    }
    for (const std::string& name : listed) {
      if (std::count(listed.begin(), listed.end(), name) != 1 ||
          std::find(std::begin(kMaskAdapterTargets), std::end(kMaskAdapterTargets), name) == std::end(kMaskAdapterTargets)) {
        m.fail("targets", "holds '" + name + "'; use each of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj at most once");
      }
    }
    for (const char* name : kMaskAdapterTargets) {
      if (std::find(listed.begin(), listed.end(), name) != listed.end()) config.mask_adapter_targets.push_back(name);
    }
    m.reject_unknown("a mask adapter has only 'rank' and 'targets'");
  }
  const std::string precision = a2d.string_or("precision", precision_name(WeightPrecision::bf16));
  if (precision == precision_name(WeightPrecision::fp8_e4m3)) {
    config.precision = WeightPrecision::fp8_e4m3;
  } else if (precision != precision_name(WeightPrecision::bf16)) {
    a2d.fail("precision", "= '" + precision + "'; use 'bf16' or 'fp8-e4m3' (docs/model-format.md)");
  }
  a2d.reject_unknown("see docs/model-format.md for the a2d section");
}

}  // namespace

const char* const kMaskAdapterTargets[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

const char* precision_name(WeightPrecision precision) {
  return precision == WeightPrecision::fp8_e4m3 ? "fp8-e4m3" : "bf16";
}

bool ModelConfig::has_mask_adapter(const std::string& target) const {
  return std::find(mask_adapter_targets.begin(), mask_adapter_targets.end(), target) != mask_adapter_targets.end();
}

ModelConfig read_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error(path + ": cannot open the model config; the model folder must hold "
                                    "config.json (docs/model-format.md)");
  }
  json root;
  try {
    root = json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!root.is_object()) throw std::runtime_error(path + ": must hold a JSON object");

  Fields fields(root, path, "");
  ModelConfig config;

  if (!fields.has("architectures") || !fields.raw("architectures").is_array() ||
      fields.raw("architectures").empty() || !fields.raw("architectures")[0].is_string()) {
    fields.fail("architectures", "must be a non-empty array of names, e.g. [\"LlamaForCausalLM\"]");
  }
  config.architecture = fields.raw("architectures")[0].get<std::string>();
  const ArchitectureSwitches* arch = nullptr;
  for (const auto& a : kArchitectures) {
    if (config.architecture == a.architecture) arch = &a;
  }
  if (arch == nullptr) {
    fields.fail("architectures", "names '" + config.architecture +
                                     "', which a2d does not support; supported: LlamaForCausalLM, "
                                     "Qwen2ForCausalLM, Qwen3ForCausalLM");
  }
  config.model_type = fields.string("model_type");
  if (config.model_type != arch->model_type) {
    fields.fail("model_type", "= '" + config.model_type + "' does not match architecture " +
                                  config.architecture + " (expected '" + arch->model_type + "')");
  }

  constexpr int64_t kMaxDim = 1 << 20;
  config.hidden_size = static_cast<int>(fields.integer("hidden_size", 1, kMaxDim));
  config.intermediate_size = static_cast<int>(fields.integer("intermediate_size", 1, kMaxDim));
  config.num_layers = static_cast<int>(fields.integer("num_hidden_layers", 1, 1024));
  config.num_heads = static_cast<int>(fields.integer("num_attention_heads", 1, 1024));
  config.num_kv_heads =
      static_cast<int>(fields.integer_or("num_key_value_heads", 1, config.num_heads, config.num_heads));
  if (config.num_heads % config.num_kv_heads != 0) {
    fields.fail("num_key_value_heads", "= " + std::to_string(config.num_kv_heads) +
                                           " must divide num_attention_heads = " +
                                           std::to_string(config.num_heads));
  }
  if (config.hidden_size % config.num_heads != 0 && !fields.has("head_dim")) {
    fields.fail("head_dim", "is missing and hidden_size is not a multiple of num_attention_heads");
  }
  config.head_dim = static_cast<int>(
      fields.integer_or("head_dim", 2, 4096, config.hidden_size / config.num_heads));
  if (config.head_dim % 2 != 0) fields.fail("head_dim", "must be even (RoPE rotates halves)");
  config.vocab_size = static_cast<int>(fields.integer("vocab_size", 1, 1 << 24));
  // Defaults as the PyTorch reference (convert/a2d_convert/config.py) takes them.
  config.max_position_embeddings =
      static_cast<int>(fields.integer_or("max_position_embeddings", 1, 1 << 24, 4096));
  config.rms_norm_eps = fields.number_or("rms_norm_eps", 0.0, 1.0, 1e-6);
  config.tie_word_embeddings = fields.boolean_or("tie_word_embeddings", false);
  const bool attention_bias = fields.boolean_or("attention_bias", false);
  config.qkv_bias = config.model_type == "qwen2" || attention_bias;
  config.o_bias = config.model_type != "qwen2" && attention_bias;
  config.qk_norm = arch->qk_norm;

  const std::string act = fields.string_or("hidden_act", "silu");
  if (act != "silu") fields.fail("hidden_act", "= '" + act + "'; a2d implements 'silu' only");
  if (fields.boolean_or("mlp_bias", false)) fields.fail("mlp_bias", "= true is not supported (no MLP biases)");
  if (fields.integer_or("pretraining_tp", 1, 1, 1) != 1) fields.fail("pretraining_tp", "must be 1");
  if (fields.boolean_or("use_sliding_window", false)) {
    fields.fail("use_sliding_window", "= true is not supported; a2d uses full attention in every layer");
  }
  if (fields.has("layer_types")) {
    for (const auto& t : fields.raw("layer_types")) {
      if (t != "full_attention") {
        fields.fail("layer_types", "holds " + t.dump() + "; a2d uses full attention in every layer");
      }
    }
  } else {
    fields.ignore("layer_types");
  }
  read_rope(fields, config);
  for (const char* key : kMetadataFields) fields.ignore(key);

  if (!fields.has("a2d")) {
    throw std::runtime_error(path + ": has no 'a2d' section, so it is not an a2d model; make one "
                                    "with `python -m a2d_convert init --base HF_DIR --out DIR`");
  }
  read_a2d_section(fields.raw("a2d"), path, config);
  fields.reject_unknown("remove it if it is metadata, or use a model whose config a2d supports "
                        "(docs/model-format.md)");
  return config;
}

const char* remasking_name(Remasking remasking) {
  switch (remasking) {
    case Remasking::low_confidence:
      return "low_confidence";
    case Remasking::random:
      return "random";
    case Remasking::leftmost:
      return "leftmost";
    case Remasking::verify:
      return "verify";
    case Remasking::tree:
      return "tree";
  }
  return "?";
}

bool parse_remasking(const std::string& name, Remasking* out) {
  for (Remasking r : {Remasking::low_confidence, Remasking::random, Remasking::leftmost, Remasking::verify, Remasking::tree}) {
    if (name == remasking_name(r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

void validate_decode_params(const DecodeParams& p, const ModelConfig& config) {
  auto bad = [](const std::string& what) { throw std::runtime_error("invalid decoding parameter: " + what); };
  if (p.block_size < 1 || p.block_size > 64) bad("block_size must be in 1..64");
  if (!(p.threshold >= 0.0 && p.threshold <= 1.0)) bad("threshold must be in [0, 1]");
  if (p.min_per_step < 1 || p.min_per_step > p.block_size) bad("min_per_step must be in 1..block_size");
  if (p.steps < 0 || p.steps > p.block_size) bad("steps must be in 0..block_size");
  if (!(p.temperature >= 0.0 && p.temperature <= 2.0)) bad("temperature must be in [0, 2]");
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) bad("top_p must be in (0, 1]");
  if (p.max_tokens < 0) bad("max_tokens must be >= 0");
  if (p.tree_width < 1 || p.tree_width > 8) bad("tree_width must be in 1..8");
  if (p.lookup_ngram < 0 || p.lookup_ngram > kMaxLookupNgram) bad("lookup_ngram must be in 0.." + std::to_string(kMaxLookupNgram));
  if (p.remasking == Remasking::tree && tree_window_rows(p) > kMaxTreeWindow) {
    bad("tree_width " + std::to_string(p.tree_width) + (p.lookup_ngram > 0 ? " with lookup_ngram" : "") + " at block_size " +
        std::to_string(p.block_size) + " needs windows of " + std::to_string(tree_window_rows(p)) +
        " rows, more than a tree window's 64; lower tree_width or block_size (docs/decoding.md, \"Tree\")");
  }
  const std::string name = std::string("remasking '") + remasking_name(p.remasking) + "'";
  if (confirms_by_reading(p.remasking) && !config.shift_logits) {
    bad(name + " needs a model with shift_logits (the row of a token predicts the next position)");
  }
  if (confirms_by_reading(p.remasking) && p.commit != CommitPolicy::fused) {
    bad(name + " commits the confirmed tokens in the next window's forward; use commit 'fused'");
  }
  for (int32_t id : p.eos_token_ids) {
    if (id < 0 || id >= config.vocab_size) bad("eos_token_ids holds " + std::to_string(id) + ", outside the vocabulary");
  }
}

}  // namespace a2d
