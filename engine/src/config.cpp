#include "config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <vector>

#include "decode_params.h"

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

  // Every key not read or ignored is a field the engine would silently mis-handle; `fixes` names the fix
  // for the ones seen in real checkpoints.
  void reject_unknown(const std::string& fix, const std::map<std::string, std::string>& fixes = {}) const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (used_.count(it.key()) != 0) continue;
      const auto known = fixes.find(it.key());
      fail(it.key(), "is not supported by the a2d engine; " + (known != fixes.end() ? known->second : fix));
    }
  }

  // The keys read so far, present or not (every reader records its key before looking it up).
  const std::set<std::string>& read() const { return used_; }

 private:
  const json& object_;
  std::string file_;
  std::string prefix_;
  std::set<std::string> used_;
};

// engine/supported-config.json, compiled in (engine/CMakeLists.txt): the architectures, the fields read
// below, the metadata fields that do not change the forward pass (HF bookkeeping, generation defaults),
// and the fix for fields known to change it (MiniCPM's muP scales, say). The converter's `import` refuses
// from the same file, so a base the engine would refuse never gets converted.
const char kSupportedConfigJson[] =
#include "supported_config.inc"
    ;

struct ArchitectureSwitches {
  std::string architecture;
  std::string model_type;
  bool qk_norm;
};

struct SupportedConfig {
  std::vector<ArchitectureSwitches> architectures;
  std::set<std::string> fields;
  std::vector<std::string> metadata;
  std::map<std::string, std::string> refused;  // field -> the fix
};

const SupportedConfig& supported_config() {
  static const SupportedConfig supported = [] {
    const json file = json::parse(kSupportedConfigJson);
    SupportedConfig s;
    for (const auto& a : file.at("architectures")) {
      s.architectures.push_back({a.at("architecture"), a.at("model_type"), a.at("qk_norm")});
    }
    s.fields = file.at("fields").get<std::set<std::string>>();
    s.metadata = file.at("metadata").get<std::vector<std::string>>();
    s.refused = file.at("refused").get<std::map<std::string, std::string>>();
    return s;
  }();
  return supported;
}

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

