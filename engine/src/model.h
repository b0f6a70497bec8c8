// A loaded a2d model: its config and views of its weights inside the memory-mapped safetensors files.
// The views stay valid as long as the Model lives; nothing is copied or converted at load.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "safetensors.h"

namespace a2d {

// One weight matrix or vector as stored on disk. `data == nullptr` means the tensor is absent
// (an optional bias, the q/k norms of a model without QK-norm). An e4m3 matrix (an FP8 model's
// projections and lm_head) stands for e4m3 value x scale[row], both in fp32.
struct Tensor {
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::string name;
  const float* scale = nullptr;  // f8_e4m3: [rows], the `<name>_scale` tensor of the file

  bool present() const { return data != nullptr; }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
};

// A row adapter's factors on one projection [out, in]: a [rank, in], b [out, rank] (absent: no adapter).
struct LowRank {
  Tensor a, b;
  bool present() const { return a.present(); }
};

struct LayerWeights {
  Tensor input_norm;                  // [hidden]
  Tensor q, k, v, o;                  // [heads*hd, hidden], [kv*hd, hidden] x2, [hidden, heads*hd]
  Tensor q_bias, k_bias, v_bias, o_bias;
  Tensor q_norm, k_norm;              // [head_dim] (qwen3)
  Tensor post_norm;                   // [hidden]
  Tensor gate, up, down;              // [inter, hidden] x2, [hidden, inter]
  LowRank q_ad, k_ad, v_ad, o_ad, gate_ad, up_ad, down_ad;  // the row adapter (config.adapter_rank)
};

struct ModelWeights {
  Tensor embed;       // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [hidden]
  Tensor lm_head;     // [vocab, hidden]; the embedding when tie_word_embeddings
};

struct Model {
  std::string dir;
  ModelConfig config;
  ModelWeights weights;
  int64_t num_parameters = 0;
  std::vector<std::unique_ptr<SafetensorsFile>> files;  // owns the mappings the tensors point into
};

// Loads `dir/config.json` and the safetensors weights (single file or sharded index), and checks every
// tensor's presence, dtype and shape against the config. Throws std::runtime_error with a clear message.
std::unique_ptr<Model> load_model(const std::string& dir);

}  // namespace a2d
