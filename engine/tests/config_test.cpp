#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <vector>

#include "config.h"
#include "decode_params.h"
#include "decoding_table.h"
#include "model.h"
#include "test_util.h"

using namespace a2d;
using namespace a2d::test;

namespace {

// Writes `config` next to valid tiny weights and loads the folder.
std::unique_ptr<Model> load_with(const std::string& name, const TinyShape& shape, const nlohmann::json& config) {
  const std::string dir = write_tiny_model(name, shape, 3);
  write_file(dir + "/config.json", config.dump());
  return load_model(dir);
}

}  // namespace

TEST_CASE("config: a tiny llama loads with the documented defaults") {
  TinyShape shape;
  nlohmann::json config = tiny_config(shape);
  config.erase("num_key_value_heads");
  config.erase("head_dim");
  shape.kv_heads = shape.heads;
  auto model = load_with("cfg-defaults", shape, config);
  const ModelConfig& c = model->config;
  CHECK(c.num_kv_heads == c.num_heads);
  CHECK(c.head_dim == c.hidden_size / c.num_heads);
  CHECK(c.mask_token_id == shape.vocab - 1);
  CHECK(c.decoding.block_size == 4);
  CHECK(c.decoding.eos_token_ids == std::vector<int32_t>{2});
  CHECK(!c.qkv_bias);
  CHECK(!c.qk_norm);
  CHECK(model->num_parameters > 0);
}

TEST_CASE("config: architecture switches follow docs/model-format.md") {
  TinyShape qwen2;
  qwen2.qkv_bias = true;
  auto m2 = load_with("cfg-qwen2", qwen2, tiny_config(qwen2));
  CHECK(m2->config.qkv_bias);
  CHECK(!m2->config.o_bias);
  CHECK(m2->weights.layers[0].q_bias.present());

  TinyShape qwen3;
  qwen3.qk_norm = true;
  auto m3 = load_with("cfg-qwen3", qwen3, tiny_config(qwen3));
  CHECK(m3->config.qk_norm);
  CHECK(m3->weights.layers[1].k_norm.present());

  TinyShape tied;
  tied.tied = true;
  auto mt = load_with("cfg-tied", tied, tiny_config(tied));
  CHECK(mt->weights.lm_head.data == mt->weights.embed.data);
}

TEST_CASE("config: rope_theta is read from rope_parameters as transformers 5 writes it") {
  TinyShape shape;
  nlohmann::json config = tiny_config(shape);
  config.erase("rope_theta");
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}};
  CHECK(load_with("cfg-rope", shape, config)->config.rope_theta == 5e6);
}

