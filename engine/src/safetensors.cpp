#include "safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace a2d {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

DType parse_dtype(const std::string& path, const std::string& tensor, const std::string& name) {
  if (name == "BF16") return DType::bf16;
  if (name == "F16") return DType::f16;
  if (name == "F32") return DType::f32;
  if (name == "I32") return DType::i32;
  if (name == "F8_E4M3") return DType::f8_e4m3;
  fail(path, "tensor '" + tensor + "' has dtype " + name +
                 "; a2d reads BF16, F16 and F32 weights, and F8_E4M3 for an FP8 model's projections (convert "
                 "the weights, e.g. with the a2d_convert package)");
}

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f8_e4m3:
      return 1;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::f32:
    case DType::i32:
      return 4;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::f32:
      return "F32";
    case DType::i32:
      return "I32";
    case DType::f8_e4m3:
      return "F8_E4M3";
  }
  return "?";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open weights file: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    fail(path, "truncated safetensors file (" + std::to_string(map_size_) +
                   " bytes, shorter than the 8-byte header length); re-copy or re-export the weights");
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(path, std::string("mmap failed: ") + std::strerror(errno));
  }

  try {
    const auto* bytes = static_cast<const uint8_t*>(map_);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
    if (header_len > map_size_ - 8) {
      fail(path, "corrupt or truncated safetensors file: the header claims " +
                     std::to_string(header_len) + " bytes but the file holds " +
                     std::to_string(map_size_) + "; re-copy or re-export the weights");
    }
    data_start_ = bytes + 8 + header_len;
    const size_t data_size = map_size_ - 8 - header_len;

    json header;
    try {
      header = json::parse(bytes + 8, bytes + 8 + header_len);
    } catch (const json::parse_error& e) {
      fail(path, std::string("corrupt safetensors header (not valid JSON: ") + e.what() +
                     "); re-copy or re-export the weights");
    }
    if (!header.is_object()) fail(path, "corrupt safetensors header: not a JSON object");

    // Tensors must tile the data section without overlap (the format's own rule); checking it catches
    // headers that were edited or files that were spliced together.
    std::vector<std::pair<size_t, size_t>> ranges;
    for (auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
          !entry.contains("data_offsets") || !entry["dtype"].is_string() ||
          !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
          entry["data_offsets"].size() != 2) {
        fail(path, "corrupt safetensors header: tensor '" + name +
                       "' lacks dtype/shape/data_offsets[2]");
      }
      TensorInfo info;
      info.dtype = parse_dtype(path, name, entry["dtype"].get<std::string>());
      uint64_t count = 1;
      for (const auto& dim : entry["shape"]) {
        if (!dim.is_number_unsigned()) fail(path, "corrupt safetensors header: tensor '" + name +
                                                      "' has a non-integer or negative dimension");
        const uint64_t d = dim.get<uint64_t>();
        if (d != 0 && count > std::numeric_limits<uint64_t>::max() / d / 8) {
          fail(path, "corrupt safetensors header: tensor '" + name + "' is impossibly large");
        }
        count *= d;
        info.shape.push_back(static_cast<int64_t>(d));
      }
      const auto& offsets = entry["data_offsets"];
      if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
        fail(path, "corrupt safetensors header: tensor '" + name + "' has invalid data_offsets");
      }
      const uint64_t begin = offsets[0].get<uint64_t>();
      const uint64_t end = offsets[1].get<uint64_t>();
      if (end < begin || end > data_size) {
        fail(path, "truncated or corrupt safetensors file: tensor '" + name + "' spans bytes " +
                       std::to_string(begin) + ".." + std::to_string(end) + " of a " +
                       std::to_string(data_size) +
                       "-byte data section; re-copy or re-export the weights");
      }
      if (end - begin != count * dtype_size(info.dtype)) {
        fail(path, "corrupt safetensors header: tensor '" + name + "' has " +
                       std::to_string(end - begin) + " bytes but its shape and dtype need " +
                       std::to_string(count * dtype_size(info.dtype)));
      }
      info.offset = begin;
      info.nbytes = end - begin;
      ranges.emplace_back(begin, end);
      tensors_.emplace(name, std::move(info));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) {
        fail(path, "corrupt safetensors header: two tensors overlap in the data section");
      }
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

void SafetensorsFile::read_through() const {
  // One request for the whole range lets the kernel read ahead at full disk speed; touching one byte per
  // page then waits for each page and maps it. The advice is only a hint: without it the touches still
  // read everything, one read-around window at a time.
  ::madvise(map_, map_size_, MADV_WILLNEED);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const volatile uint8_t* bytes = static_cast<const uint8_t*>(map_);
  for (size_t at = 0; at < map_size_; at += page) (void)bytes[at];
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

std::vector<std::string> model_weight_files(const std::string& dir) {
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (file_exists(index_path)) {
    std::ifstream in(index_path);
    json index;
    try {
      index = json::parse(in);
    } catch (const json::exception& e) {
      fail(index_path, std::string("not valid JSON: ") + e.what());
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      fail(index_path, "missing the 'weight_map' object (tensor name -> shard file)");
    }
    std::set<std::string> shards;
    for (auto& [tensor, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) fail(index_path, "weight_map['" + tensor + "'] is not a file name");
      const std::string name = shard.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos) {
        fail(index_path, "weight_map['" + tensor + "'] = '" + name + "' is not a file in the folder");
      }
      shards.insert(name);
    }
    std::vector<std::string> files;
    for (const auto& shard : shards) {
      const std::string path = dir + "/" + shard;
      if (!file_exists(path)) {
        fail(path, "missing shard listed in " + index_path + "; copy the complete model folder");
      }
      files.push_back(path);
    }
    return files;
  }
  if (file_exists(single)) return {single};
  fail(dir, "no weights: expected model.safetensors or model.safetensors.index.json in the model "
            "folder (make one with `python -m a2d_convert init`)");
}

}  // namespace a2d