// a2d.decoding: every parameter of engine/decoding-params.json that has a default, by the table's ranges and
// choices; the rest of the table's parameters are per request, and anything else is refused by name.
void read_decoding_defaults(Fields d, DecodeParams& p) {
  for (const ParamSpec& spec : decoding_specs()) {
    if (!spec.has_default || spec.name == "seed") continue;
    if (spec.type == "choice") {
      const std::string value = d.string_or(spec.name, spec.default_choice);
      const bool known = (spec.name == "remasking" && parse_remasking(value, &p.remasking)) ||
                         (spec.name == "advance" && parse_advance(value, &p.advance)) ||
                         (spec.name == "commit" && parse_commit(value, &p.commit)) ||
                         (spec.name == "reveal_order" && parse_reveal_order(value, &p.reveal_order));
      if (!known) d.fail(spec.name, "= '" + value + "'; use " + choice_problem(spec, value));
      continue;
    }
    const double value = spec.type == "integer"
                             ? static_cast<double>(d.integer_or(spec.name, INT64_MIN, INT64_MAX, static_cast<int64_t>(spec.default_number)))
                             : d.number_or(spec.name, -HUGE_VAL, HUGE_VAL, spec.default_number);
    const std::string problem = range_problem(spec, value, p.block_size);
    if (!problem.empty()) d.fail(spec.name, "must be " + problem);
    if (spec.name == "threshold") p.threshold = value;
    else if (spec.name == "min_per_step") p.min_per_step = static_cast<int>(value);
    else if (spec.name == "steps") p.steps = static_cast<int>(value);
    else if (spec.name == "temperature") p.temperature = value;
    else if (spec.name == "top_p") p.top_p = value;
    else throw std::logic_error("a2d.decoding: the engine does not read the table's parameter '" + spec.name + "'");
  }
  const std::string rule = broken_rule(p);
  if (!rule.empty()) d.fail(decoding_spec("remasking").name, "with the rest of a2d.decoding breaks the rule " + rule + ": " + rule_message(rule));
  for (const char* retired : {"tree_width", "lookup_ngram"}) {
    if (d.has(retired)) {
      d.fail(retired, "belonged to remasking 'verify' / 'tree', which a2d no longer has (they accepted a draft when a causal "
                      "reading agreed with it: left-to-right decoding); `python -m a2d_convert redecode --model DIR "
                      "--remasking low_confidence` rewrites the model's default");
    }
  }
  d.reject_unknown("see docs/decoding.md for the decoding parameters");
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
  const ParamSpec& block = decoding_spec("block_size");
  config.decoding.block_size = static_cast<int>(a2d.integer("block_size", static_cast<int64_t>(block.min), std::stoi(block.max)));
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
    read_decoding_defaults(Fields(decoding, file, "a2d.decoding."), config.decoding);
  } else {
    a2d.ignore("decoding");
  }
  for (const AdapterRule rule : {AdapterRule::mask, AdapterRule::window}) {
    const std::string section = std::string(adapter_rule_name(rule)) + "_adapter";
    if (!a2d.has(section)) continue;
    if (config.adapter_rule != AdapterRule::none) {
      a2d.fail(section, "is given beside a2d.mask_adapter; a model has one adapter (docs/model-format.md)");
    }
    const json& adapter = a2d.raw(section);
    if (!adapter.is_object()) a2d.fail(section, "must be an object {\"rank\", \"targets\"}");
    Fields m(adapter, file, "a2d." + section + ".");
    config.adapter_rule = rule;
    config.adapter_rank = static_cast<int>(m.integer("rank", 1, 256));
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
          std::find(std::begin(kAdapterTargets), std::end(kAdapterTargets), name) == std::end(kAdapterTargets)) {
        m.fail("targets", "holds '" + name + "'; use each of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj at most once");
      }
    }
    for (const char* name : kAdapterTargets) {
      if (std::find(listed.begin(), listed.end(), name) != listed.end()) config.adapter_targets.push_back(name);
    }
    m.reject_unknown("an adapter has only 'rank' and 'targets'");
  }
  if (a2d.boolean_or("window_rule", false)) {
    if (config.adapter_rule != AdapterRule::none) {
      a2d.fail("window_rule", "is given beside an adapter; the window rule is the window adapter's rule without its factors, "
                              "so a model has one or the other (docs/model-format.md)");
    }
    config.adapter_rule = AdapterRule::window;
  }
  if (config.anchor_in_window() && !config.shift_logits) {
    a2d.fail(config.adapter_rank > 0 ? "window_adapter" : "window_rule",
             "needs shift_logits true: its anchor row predicts the window's first position");
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

const char* const kAdapterTargets[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

const char* adapter_rule_name(AdapterRule rule) {
  switch (rule) {
    case AdapterRule::none:
      return "none";
    case AdapterRule::mask:
      return "mask";
    case AdapterRule::window:
      return "window";
  }
  return "?";
}

const char* precision_name(WeightPrecision precision) {
  return precision == WeightPrecision::fp8_e4m3 ? "fp8-e4m3" : "bf16";
}

bool ModelConfig::has_adapter(const std::string& target) const {
  return std::find(adapter_targets.begin(), adapter_targets.end(), target) != adapter_targets.end();
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
  const SupportedConfig& supported = supported_config();
  const ArchitectureSwitches* arch = nullptr;
  std::string names;
  for (const auto& a : supported.architectures) {
    if (config.architecture == a.architecture) arch = &a;
    names += (names.empty() ? "" : ", ") + a.architecture;
  }
  if (arch == nullptr) {
    fields.fail("architectures", "names '" + config.architecture + "', which a2d does not support; supported: " + names);
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

  if (!fields.has("a2d")) {
    throw std::runtime_error(path + ": has no 'a2d' section, so it is not an a2d model; make one "
                                    "with `python -m a2d_convert init --base HF_DIR --out DIR`");
  }
  read_a2d_section(fields.raw("a2d"), path, config);
  // What this function reads and what supported-config.json lists must be the same set: the converter
  // accepts exactly the listed fields.
  if (fields.read() != supported.fields) {
    std::string differ;
    for (const auto& key : fields.read()) {
      if (supported.fields.count(key) == 0) differ += " '" + key + "' (read, not listed)";
    }
    for (const auto& key : supported.fields) {
      if (fields.read().count(key) == 0) differ += " '" + key + "' (listed, not read)";
    }
    throw std::logic_error("engine/supported-config.json 'fields' and engine/src/config.cpp disagree:" + differ);
  }
  for (const auto& key : supported.metadata) fields.ignore(key);
  fields.reject_unknown("remove it if it is metadata, or use a model whose config a2d supports "
                        "(docs/model-format.md)", supported.refused);
  return config;
}

}  // namespace a2d