TEST_CASE("config: unsupported configs are rejected naming the file, the field and the fix") {
  TinyShape shape;
  auto rejects = [&](const char* name, auto edit, const char* reason) {
    nlohmann::json config = tiny_config(shape);
    edit(config);
    const std::string dir = write_tiny_model(name, shape, 3);
    write_file(dir + "/config.json", config.dump());
    CHECK_THROWS_WITH(load_model(dir), doctest::Contains(reason));
    CHECK_THROWS_WITH(load_model(dir), doctest::Contains((dir + "/config.json").c_str()));
  };
  rejects("cfg-arch", [](nlohmann::json& c) { c["architectures"] = {"GPT2LMHeadModel"}; },
          "field 'architectures' names 'GPT2LMHeadModel', which a2d does not support; supported: LlamaForCausalLM");
  rejects("cfg-type", [](nlohmann::json& c) { c["model_type"] = "qwen2"; }, "does not match architecture");
  rejects("cfg-unknown", [](nlohmann::json& c) { c["scale_emb"] = 12; },
          "field 'scale_emb' is not supported by the a2d engine; it is MiniCPM's muP embedding multiplier");
  rejects("cfg-unlisted", [](nlohmann::json& c) { c["some_new_scale"] = 2; },
          "field 'some_new_scale' is not supported by the a2d engine; remove it if it is metadata");
  rejects("cfg-scaling", [](nlohmann::json& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}}; },
          "RoPE scaling 'yarn'");
  rejects("cfg-theta", [](nlohmann::json& c) { c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}}; },
          "'rope_parameters.rope_theta' disagrees with the top-level rope_theta");
  rejects("cfg-act", [](nlohmann::json& c) { c["hidden_act"] = "gelu"; }, "field 'hidden_act' = 'gelu'");
  rejects("cfg-no-a2d", [](nlohmann::json& c) { c.erase("a2d"); }, "python -m a2d_convert init");
  rejects("cfg-version", [](nlohmann::json& c) { c["a2d"]["format_version"] = 2; },
          "re-export the model with this a2d version");
  rejects("cfg-mask", [](nlohmann::json& c) { c["a2d"]["mask_token_id"] = 1000; },
          "field 'a2d.mask_token_id' = 1000 is out of range");
  rejects("cfg-block", [](nlohmann::json& c) { c["a2d"]["block_size"] = 65; }, "'a2d.block_size' = 65");
  rejects("cfg-remask", [](nlohmann::json& c) { c["a2d"]["decoding"]["remasking"] = "sometimes"; },
          "a2d.decoding.remasking");
  rejects("cfg-verify", [](nlohmann::json& c) { c["a2d"]["decoding"]["remasking"] = "verify"; },
          "left-to-right decoding with a drafter");
  rejects("cfg-lookup", [](nlohmann::json& c) { c["a2d"]["decoding"]["lookup_ngram"] = 3; },
          "a2d_convert redecode --model DIR --remasking low_confidence");
  rejects("cfg-left-to-right",
          [](nlohmann::json& c) {
            c["a2d"]["decoding"]["remasking"] = "leftmost";
            c["a2d"]["decoding"]["threshold"] = 1.0;
          },
          "left_to_right");
  rejects("cfg-advance", [](nlohmann::json& c) { c["a2d"]["decoding"]["advance"] = "jump"; }, "use one of block, slide");
  rejects("cfg-block-one", [](nlohmann::json& c) { c["a2d"]["block_size"] = 1; }, "'a2d.block_size' = 1");
  rejects("cfg-missing", [](nlohmann::json& c) { c.erase("hidden_size"); }, "'hidden_size' is missing");
  rejects("cfg-adapter-rank", [](nlohmann::json& c) { c["a2d"]["mask_adapter"] = {{"rank", 0}, {"targets", {"q_proj"}}}; },
          "'a2d.mask_adapter.rank' = 0");
  rejects("cfg-adapter-target",
          [](nlohmann::json& c) { c["a2d"]["mask_adapter"] = {{"rank", 4}, {"targets", {"q_proj", "lm_head"}}}; },
          "holds 'lm_head'");
  rejects("cfg-adapter-field",
          [](nlohmann::json& c) { c["a2d"]["mask_adapter"] = {{"rank", 4}, {"targets", {"q_proj"}}, {"alpha", 8}}; },
          "a2d.mask_adapter.alpha");
  rejects("cfg-kv", [](nlohmann::json& c) { c["num_key_value_heads"] = 3; }, "must divide num_attention_heads");
}

// engine/supported-config.json is the list the converter's import refuses from; the engine compiled it in.
TEST_CASE("config: every field of supported-config.json is handled as the file says") {
  std::ifstream in(A2D_SUPPORTED_CONFIG_PATH);
  REQUIRE(in);
  const nlohmann::json supported = nlohmann::json::parse(in);
  TinyShape shape;
  nlohmann::json with_metadata = tiny_config(shape);
  for (const auto& key : supported.at("metadata")) with_metadata[key.get<std::string>()] = nullptr;
  with_metadata["id2label"] = {{"0", "LABEL_0"}};
  with_metadata["transformers_version"] = "5.17.0";
  CHECK(load_with("cfg-metadata", shape, with_metadata)->config.hidden_size == shape.hidden);

  int index = 0;
  for (const auto& [key, fix] : supported.at("refused").items()) {
    nlohmann::json config = tiny_config(shape);
    config[key] = 1;
    const std::string dir = write_tiny_model("cfg-refused-" + std::to_string(index++), shape, 3);
    write_file(dir + "/config.json", config.dump());
    CHECK_THROWS_WITH(load_model(dir), doctest::Contains(("field '" + key + "' is not supported by the a2d engine; " +
                                                          fix.get<std::string>()).c_str()));
  }
  CHECK(index >= 7);
}

TEST_CASE("config: not JSON, or no file at all") {
  const std::string dir = scratch_dir("cfg-bad-json");
  CHECK_THROWS_WITH(read_config(dir + "/config.json"), doctest::Contains("must hold config.json"));
  write_file(dir + "/config.json", "{\"architectures\": [");
  CHECK_THROWS_WITH(read_config(dir + "/config.json"), doctest::Contains("not valid JSON"));
}

