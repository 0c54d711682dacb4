#include "runtime/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "runtime/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the GGUF reader reads little-endian values in place");

namespace wm {
// Unity builds put this file beside other readers: the helpers' names say gguf.
namespace {

constexpr uint32_t kGgufMaxDims = 4;         // ggml's GGML_MAX_DIMS
constexpr int kGgufMaxArrayDepth = 8;        // nested arrays deeper than this are refused
constexpr uint64_t kGgufMinKvBytes = 8 + 4 + 1;        // key length, value type, smallest value
constexpr uint64_t kGgufMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset

// Bytes one element of a scalar value type takes; 0 for STRING, ARRAY and unknown types.
uint64_t gguf_scalar_size(uint32_t t) {
  switch (static_cast<GgufValueType>(t)) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64: return 8;
    default: return 0;
  }
}

bool gguf_is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::UINT64:
    case GgufValueType::INT64: return true;
    default: return false;
  }
}

// An integer held in `bits` (zero-extended bytes of type t), as a sign and magnitude:
// negative values come back in `neg` with `mag` their absolute value.
struct GgufInt {
  bool neg = false;
  uint64_t mag = 0;
};
GgufInt gguf_int_value(GgufValueType t, uint64_t bits) {
  GgufInt v;
  int64_t s = 0;
  switch (t) {
    case GgufValueType::INT8: s = static_cast<int8_t>(bits); break;
    case GgufValueType::INT16: s = static_cast<int16_t>(bits); break;
    case GgufValueType::INT32: s = static_cast<int32_t>(bits); break;
    case GgufValueType::INT64: s = static_cast<int64_t>(bits); break;
    default: v.mag = bits; return v;
  }
  if (s < 0) {
    v.neg = true;
    v.mag = static_cast<uint64_t>(-(s + 1)) + 1;  // no overflow at INT64_MIN
  } else {
    v.mag = static_cast<uint64_t>(s);
  }
  return v;
}
std::string gguf_int_text(const GgufInt& v) { return (v.neg ? "-" : "") + std::to_string(v.mag); }

double gguf_float_value(GgufValueType t, uint64_t bits) {
  if (t == GgufValueType::FLOAT32) {
    float f;
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&f, &b, 4);
    return f;
  }
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

// Reads the header and infos in order; every read checks the bytes left first. `where` names
// what is being read (the key or tensor) for the error.
class GgufCursor {
 public:
  GgufCursor(const uint8_t* p, size_t size, const std::string& path) : p_(p), size_(size), path_(path) {}
  size_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw CorruptData(str_cat("gguf: '", path_, "': ", where, ": ", what));
  }
  void need(uint64_t n, const std::string& where, const char* what) const {
    if (n > left())
      fail(where, str_cat(what, " needs ", n, " bytes at offset ", pos_, ", the file has ", left(),
                          " left; the file may be truncated"));
  }
  uint64_t scalar(uint64_t bytes, const std::string& where, const char* what) {
    need(bytes, where, what);
    uint64_t v = 0;
    std::memcpy(&v, p_ + pos_, bytes);
    pos_ += bytes;
    return v;
  }
  uint32_t u32(const std::string& where, const char* what) { return static_cast<uint32_t>(scalar(4, where, what)); }
  uint64_t u64(const std::string& where, const char* what) { return scalar(8, where, what); }
  std::string string(const std::string& where, const char* what) {
    const uint64_t n = u64(where, what);
    if (n > left())
      fail(where, str_cat(what, " of ", n, " bytes at offset ", pos_, ", the file has ", left(),
                          " left; the file may be truncated or the length damaged"));
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }
  void bytes(uint64_t n, std::vector<uint8_t>& out) {
    out.assign(p_ + pos_, p_ + pos_ + n);  // callers checked n against left()
    pos_ += n;
  }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

