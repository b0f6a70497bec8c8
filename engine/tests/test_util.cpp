#include "test_util.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "reveal.h"

namespace a2d::test {

namespace fs = std::filesystem;

std::string scratch_dir(const std::string& name) {
  const char* root = std::getenv("A2D_TEST_TMP");
  fs::path dir = fs::path(root != nullptr ? root : fs::temp_directory_path().string()) / ("a2d-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string safetensors_bytes(const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text + data;
}

std::string bf16_bytes(const std::vector<float>& values) {
  std::string out;
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits += 0x7fff + ((bits >> 16) & 1);
    const uint16_t h = static_cast<uint16_t>(bits >> 16);
    out.push_back(static_cast<char>(h & 0xff));
    out.push_back(static_cast<char>(h >> 8));
  }
  return out;
}

nlohmann::json tiny_config(const TinyShape& s) {
  const char* arch = s.qk_norm ? "Qwen3ForCausalLM" : s.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  const char* type = s.qk_norm ? "qwen3" : s.qkv_bias ? "qwen2" : "llama";
  return {
      {"architectures", {arch}},
      {"model_type", type},
      {"hidden_size", s.hidden},
      {"intermediate_size", s.intermediate},
      {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"head_dim", s.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", s.max_positions},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", 10000.0},
      {"tie_word_embeddings", s.tied},
      {"vocab_size", s.vocab},
      {"torch_dtype", "bfloat16"},
      {"a2d",
       {{"format_version", 1},
        {"mask_token_id", s.vocab - 1},
        {"mask_token", "<|mask|>"},
        {"block_size", s.block_size},
        {"shift_logits", s.shift_logits},
        {"eos_token_ids", {2}},
        {"trained", false},
        {"decoding",
         {{"threshold", 0.9}, {"min_per_step", 1}, {"steps", 0}, {"temperature", 0.0}, {"top_p", 1.0},
          {"remasking", "low_confidence"}, {"commit", "fused"}}}}},
  };
}

std::string write_tiny_model(const std::string& name, const TinyShape& s, uint64_t seed) {
  return write_random_model(scratch_dir(name), s, seed);
}

std::string write_random_model(const std::string& dir, const TinyShape& s, uint64_t seed) {
  fs::create_directories(dir);
  SplitMix64 rng(seed);
  auto random = [&](std::vector<int64_t> shape, float scale, float offset = 0.0f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (auto& x : v) x = offset + scale * static_cast<float>(2.0 * rng.next_double() - 1.0);
    return RawTensor{"BF16", shape, bf16_bytes(v)};
  };
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  std::map<std::string, RawTensor> t;
  t["model.embed_tokens.weight"] = random({s.vocab, s.hidden}, 1.0f);
  for (int i = 0; i < s.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t[p + "input_layernorm.weight"] = random({s.hidden}, 0.2f, 1.0f);
    t[p + "post_attention_layernorm.weight"] = random({s.hidden}, 0.2f, 1.0f);
    t[p + "self_attn.q_proj.weight"] = random({q, s.hidden}, s.weight_scale);
    t[p + "self_attn.k_proj.weight"] = random({kv, s.hidden}, s.weight_scale);
    t[p + "self_attn.v_proj.weight"] = random({kv, s.hidden}, s.weight_scale);
    t[p + "self_attn.o_proj.weight"] = random({s.hidden, q}, s.weight_scale);
    if (s.qkv_bias) {
      t[p + "self_attn.q_proj.bias"] = random({q}, 0.5f);
      t[p + "self_attn.k_proj.bias"] = random({kv}, 0.5f);
      t[p + "self_attn.v_proj.bias"] = random({kv}, 0.5f);
    }
    if (s.qk_norm) {
      t[p + "self_attn.q_norm.weight"] = random({s.head_dim}, 0.2f, 1.0f);
      t[p + "self_attn.k_norm.weight"] = random({s.head_dim}, 0.2f, 1.0f);
    }
    t[p + "mlp.gate_proj.weight"] = random({s.intermediate, s.hidden}, s.weight_scale);
    t[p + "mlp.up_proj.weight"] = random({s.intermediate, s.hidden}, s.weight_scale);
    t[p + "mlp.down_proj.weight"] = random({s.hidden, s.intermediate}, s.weight_scale);
  }
  t["model.norm.weight"] = random({s.hidden}, 0.2f, 1.0f);
  if (!s.tied) t["lm_head.weight"] = random({s.vocab, s.hidden}, 1.0f);
  write_file(dir + "/model.safetensors", safetensors_bytes(t));
  write_file(dir + "/config.json", tiny_config(s).dump(2));
  return dir;
}

}  // namespace a2d::test