TEST_CASE("config: weights that disagree with the config name the tensor and the field") {
  TinyShape shape;
  nlohmann::json wider = tiny_config(shape);
  wider["intermediate_size"] = shape.intermediate * 2;
  CHECK_THROWS_WITH(load_with("cfg-shape", shape, wider),
                    doctest::Contains("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [24, 16] but"));

  nlohmann::json deeper = tiny_config(shape);
  deeper["num_hidden_layers"] = 3;
  CHECK_THROWS_WITH(load_with("cfg-layers", shape, deeper),
                    doctest::Contains("missing tensor 'model.layers.2.input_layernorm.weight'"));

  nlohmann::json shallower = tiny_config(shape);
  shallower["num_hidden_layers"] = 1;
  CHECK_THROWS_WITH(load_with("cfg-extra", shape, shallower),
                    doctest::Contains("unexpected tensor 'model.layers.1."));

  TinyShape biased;
  biased.qkv_bias = true;
  nlohmann::json as_llama = tiny_config(biased);
  as_llama["architectures"] = {"LlamaForCausalLM"};
  as_llama["model_type"] = "llama";
  CHECK_THROWS_WITH(load_with("cfg-bias", biased, as_llama),
                    doctest::Contains("unexpected tensor 'model.layers.0.self_attn.k_proj.bias'"));

  nlohmann::json tied = tiny_config(shape);
  tied["tie_word_embeddings"] = true;
  CHECK_THROWS_WITH(load_with("cfg-tie", shape, tied), doctest::Contains("unexpected tensor 'lm_head.weight'"));

  // A mask adapter the config announces but the weights lack is named, tensor and field.
  nlohmann::json adapted = tiny_config(shape);
  adapted["a2d"]["mask_adapter"] = {{"rank", 2}, {"targets", {"v_proj"}}};
  CHECK_THROWS_WITH(load_with("cfg-adapter-missing", shape, adapted),
                    doctest::Contains("missing tensor 'model.layers.0.self_attn.v_proj.mask_a'"));
  CHECK_THROWS_WITH(load_with("cfg-adapter-missing", shape, adapted), doctest::Contains("a2d.mask_adapter"));
}

TEST_CASE("config: decoding parameters are range-checked by name") {
  ModelConfig config;
  config.vocab_size = 10;
  DecodeParams p;
  CHECK_NOTHROW(validate_decode_params(p, config));
  auto rejects = [&](auto edit, const char* reason) {
    DecodeParams q;
    edit(q);
    CHECK_THROWS_WITH(validate_decode_params(q, config), doctest::Contains(reason));
  };
  rejects([](DecodeParams& q) { q.block_size = 0; }, "block_size");
  rejects([](DecodeParams& q) { q.threshold = 1.5; }, "threshold");
  rejects([](DecodeParams& q) { q.min_per_step = 5; }, "min_per_step");
  rejects([](DecodeParams& q) { q.steps = 9; }, "steps");
  rejects([](DecodeParams& q) { q.temperature = -1; }, "temperature");
  rejects([](DecodeParams& q) { q.top_p = 0; }, "top_p");
  rejects([](DecodeParams& q) { q.max_tokens = -1; }, "max_tokens");
  rejects([](DecodeParams& q) { q.eos_token_ids = {10}; }, "eos_token_ids");
}

TEST_CASE("config: the decoding table's shared cases, its defaults and its choices' order") {
  const nlohmann::json table = nlohmann::json::parse(kDecodingTableJson);
  ModelConfig config;
  config.vocab_size = 10;
  for (const nlohmann::json& c : table.at("cases")) {
    CAPTURE(c.dump());
    nlohmann::json params = table.at("case_defaults");
    params.update(c.at("params"));
    DecodeParams p;
    std::string refused;  // a value the C++ types cannot hold, refused where it is parsed
    for (const auto& [name, value] : params.items()) {
      if (name == "block_size") p.block_size = value.get<int>();
      else if (name == "max_tokens") p.max_tokens = value.get<int64_t>();
      else if (name == "threshold") p.threshold = value.get<double>();
      else if (name == "min_per_step") p.min_per_step = value.get<int>();
      else if (name == "steps") p.steps = value.get<int>();
      else if (name == "temperature") p.temperature = value.get<double>();
      else if (name == "top_p") p.top_p = value.get<double>();
      else if (name == "seed" && value.get<int64_t>() < 0) refused = "seed";
      else if (name == "remasking" && !parse_remasking(value.get<std::string>(), &p.remasking)) refused = name;
      else if (name == "advance" && !parse_advance(value.get<std::string>(), &p.advance)) refused = name;
      else if (name == "commit" && !parse_commit(value.get<std::string>(), &p.commit)) refused = name;
      else if (name == "reveal_order" && !parse_reveal_order(value.get<std::string>(), &p.reveal_order)) refused = name;
    }
    if (c.value("ok", false)) {
      CHECK(refused.empty());
      CHECK_NOTHROW(validate_decode_params(p, config));
    } else if (!refused.empty()) {
      CHECK(refused == c.at("error").get<std::string>());
    } else {
      const std::string error = c.at("error").get<std::string>();
      CHECK_THROWS_WITH(validate_decode_params(p, config), doctest::Contains(error.c_str()));
    }
  }
  const DecodeParams defaults;
  CHECK(defaults.threshold == decoding_spec("threshold").default_number);
  CHECK(defaults.min_per_step == decoding_spec("min_per_step").default_number);
  CHECK(defaults.steps == decoding_spec("steps").default_number);
  CHECK(defaults.temperature == decoding_spec("temperature").default_number);
  CHECK(defaults.top_p == decoding_spec("top_p").default_number);
  CHECK(remasking_name(defaults.remasking) == decoding_spec("remasking").default_choice);
  CHECK(advance_name(defaults.advance) == decoding_spec("advance").default_choice);
  CHECK(commit_name(defaults.commit) == decoding_spec("commit").default_choice);
  CHECK(reveal_order_name(defaults.reveal_order) == decoding_spec("reveal_order").default_choice);
  CHECK(std::string(remasking_name(Remasking::leftmost)) == "leftmost");
  CHECK(std::string(advance_name(Advance::slide)) == "slide");
  CHECK(std::string(commit_name(CommitPolicy::separate)) == "separate");
  CHECK(std::string(reveal_order_name(RevealOrder::prefix)) == "prefix");
}

