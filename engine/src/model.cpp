#include "model.h"

#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

namespace a2d {

namespace {

struct Located {
  const TensorInfo* info;
  const SafetensorsFile* file;
};

// Binds tensors by name, checking shape and dtype, and remembers which names were taken so the rest can
// be reported as unexpected.
class Binder {
 public:
  Binder(const Model& model) : config_path_(model.dir + "/config.json"), fp8_(model.config.precision == WeightPrecision::fp8_e4m3) {
    for (const auto& file : model.files) {
      for (const auto& [name, info] : file->tensors()) {
        auto [it, inserted] = index_.emplace(name, Located{&info, file.get()});
        if (!inserted) {
          throw std::runtime_error(file->path() + ": tensor '" + name + "' also appears in " +
                                   it->second.file->path() + "; keep one copy");
        }
      }
    }
  }

  Tensor take(const std::string& name, std::vector<int64_t> shape, const std::string& field) {
    Tensor t = take_any(name, shape, field);
    if (t.dtype == DType::i32 || t.dtype == DType::f8_e4m3) {
      throw std::runtime_error(index_.at(name).file->path() + ": tensor '" + name + "' has dtype " +
                               dtype_name(t.dtype) + "; weights must be BF16, F16 or F32" +
                               (t.dtype == DType::f8_e4m3 ? fp8_hint() : std::string()));
    }
    return t;
  }

  // The tensor `name` with exactly `shape`, in whatever dtype it is stored.
  Tensor take_any(const std::string& name, std::vector<int64_t> shape, const std::string& field) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      throw std::runtime_error("missing tensor '" + name + "' in the weights of " + config_path_ +
                               "'s model (expected by " + field + "); the weights do not match the config");
    }
    taken_.insert(name);
    const TensorInfo& info = *it->second.info;
    if (info.shape != shape) {
      throw std::runtime_error(it->second.file->path() + ": tensor '" + name + "' has shape " +
                               shape_text(info.shape) + " but " + config_path_ + " (" + field +
                               ") implies " + shape_text(shape) + "; the weights do not match the config");
    }
    Tensor t;
    t.dtype = info.dtype;
    t.shape = info.shape;
    t.data = it->second.file->data(info);
    t.name = name;
    return t;
  }

  // A projection or the lm_head: in an FP8 model (a2d.precision "fp8-e4m3") an F8_E4M3 matrix with its F32
  // per-row scale `<name>_scale`, otherwise a float tensor as take() binds it.
  Tensor take_weight(const std::string& name, std::vector<int64_t> shape, const std::string& field) {
    if (!fp8_) return take(name, shape, field);
    const auto it = index_.find(name);
    if (it != index_.end() && it->second.info->dtype != DType::f8_e4m3) {
      throw std::runtime_error(it->second.file->path() + ": tensor '" + name + "' has dtype " +
                               dtype_name(it->second.info->dtype) + " but " + config_path_ +
                               " says a2d.precision 'fp8-e4m3', which stores it as F8_E4M3; quantize the model again");
    }
    Tensor t = take_any(name, shape, field);
    const std::string scale_name = name + "_scale";
    const auto scale = index_.find(scale_name);
    if (scale == index_.end() || scale->second.info->dtype != DType::f32 ||
        scale->second.info->shape != std::vector<int64_t>{shape[0]}) {
      throw std::runtime_error("the FP8 weight '" + name + "' of " + config_path_ + "'s model needs its scale '" +
                               scale_name + "' as F32 [" + std::to_string(shape[0]) +
                               "] (one per output row); quantize the model again");
    }
    taken_.insert(scale_name);
    t.scale = static_cast<const float*>(scale->second.file->data(*scale->second.info));
    for (int64_t r = 0; r < shape[0]; ++r) {
      if (!std::isfinite(t.scale[r]) || t.scale[r] < 0.0f) {
        throw std::runtime_error(scale->second.file->path() + ": '" + scale_name + "' row " + std::to_string(r) +
                                 " is " + std::to_string(t.scale[r]) +
                                 ", not a finite non-negative scale; quantize the model again");
      }
    }
    return t;
  }

  // Tensors nobody asked for: a bias the config does not announce, a layer beyond num_hidden_layers.
  void reject_untaken() const {
    for (const auto& [name, located] : index_) {
      if (taken_.count(name) != 0) continue;
      // Older checkpoints store the RoPE frequencies; they follow from rope_theta.
      const std::string inv_freq = "rotary_emb.inv_freq";
      if (name.size() > inv_freq.size() &&
          name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0) {
        continue;
      }
      throw std::runtime_error(located.file->path() + ": unexpected tensor '" + name + "' for the model " +
                               "described by " + config_path_ + " (check num_hidden_layers, " +
                               "attention_bias, tie_word_embeddings and the architecture)");
    }
  }

  std::string fp8_hint() const {
    return fp8_ ? " (an FP8 model stores only its projections and lm_head as F8_E4M3)"
                : " (F8_E4M3 weights need a2d.precision 'fp8-e4m3' in " + config_path_ +
                      "; make FP8 models with `python -m a2d_convert quantize`)";
  }

  static std::string shape_text(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }

