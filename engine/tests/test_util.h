// Helpers for the model-free tests: a scratch folder and tiny safetensors/config files written here,
// so each test states exactly the bytes it feeds the engine.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace a2d::test {

// A fresh empty folder under $A2D_TEST_TMP (or the system temp dir) named after `name`.
std::string scratch_dir(const std::string& name);

void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);

struct RawTensor {
  std::string dtype;  // "BF16", "F16", "F32", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

// The bytes of a safetensors file holding `tensors` (in name order).
std::string safetensors_bytes(const std::map<std::string, RawTensor>& tensors);

// bf16 bytes of `values` (round to nearest even).
std::string bf16_bytes(const std::vector<float>& values);

struct TinyShape {
  int hidden = 16, intermediate = 24, layers = 2, heads = 4, kv_heads = 2, head_dim = 4, vocab = 40;
  bool tied = false;
  bool qkv_bias = false;  // written as qwen2 when set
  bool qk_norm = false;   // written as qwen3 when set
  bool shift_logits = true;
  int block_size = 4;
  int max_positions = 256;
  float weight_scale = 0.5f;  // matrices are uniform in [-scale, scale]
};

// config.json of a tiny model of `shape` (mask token = vocab - 1, EOS = 2).
nlohmann::json tiny_config(const TinyShape& shape);

// A complete tiny model folder under scratch_dir(name) with random bf16 weights from `seed`.
std::string write_tiny_model(const std::string& name, const TinyShape& shape, uint64_t seed);

// The same in `dir` (created if needed; existing files are overwritten).
std::string write_random_model(const std::string& dir, const TinyShape& shape, uint64_t seed);

}  // namespace a2d::test