namespace {

// The tiny model of `shape` as an FP8 folder (a2d.precision "fp8-e4m3"): every projection and the lm_head
// replaced by e4m3 codes with an F32 scale per row (`drop` names one scale to leave out; `scale` is every row's).
std::string write_fp8_model(const std::string& name, const TinyShape& shape, const std::string& drop = "",
                            float scale = 0.01f) {
  const std::string dir = write_tiny_model(name, shape, 5);
  std::map<std::string, RawTensor> tensors;
  {
    SafetensorsFile bf16(dir + "/model.safetensors");
    for (const auto& [tensor, info] : bf16.tensors()) {
      const bool projection = tensor.find("_proj.weight") != std::string::npos || tensor == "lm_head.weight";
      if (!projection) {
        tensors[tensor] = {dtype_name(info.dtype), info.shape, std::string(static_cast<const char*>(bf16.data(info)), info.nbytes)};
        continue;
      }
      std::string codes(info.shape[0] * info.shape[1], '\0');
      for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<char>((i * 37) % 0x7f);
      tensors[tensor] = {"F8_E4M3", info.shape, codes};
      std::vector<float> scales(info.shape[0], scale);
      if (tensor + "_scale" != drop) {
        tensors[tensor + "_scale"] = {"F32", {info.shape[0]}, std::string(reinterpret_cast<const char*>(scales.data()), scales.size() * 4)};
      }
    }
  }
  write_file(dir + "/model.safetensors", safetensors_bytes(tensors));
  nlohmann::json config = tiny_config(shape);
  config["a2d"]["precision"] = "fp8-e4m3";
  write_file(dir + "/config.json", config.dump());
  return dir;
}

}  // namespace

TEST_CASE("config: an FP8 model binds its e4m3 projections with their per-row scales; mismatches are named") {
  TinyShape shape;
  auto model = load_model(write_fp8_model("cfg-fp8", shape));
  CHECK(model->config.precision == WeightPrecision::fp8_e4m3);
  for (const Tensor* t : {&model->weights.layers[1].q, &model->weights.layers[1].down, &model->weights.lm_head}) {
    CAPTURE(t->name);
    CHECK(t->dtype == DType::f8_e4m3);
    REQUIRE(t->scale != nullptr);
    CHECK(t->scale[t->rows() - 1] == 0.01f);
  }
  CHECK(model->weights.embed.dtype == DType::bf16);
  CHECK(model->weights.embed.scale == nullptr);

  // The same files under a config that does not say fp8-e4m3, and bf16 files under one that does.
  const std::string fp8_dir = write_fp8_model("cfg-fp8-unannounced", shape);
  write_file(fp8_dir + "/config.json", tiny_config(shape).dump());
  CHECK_THROWS_WITH(load_model(fp8_dir), doctest::Contains("F8_E4M3 weights need a2d.precision 'fp8-e4m3'"));
  nlohmann::json announced = tiny_config(shape);
  announced["a2d"]["precision"] = "fp8-e4m3";
  CHECK_THROWS_WITH(load_with("cfg-fp8-bf16-files", shape, announced),
                    doctest::Contains("says a2d.precision 'fp8-e4m3', which stores it as F8_E4M3"));
  CHECK_THROWS_WITH(load_model(write_fp8_model("cfg-fp8-noscale", shape, "model.layers.1.mlp.up_proj.weight_scale")),
                    doctest::Contains("needs its scale 'model.layers.1.mlp.up_proj.weight_scale' as F32 [24]"));
  CHECK_THROWS_WITH(load_model(write_fp8_model("cfg-fp8-negative", shape, "", -0.5f)),
                    doctest::Contains("row 0 is -0.500000, not a finite non-negative scale"));
  nlohmann::json int4 = tiny_config(shape);
  int4["a2d"]["precision"] = "int4";
  CHECK_THROWS_WITH(load_with("cfg-precision", shape, int4), doctest::Contains("a2d.precision' = 'int4'; use 'bf16' or 'fp8-e4m3'"));
}