 private:
  std::string config_path_;
  bool fp8_;
  std::map<std::string, Located> index_;
  std::set<std::string> taken_;
};

int64_t count_elements(const Tensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return t.present() ? n : 0;
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& dir) {
  auto model = std::make_unique<Model>();
  model->dir = dir;
  model->config = read_config(dir + "/config.json");
  for (const auto& path : model_weight_files(dir)) {
    model->files.push_back(std::make_unique<SafetensorsFile>(path));
  }

  const ModelConfig& c = model->config;
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, hd = c.head_dim;
  const int64_t q_dim = c.num_heads * hd, kv_dim = c.num_kv_heads * hd;
  Binder bind(*model);
  ModelWeights& w = model->weights;
  w.embed = bind.take("model.embed_tokens.weight", {c.vocab_size, hidden}, "vocab_size, hidden_size");
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights L;
    L.input_norm = bind.take(p + "input_layernorm.weight", {hidden}, "hidden_size");
    L.q = bind.take_weight(p + "self_attn.q_proj.weight", {q_dim, hidden}, "num_attention_heads, head_dim");
    L.k = bind.take_weight(p + "self_attn.k_proj.weight", {kv_dim, hidden}, "num_key_value_heads, head_dim");
    L.v = bind.take_weight(p + "self_attn.v_proj.weight", {kv_dim, hidden}, "num_key_value_heads, head_dim");
    L.o = bind.take_weight(p + "self_attn.o_proj.weight", {hidden, q_dim}, "num_attention_heads, head_dim");
    if (c.qkv_bias) {
      L.q_bias = bind.take(p + "self_attn.q_proj.bias", {q_dim}, "attention_bias");
      L.k_bias = bind.take(p + "self_attn.k_proj.bias", {kv_dim}, "attention_bias");
      L.v_bias = bind.take(p + "self_attn.v_proj.bias", {kv_dim}, "attention_bias");
    }
    if (c.o_bias) L.o_bias = bind.take(p + "self_attn.o_proj.bias", {hidden}, "attention_bias");
    if (c.qk_norm) {
      L.q_norm = bind.take(p + "self_attn.q_norm.weight", {hd}, "architecture (QK-norm)");
      L.k_norm = bind.take(p + "self_attn.k_norm.weight", {hd}, "architecture (QK-norm)");
    }
    L.post_norm = bind.take(p + "post_attention_layernorm.weight", {hidden}, "hidden_size");
    L.gate = bind.take_weight(p + "mlp.gate_proj.weight", {inter, hidden}, "intermediate_size");
    L.up = bind.take_weight(p + "mlp.up_proj.weight", {inter, hidden}, "intermediate_size");
    L.down = bind.take_weight(p + "mlp.down_proj.weight", {hidden, inter}, "intermediate_size");
    const int64_t r = c.adapter_rank;
    const std::string rule = adapter_rule_name(c.adapter_rule);
    auto adapter = [&](const std::string& module, const std::string& target, int64_t out, int64_t in) {
      LowRank ad;
      if (r == 0 || !c.has_adapter(target)) return ad;
      const std::string stem = p + module + "." + target + "." + rule;
      const std::string field = "a2d." + rule + "_adapter (rank, targets)";
      ad.a = bind.take(stem + "_a", {r, in}, field);
      ad.b = bind.take(stem + "_b", {out, r}, field);
      return ad;
    };
    L.q_ad = adapter("self_attn", "q_proj", q_dim, hidden);
    L.k_ad = adapter("self_attn", "k_proj", kv_dim, hidden);
    L.v_ad = adapter("self_attn", "v_proj", kv_dim, hidden);
    L.o_ad = adapter("self_attn", "o_proj", hidden, q_dim);
    L.gate_ad = adapter("mlp", "gate_proj", inter, hidden);
    L.up_ad = adapter("mlp", "up_proj", inter, hidden);
    L.down_ad = adapter("mlp", "down_proj", hidden, inter);
    w.layers.push_back(std::move(L));
  }
  w.final_norm = bind.take("model.norm.weight", {hidden}, "hidden_size");
  w.lm_head = c.tie_word_embeddings ? w.embed
                                    : bind.take_weight("lm_head.weight", {c.vocab_size, hidden},
                                                "tie_word_embeddings = false, vocab_size");
  bind.reject_untaken();

  int64_t n = count_elements(w.embed) + count_elements(w.final_norm);
  if (!c.tie_word_embeddings) n += count_elements(w.lm_head);
  for (const auto& L : w.layers) {
    for (const Tensor* t : {&L.input_norm, &L.q, &L.k, &L.v, &L.o, &L.q_bias, &L.k_bias, &L.v_bias,
                            &L.o_bias, &L.q_norm, &L.k_norm, &L.post_norm, &L.gate, &L.up, &L.down}) {
      n += count_elements(*t);
    }
    for (const LowRank* ad : {&L.q_ad, &L.k_ad, &L.v_ad, &L.o_ad, &L.gate_ad, &L.up_ad, &L.down_ad}) {
      n += count_elements(ad->a) + count_elements(ad->b);
    }
  }
  model->num_parameters = n;
  return model;
}

}  // namespace a2d