// Reads one value of type `type` (already read) into `v`.
void gguf_read_value(GgufCursor& c, uint32_t type, GgufValue& v, const std::string& where, int depth) {
  const uint64_t width = gguf_scalar_size(type);
  if (width > 0) {
    v.type = static_cast<GgufValueType>(type);
    v.bits = c.scalar(width, where, "the value");
    if (v.type == GgufValueType::BOOL && v.bits > 1) c.fail(where, str_cat("a bool of value ", v.bits, " (0 or 1)"));
    return;
  }
  if (type == static_cast<uint32_t>(GgufValueType::STRING)) {
    v.type = GgufValueType::STRING;
    v.str = c.string(where, "a string");
    return;
  }
  if (type != static_cast<uint32_t>(GgufValueType::ARRAY)) c.fail(where, str_cat("unknown value type ", type));
  if (depth >= kGgufMaxArrayDepth) c.fail(where, str_cat("arrays nested deeper than ", kGgufMaxArrayDepth));
  v.type = GgufValueType::ARRAY;
  const uint32_t et = c.u32(where, "the array's element type");
  const uint64_t n = c.u64(where, "the array's length");
  // The least each element takes, so that the length is checked before anything is reserved.
  uint64_t min_bytes = gguf_scalar_size(et);
  if (et == static_cast<uint32_t>(GgufValueType::STRING)) min_bytes = 8;
  else if (et == static_cast<uint32_t>(GgufValueType::ARRAY)) min_bytes = 12;
  else if (min_bytes == 0) c.fail(where, str_cat("an array of unknown value type ", et));
  if (n > c.left() / min_bytes)
    c.fail(where, str_cat("an array of ", n, " ", gguf_value_type_name(static_cast<GgufValueType>(et)),
                          " needs at least ", min_bytes, " bytes each, the file has ", c.left(), " left"));
  v.elem_type = static_cast<GgufValueType>(et);
  v.count = n;
  if (gguf_scalar_size(et) > 0) {
    c.bytes(n * min_bytes, v.raw);
    if (v.elem_type == GgufValueType::BOOL)
      for (uint64_t i = 0; i < n; ++i)
        if (v.raw[i] > 1) c.fail(where, str_cat("element ", i, " of a bool array is ", int(v.raw[i]), " (0 or 1)"));
  } else if (v.elem_type == GgufValueType::STRING) {
    v.strings.reserve(n);
    for (uint64_t i = 0; i < n; ++i) v.strings.push_back(c.string(where, "an array's string"));
  } else {
    v.arrays.resize(n);
    for (uint64_t i = 0; i < n; ++i) gguf_read_value(c, et, v.arrays[i], where, depth + 1);
  }
}

}  // namespace

struct GgufFile::Mapping {
  void* base = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (base != MAP_FAILED && size > 0) munmap(base, size);
  }
};

namespace {

// The header after the magic: the version (2 or 3) and the two counts, each checked against the
// bytes left.
uint32_t gguf_read_header(GgufCursor& c, const uint8_t* bytes, uint64_t& n_tensors, uint64_t& n_kv) {
  const std::string header = "the header";
  if (std::memcmp(bytes, "GGUF", 4) != 0) c.fail(header, "no GGUF magic (the file starts with other bytes)");
  c.scalar(4, header, "the magic");
  const uint32_t version = c.u32(header, "the version");
  if (version != 2 && version != 3) {
    const uint32_t swapped = __builtin_bswap32(version);
    c.fail(header, str_cat("version ", version,
                           swapped == 2 || swapped == 3 ? " (a big-endian file, which this reader does not read)"
                           : version == 1           ? " (GGUF v1, whose counts are 32-bit, is not read; convert it)"
                                                    : "",
                           "; versions 2 and 3 are read"));
  }
  n_tensors = c.u64(header, "the tensor count");
  n_kv = c.u64(header, "the metadata count");
  if (n_tensors > c.left() / kGgufMinTensorInfoBytes)
    c.fail(header, str_cat(n_tensors, " tensors: their infos alone would need at least ", kGgufMinTensorInfoBytes,
                           " bytes each, the file has ", c.left(), " left"));
  if (n_kv > c.left() / kGgufMinKvBytes)
    c.fail(header, str_cat(n_kv, " metadata entries: they would need at least ", kGgufMinKvBytes,
                           " bytes each, the file has ", c.left(), " left"));
  return version;
}

// Tensor info i: name, dimensions (positive, their product below 2^63), a known type whose blocks
// a row holds whole, and an aligned offset.
GgufTensor gguf_read_tensor_info(GgufCursor& c, uint64_t i, uint32_t alignment) {
  GgufTensor t;
  t.name = c.string(str_cat("tensor info ", i), "the name");
  const std::string tw = str_cat("tensor '", t.name, "'");
  const uint32_t n_dims = c.u32(tw, "the dimension count");
  if (n_dims > kGgufMaxDims) c.fail(tw, str_cat(n_dims, " dimensions, ggml has at most ", kGgufMaxDims));
  uint64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t n = c.u64(tw, "a dimension");
    if (n == 0 || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      c.fail(tw, str_cat("dimension ", d, " is ", n, " (must be positive and below 2^63)"));
    if (__builtin_mul_overflow(numel, n, &numel) || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      c.fail(tw, "its dimensions' product overflows");
    t.dims.push_back(static_cast<int64_t>(n));
  }
  t.numel = static_cast<int64_t>(numel);
  const uint32_t type = c.u32(tw, "the type");
  const GgmlTypeTraits* tr = ggml_type_traits(type);
  if (tr == nullptr) c.fail(tw, str_cat("unknown ggml type ", type));
  t.type = static_cast<GgmlType>(type);
  const uint64_t row = t.dims.empty() ? 1 : static_cast<uint64_t>(t.dims[0]);
  if (row % tr->block_size != 0)
    c.fail(tw, str_cat("first dimension ", row, " is not a multiple of ", tr->name, "'s block of ", tr->block_size));
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel / tr->block_size, static_cast<uint64_t>(tr->block_bytes), &nbytes))
    c.fail(tw, "its byte size overflows");
  t.nbytes = static_cast<size_t>(nbytes);
  t.offset = c.u64(tw, "the offset");
  if (t.offset % alignment != 0) c.fail(tw, str_cat("offset ", t.offset, " is not a multiple of the alignment ", alignment));
  return t;
}

