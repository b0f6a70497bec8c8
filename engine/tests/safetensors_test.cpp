#include <doctest/doctest.h>

#include <cstring>

#include "model.h"
#include "safetensors.h"
#include "test_util.h"

using namespace a2d;
using namespace a2d::test;

namespace {

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::string two_tensor_file() {
  return safetensors_bytes({{"a", {"F32", {2, 3}, f32_bytes({1, 2, 3, 4, 5, 6})}},
                            {"b", {"BF16", {4}, bf16_bytes({1.5f, -2.0f, 0.25f, 8.0f})}}});
}

std::string header_with(const std::string& json) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json;
}

}  // namespace

TEST_CASE("safetensors: reads dtypes, shapes and data in place") {
  const std::string dir = scratch_dir("st-ok");
  write_file(dir + "/w.safetensors", two_tensor_file());
  SafetensorsFile file(dir + "/w.safetensors");
  REQUIRE(file.tensors().size() == 2);
  const TensorInfo& a = file.tensors().at("a");
  CHECK(a.dtype == DType::f32);
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  CHECK(static_cast<const float*>(file.data(a))[5] == 6.0f);
  const TensorInfo& b = file.tensors().at("b");
  CHECK(b.dtype == DType::bf16);
  uint16_t raw;
  std::memcpy(&raw, static_cast<const char*>(file.data(b)) + 2, 2);
  CHECK(raw == 0xc000);  // -2.0 in bf16
}

TEST_CASE("safetensors: a missing file names the path") {
  CHECK_THROWS_WITH(SafetensorsFile{"/nonexistent/a2d/w.safetensors"},
                    doctest::Contains("/nonexistent/a2d/w.safetensors: cannot open weights file"));
}

TEST_CASE("safetensors: a truncated file is rejected, never read past its end") {
  const std::string dir = scratch_dir("st-trunc");
  const std::string bytes = two_tensor_file();
  write_file(dir + "/w.safetensors", bytes.substr(0, bytes.size() - 3));
  CHECK_THROWS_WITH(SafetensorsFile{dir + "/w.safetensors"}, doctest::Contains("truncated or corrupt"));
  write_file(dir + "/w.safetensors", bytes.substr(0, 20));
  CHECK_THROWS_WITH(SafetensorsFile{dir + "/w.safetensors"}, doctest::Contains("the header claims"));
  write_file(dir + "/w.safetensors", bytes.substr(0, 5));
  CHECK_THROWS_WITH(SafetensorsFile{dir + "/w.safetensors"}, doctest::Contains("shorter than the 8-byte"));
}

TEST_CASE("safetensors: corrupt headers are rejected with the reason") {
  const std::string dir = scratch_dir("st-corrupt");
  const std::string path = dir + "/w.safetensors";
  auto rejects = [&](const std::string& json, const char* reason) {
    write_file(path, header_with(json) + std::string(64, '\0'));
    CHECK_THROWS_WITH(SafetensorsFile{path}, doctest::Contains(reason));
  };
  rejects("{\"a\": {\"dtype\": \"F32\", \"shape\": [2]", "not valid JSON");
  rejects("[1, 2]", "not a JSON object");
  rejects("{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}", "lacks dtype/shape/data_offsets");
  rejects("{\"a\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [0, 16]}}", "has dtype I64");
  rejects("{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", "its shape and dtype need 12");
  rejects("{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", "negative dimension");
  rejects("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 4]}}", "spans bytes 8..4");
  rejects("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
          " \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}",
          "overlap");
}

TEST_CASE("safetensors: sharded models load through the index, and a missing shard is named") {
  TinyShape shape;
  const std::string dir = write_tiny_model("st-shards", shape, 1);
  SafetensorsFile whole(dir + "/model.safetensors");
  // Split the tensors over two shards by name.
  std::map<std::string, RawTensor> first, second;
  nlohmann::json weight_map;
  for (const auto& [name, info] : whole.tensors()) {
    RawTensor raw{dtype_name(info.dtype), info.shape,
                  std::string(static_cast<const char*>(whole.data(info)), info.nbytes)};
    const bool early = name.find("layers.1.") == std::string::npos && name != "lm_head.weight";
    (early ? first : second)[name] = raw;
    weight_map[name] = early ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_file(dir + "/model-00001-of-00002.safetensors", safetensors_bytes(first));
  write_file(dir + "/model-00002-of-00002.safetensors", safetensors_bytes(second));
  write_file(dir + "/model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
  std::remove((dir + "/model.safetensors").c_str());

  auto model = load_model(dir);
  CHECK(model->files.size() == 2);
  CHECK(model->weights.layers.size() == 2);

  std::remove((dir + "/model-00002-of-00002.safetensors").c_str());
  CHECK_THROWS_WITH(load_model(dir), doctest::Contains("model-00002-of-00002.safetensors: missing shard"));
}

TEST_CASE("safetensors: a folder without weights says how to make them") {
  const std::string dir = scratch_dir("st-none");
  CHECK_THROWS_WITH(model_weight_files(dir), doctest::Contains("no weights: expected model.safetensors"));
}
