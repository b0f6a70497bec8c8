// A read-only, memory-mapped safetensors file (https://github.com/huggingface/safetensors format:
// u64 little-endian header length, JSON header, raw little-endian tensor bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace a2d {

// Weights are bf16/f16/f32, or e4m3 (FP8, the OCP "fn" variant: no infinities, 0x7F/0xFF NaN) for the
// projections of an FP8 model (docs/model-format.md); i32 is read for integer side tensors (token ids in
// golden files).
enum class DType { bf16, f16, f32, i32, f8_e4m3 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

struct TensorInfo {
  DType dtype;
  std::vector<int64_t> shape;
  size_t offset = 0;  // from the start of the data section
  size_t nbytes = 0;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates the header: JSON syntax, supported dtypes, and that every tensor's byte
  // range matches its shape and lies inside the file. Throws std::runtime_error naming the file.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const void* data(const TensorInfo& info) const { return data_start_ + info.offset; }

  // Reads the whole file into memory now and maps every page, so that later reads of the tensors never
  // wait on the disk. Blocks until done; memory use is the page cache the reads would fill anyway.
  void read_through() const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_start_ = nullptr;
  std::map<std::string, TensorInfo> tensors_;
};

// The safetensors files of a model folder: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json` (weight_map). Throws when neither exists.
std::vector<std::string> model_weight_files(const std::string& dir);

}  // namespace a2d