// Points each tensor at its bytes in the data section (data_size bytes from file offset
// data_offset of the file at `file`) after checking that they lie inside it and that no two
// tensors share a byte.
void gguf_place_tensors(GgufCursor& c, std::vector<GgufTensor>& tensors, const uint8_t* file, uint64_t data_offset,
                        uint64_t data_size) {
  for (GgufTensor& t : tensors) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      uint64_t end = 0;
      const bool overflow = __builtin_add_overflow(t.offset, static_cast<uint64_t>(t.nbytes), &end);
      c.fail(str_cat("tensor '", t.name, "'"),
             str_cat(t.nbytes, " bytes at offset ", t.offset, overflow ? "" : str_cat(" (to ", end, ")"),
                     " lie past the end of the data section (", data_size, " bytes from file offset ", data_offset,
                     "); the file may be truncated"));
    }
    t.data = file + data_offset + t.offset;
  }
  std::vector<const GgufTensor*> order;
  order.reserve(tensors.size());
  for (const GgufTensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensor& a = *order[i - 1];
    const GgufTensor& b = *order[i];
    if (b.offset < a.offset + a.nbytes)
      c.fail(str_cat("tensor '", b.name, "'"),
             str_cat("bytes [", b.offset, ", ", b.offset + b.nbytes, ") overlap tensor '", a.name, "' (bytes [",
                     a.offset, ", ", a.offset + a.nbytes, "))"));
  }
}

}  // namespace

GgufFile GgufFile::open(const std::string& path) {
  GgufFile g;
  g.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(str_cat("gguf: cannot open '", path, "': ", std::strerror(errno)));
  struct stat sb {};
  if (fstat(fd, &sb) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(str_cat("gguf: cannot stat '", path, "': ", std::strerror(err)));
  }
  const size_t fsize = static_cast<size_t>(sb.st_size);
  if (fsize < 24) {
    ::close(fd);
    throw CorruptData(str_cat("gguf: '", path, "' is ", fsize, " bytes, too short for a GGUF header (24)"));
  }
  g.map_ = std::make_shared<Mapping>();
  g.map_->base = mmap(nullptr, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (g.map_->base == MAP_FAILED) throw Error(str_cat("gguf: cannot map '", path, "': ", std::strerror(err)));
  g.map_->size = fsize;
  const auto* bytes = static_cast<const uint8_t*>(g.map_->base);
  GgufCursor c(bytes, fsize, path);
  uint64_t n_tensors = 0, n_kv = 0;
  g.version_ = gguf_read_header(c, bytes, n_tensors, n_kv);

  g.keys_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string(str_cat("metadata entry ", i), "the key");
    const std::string kw = str_cat("key '", key, "'");
    if (g.metadata_.count(key)) c.fail(kw, "appears twice");
    const uint32_t type = c.u32(kw, "the value type");
    GgufValue v;
    gguf_read_value(c, type, v, kw, 0);
    g.keys_.push_back(key);
    g.metadata_.emplace(std::move(key), std::move(v));
  }
  if (g.has("general.alignment")) {
    const GgufValue& a = g.metadata_.at("general.alignment");
    if (a.type != GgufValueType::UINT32)
      c.fail("key 'general.alignment'", str_cat("is ", gguf_value_type_name(a.type), ", the format says uint32"));
    g.alignment_ = static_cast<uint32_t>(a.bits);
    if (g.alignment_ == 0 || (g.alignment_ & (g.alignment_ - 1)) != 0)
      c.fail("key 'general.alignment'", str_cat("is ", g.alignment_, ", not a power of two"));
  }

  g.tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t = gguf_read_tensor_info(c, i, g.alignment_);
    if (g.tensor_index_.count(t.name)) c.fail(str_cat("tensor '", t.name, "'"), "appears twice");
    g.tensor_index_.emplace(t.name, g.tensors_.size());
    g.tensors_.push_back(std::move(t));
  }
  // The data section starts at the next multiple of the alignment.
  g.data_offset_ = (c.pos() + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  g.data_size_ = g.data_offset_ <= fsize ? fsize - g.data_offset_ : 0;
  gguf_place_tensors(c, g.tensors_, bytes, g.data_offset_, g.data_size_);
  return g;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) throw CorruptData(str_cat("gguf: '", path_, "': no metadata key '", key, "'"));
  return it->second;
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) throw CorruptData(str_cat("gguf: '", path_, "': no tensor '", name, "'"));
  return tensors_[it->second];
}

