#pragma once
// Safetensors files (the Hugging Face format): an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw bytes.
// The reader is defensive: capped header size, every tensor's byte range checked against the
// file and its shape, the ranges contiguous (no overlap, no gap, the data section covered, as
// the format requires), an explicit error for an unknown dtype.
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace wm {

class SafeTensors {
 public:
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    size_t begin = 0;  // byte offsets into the data section
    size_t end = 0;
  };

  // Opens and validates a file (memory-mapped). Throws wm::CorruptData naming the file and
  // the tensor on any inconsistency, wm::Error if the file cannot be opened.
  static SafeTensors open(const std::string& path);

  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // The tensor, on the CPU, sharing no memory with the file. Throws wm::Error naming it if absent.
  at::Tensor get(const std::string& name) const;
  // Shape and dtype without reading the data. Throws wm::Error naming it if absent.
  const Entry& entry(const std::string& name) const;
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  struct Mapping;
  std::shared_ptr<Mapping> map_;
  std::string path_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any device; copied to the CPU, made contiguous) under their names. Names
// must be unique. Throws wm::Error on an unsupported dtype or an I/O failure; the file is
// written to a temporary name and renamed, so a failed write never leaves a partial file.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The safetensors dtype string for a scalar type ("F32", "BF16", ...); throws if none.
std::string safetensors_dtype_name(at::ScalarType t);

}  // namespace wm
