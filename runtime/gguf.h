#pragma once
// GGUF files (llama.cpp's model format, versions 2 and 3): a header ("GGUF", version, tensor
// count, metadata count), typed key/value metadata, tensor infos (name, dims, ggml type,
// offset), then the tensors' data, aligned to general.alignment (default 32).
// The reader is defensive: every count, string and array length is checked against the bytes
// left before anything is allocated, dimensions and byte sizes are computed with overflow checks,
// every tensor lies aligned inside the data section and apart from every other. The data section
// is memory-mapped read-only and the tensors are handed out as pointers into it (no copy).
// Little-endian files only (what llama.cpp writes on every common host).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace wm {

// ggml's tensor types, with ggml's numbers (ggml.h, enum ggml_type). Gaps are types ggml
// removed; those numbers are unknown types here.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

// What a ggml type is made of: `block_size` elements are stored in `block_bytes` bytes
// (1 and the element size for the plain types).
struct GgmlTypeTraits {
  const char* name;
  uint32_t block_size;
  uint32_t block_bytes;
};

// The traits of a ggml type number (as read from a file), or nullptr for a number ggml does not
// define (or no longer does).
inline const GgmlTypeTraits* ggml_type_traits(uint32_t type) {
  // Indexed by the type number; {nullptr, 0, 0} for the gaps. Sizes from ggml's type_traits.
  static const GgmlTypeTraits table[] = {
      {"F32", 1, 4},        {"F16", 1, 2},        {"Q4_0", 32, 18},    {"Q4_1", 32, 20},
      {nullptr, 0, 0},      {nullptr, 0, 0},      {"Q5_0", 32, 22},    {"Q5_1", 32, 24},
      {"Q8_0", 32, 34},     {"Q8_1", 32, 36},     {"Q2_K", 256, 84},   {"Q3_K", 256, 110},
      {"Q4_K", 256, 144},   {"Q5_K", 256, 176},   {"Q6_K", 256, 210},  {"Q8_K", 256, 292},
      {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74},  {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
      {"IQ4_NL", 32, 18},   {"IQ3_S", 256, 110},  {"IQ2_S", 256, 82},  {"IQ4_XS", 256, 136},
      {"I8", 1, 1},         {"I16", 1, 2},        {"I32", 1, 4},       {"I64", 1, 8},
      {"F64", 1, 8},        {"IQ1_M", 256, 56},   {"BF16", 1, 2},      {nullptr, 0, 0},
      {nullptr, 0, 0},      {nullptr, 0, 0},      {"TQ1_0", 256, 54},  {"TQ2_0", 256, 66},
      {nullptr, 0, 0},      {nullptr, 0, 0},      {nullptr, 0, 0},     {"MXFP4", 32, 17},
  };
  if (type >= sizeof(table) / sizeof(table[0]) || table[type].name == nullptr) return nullptr;
  return &table[type];
}
inline const GgmlTypeTraits* ggml_type_traits(GgmlType type) { return ggml_type_traits(static_cast<uint32_t>(type)); }

// The type's name ("Q4_1"), or "unknown(N)".
inline std::string ggml_type_name(GgmlType type) {
  const GgmlTypeTraits* t = ggml_type_traits(type);
  return t ? std::string(t->name) : "unknown(" + std::to_string(static_cast<uint32_t>(type)) + ")";
}

// GGUF's metadata value types, with the format's numbers.
enum class GgufValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

// The format's name of a value type ("uint32", "array"), or "unknown(N)".
inline std::string gguf_value_type_name(GgufValueType t) {
  static const char* const names[] = {"uint8",  "int8", "uint16", "int16", "uint32", "int32", "float32",
                                      "bool",   "string", "array", "uint64", "int64", "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? std::string(names[i]) : "unknown(" + std::to_string(i) + ")";
}

// One metadata value. A number or bool is held in `bits` (its bytes as stored, zero-extended);
// a string in `str`; an array has `elem_type` and `count` and its elements in exactly one of
// `raw` (numbers and bools: the elements' bytes as stored), `strings` or `arrays` (nested).
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  uint64_t bits = 0;
  std::string str;
  GgufValueType elem_type = GgufValueType::UINT8;
  uint64_t count = 0;
  std::vector<uint8_t> raw;
  std::vector<std::string> strings;
  std::vector<GgufValue> arrays;
};

// One tensor. `dims` are in ggml's order: dims[0] is the innermost (a row's length, the
// contiguous one), so a torch shape is dims reversed. `data` points into the mapped file and is
// valid while any copy of the GgufFile that gave it lives; `nbytes` is what the type's blocks
// take for `numel` elements.
struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> dims;
  int64_t numel = 0;
  uint64_t offset = 0;  // into the data section
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

class GgufFile {
 public:
  // Opens, validates and maps a file. Throws wm::CorruptData naming the file and the key or
  // tensor on any inconsistency, wm::Error when the file cannot be opened or mapped.
  static GgufFile open(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  // Where the data section starts in the file, and its length (to the end of the file).
  uint64_t data_offset() const { return data_offset_; }
  uint64_t data_size() const { return data_size_; }

  // Metadata. Keys in file order; `value` throws wm::CorruptData naming the key when absent.
  const std::vector<std::string>& keys() const { return keys_; }
  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  const GgufValue& value(const std::string& key) const;

  // Typed getters. Each throws wm::CorruptData naming the key and the file when the key is
  // absent, holds another type, or (integers) a value outside the asked type's range.
  // The integer getters take any integer type; the float getters FLOAT32 or FLOAT64.
  std::string get_string(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  uint32_t get_u32(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  int64_t get_i64(const std::string& key) const;
  float get_f32(const std::string& key) const;
  double get_f64(const std::string& key) const;
  // The same with a default when the key is absent (a present key of the wrong type still throws).
  std::string get_string(const std::string& key, const std::string& fallback) const;
  uint32_t get_u32(const std::string& key, uint32_t fallback) const;
  float get_f32(const std::string& key, float fallback) const;
  // Arrays: of strings; of any integer type (each element range-checked); of FLOAT32/FLOAT64.
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_i64_array(const std::string& key) const;
  std::vector<float> get_f32_array(const std::string& key) const;

  // Tensors in file order; `tensor` throws wm::CorruptData naming it when absent.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  bool has_tensor(const std::string& name) const { return tensor_index_.count(name) != 0; }
  const GgufTensor& tensor(const std::string& name) const;

 private:
  struct Mapping;
  std::shared_ptr<Mapping> map_;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t data_size_ = 0;
  std::vector<std::string> keys_;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace wm