namespace {

[[noreturn]] void gguf_wrong_type(const std::string& path, const std::string& key, const GgufValue& v, const char* want) {
  std::string got = gguf_value_type_name(v.type);
  if (v.type == GgufValueType::ARRAY) got = str_cat("an array of ", gguf_value_type_name(v.elem_type));
  throw CorruptData(str_cat("gguf: '", path, "': key '", key, "' is ", got, ", expected ", want));
}

// An integer value in [lo, hi] (lo <= 0 as a magnitude: `min_neg` the most negative's magnitude).
uint64_t gguf_checked_int(const std::string& path, const std::string& key, GgufValueType t, uint64_t bits,
                     uint64_t min_neg_mag, uint64_t max, const char* want) {
  const GgufInt v = gguf_int_value(t, bits);
  if ((v.neg && v.mag > min_neg_mag) || (!v.neg && v.mag > max))
    throw CorruptData(str_cat("gguf: '", path, "': key '", key, "' is ", gguf_int_text(v), ", outside the range of ", want));
  return v.neg ? ~v.mag + 1 : v.mag;  // two's complement for the negative ones
}

}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::STRING) gguf_wrong_type(path_, key, v, "a string");
  return v.str;
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::BOOL) gguf_wrong_type(path_, key, v, "a bool");
  return v.bits != 0;
}

uint32_t GgufFile::get_u32(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!gguf_is_integer(v.type)) gguf_wrong_type(path_, key, v, "an integer (uint32)");
  return static_cast<uint32_t>(gguf_checked_int(path_, key, v.type, v.bits, 0, std::numeric_limits<uint32_t>::max(), "uint32"));
}

uint64_t GgufFile::get_u64(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!gguf_is_integer(v.type)) gguf_wrong_type(path_, key, v, "an integer (uint64)");
  return gguf_checked_int(path_, key, v.type, v.bits, 0, std::numeric_limits<uint64_t>::max(), "uint64");
}

int64_t GgufFile::get_i64(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!gguf_is_integer(v.type)) gguf_wrong_type(path_, key, v, "an integer (int64)");
  return static_cast<int64_t>(gguf_checked_int(path_, key, v.type, v.bits, uint64_t{1} << 63,
                                          static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "int64"));
}

double GgufFile::get_f64(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::FLOAT32 && v.type != GgufValueType::FLOAT64) gguf_wrong_type(path_, key, v, "a float");
  return gguf_float_value(v.type, v.bits);
}

float GgufFile::get_f32(const std::string& key) const { return static_cast<float>(get_f64(key)); }

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}
uint32_t GgufFile::get_u32(const std::string& key, uint32_t fallback) const { return has(key) ? get_u32(key) : fallback; }
float GgufFile::get_f32(const std::string& key, float fallback) const { return has(key) ? get_f32(key) : fallback; }

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::ARRAY || v.elem_type != GgufValueType::STRING) gguf_wrong_type(path_, key, v, "an array of strings");
  return v.strings;
}

std::vector<int64_t> GgufFile::get_i64_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::ARRAY || !gguf_is_integer(v.elem_type)) gguf_wrong_type(path_, key, v, "an array of integers");
  const uint64_t w = gguf_scalar_size(static_cast<uint32_t>(v.elem_type));
  std::vector<int64_t> out(v.count);
  for (uint64_t i = 0; i < v.count; ++i) {
    uint64_t bits = 0;
    std::memcpy(&bits, v.raw.data() + i * w, w);
    out[i] = static_cast<int64_t>(gguf_checked_int(path_, str_cat(key, "[", i, "]"), v.elem_type, bits, uint64_t{1} << 63,
                                              static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "int64"));
  }
  return out;
}

std::vector<float> GgufFile::get_f32_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::ARRAY || (v.elem_type != GgufValueType::FLOAT32 && v.elem_type != GgufValueType::FLOAT64))
    gguf_wrong_type(path_, key, v, "an array of floats");
  const uint64_t w = gguf_scalar_size(static_cast<uint32_t>(v.elem_type));
  std::vector<float> out(v.count);
  for (uint64_t i = 0; i < v.count; ++i) {
    uint64_t bits = 0;
    std::memcpy(&bits, v.raw.data() + i * w, w);
    out[i] = static_cast<float>(gguf_float_value(v.elem_type, bits));
  }
  return out;
}

}  // namespace wm
