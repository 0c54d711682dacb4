#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/error.h"

namespace wm {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, at::ScalarType>> t = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  return t;
}

at::ScalarType parse_dtype(const std::string& s, const std::string& where) {
  for (auto& [name, t] : dtype_table())
    if (name == s) return t;
  throw CorruptData(str_cat(where, ": unknown dtype '", s, "'"));
}

// The format's rule for the data section: the tensors' byte ranges, in offset order, follow each
// other without overlap or gap and cover it to its end (what the reference implementation
// checks). Overlapping ranges would let one tensor's bytes be read as another's.
void check_layout(const std::map<std::string, SafeTensors::Entry>& entries, size_t data_size,
                  const std::string& path) {
  std::vector<std::pair<std::string, const SafeTensors::Entry*>> order;
  for (const auto& [name, e] : entries) order.push_back({name, &e});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second->begin, a.second->end) < std::make_pair(b.second->begin, b.second->end);
  });
  size_t at = 0;
  const std::string* prev = nullptr;
  auto range = [](const SafeTensors::Entry& e) { return str_cat("[", e.begin, ", ", e.end, ")"); };
  for (const auto& [name, e] : order) {
    if (e->begin < at)
      throw CorruptData(str_cat("safetensors: '", path, "': tensors '", *prev, "' (bytes ",
                                range(entries.at(*prev)), ") and '", name, "' (bytes ", range(*e),
                                ") overlap; the format needs each tensor's bytes apart"));
    if (e->begin > at)
      throw CorruptData(str_cat("safetensors: '", path, "': bytes [", at, ", ", e->begin, ") before tensor '", name,
                                "' belong to no tensor; the format needs the data contiguous"));
    at = e->end;
    prev = &name;
  }
  if (at != data_size)
    throw CorruptData(str_cat("safetensors: '", path, "': the data section has ", data_size, " bytes, the tensors cover ",
                              at, prev ? str_cat(" (the last is '", *prev, "')") : std::string(),
                              "; the format needs them to cover it"));
}

}  // namespace

std::string safetensors_dtype_name(at::ScalarType t) {
  for (auto& [name, st] : dtype_table())
    if (st == t) return name;
  throw Error(str_cat("safetensors: dtype ", c10::toString(t), " has no safetensors name"));
}

struct SafeTensors::Mapping {
  void* base = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (base != MAP_FAILED && size > 0) munmap(base, size);
  }
};

SafeTensors SafeTensors::open(const std::string& path) {
  SafeTensors st;
  st.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(str_cat("safetensors: cannot open '", path, "': ", std::strerror(errno)));
  struct stat sb {};
  if (fstat(fd, &sb) != 0) {
    ::close(fd);
    throw Error(str_cat("safetensors: cannot stat '", path, "'"));
  }
  const size_t fsize = static_cast<size_t>(sb.st_size);
  if (fsize < 8) {
    ::close(fd);
    throw CorruptData(str_cat("safetensors: '", path, "' is ", fsize, " bytes, too short for a header"));
  }
  st.map_ = std::make_shared<Mapping>();
  st.map_->base = mmap(nullptr, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (st.map_->base == MAP_FAILED) throw Error(str_cat("safetensors: cannot map '", path, "'"));
  st.map_->size = fsize;
  auto bytes = static_cast<const unsigned char*>(st.map_->base);

  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | bytes[i];  // little-endian on any host
  if (hlen > kMaxHeaderBytes || hlen > fsize - 8)
    throw CorruptData(str_cat("safetensors: '", path, "': header length ", hlen,
                              " exceeds the file (", fsize, " bytes) or the cap"));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + hlen);
  } catch (const std::exception& e) {
    throw CorruptData(str_cat("safetensors: '", path, "': header is not JSON: ", e.what()));
  }
  if (!header.is_object()) throw CorruptData(str_cat("safetensors: '", path, "': header is not an object"));
  const size_t data_size = fsize - 8 - hlen;
  for (auto& [name, v] : header.items()) {
    const std::string where = str_cat("safetensors: '", path, "' tensor '", name, "'");
    if (name == "__metadata__") {
      if (!v.is_object()) throw CorruptData(where + ": __metadata__ is not an object");
      for (auto& [k, mv] : v.items()) {
        if (!mv.is_string()) throw CorruptData(where + ": metadata value of '" + k + "' is not a string");
        st.metadata_[k] = mv.get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw CorruptData(where + ": needs dtype, shape and data_offsets");
    Entry e;
    if (!v["dtype"].is_string()) throw CorruptData(where + ": dtype is not a string");
    e.dtype = parse_dtype(v["dtype"].get<std::string>(), where);
    if (!v["shape"].is_array()) throw CorruptData(where + ": shape is not an array");
    // Bytes the shape needs, multiplied with overflow checks; anything past the data section
    // is an error below, so the bound only has to keep the product exact.
    size_t want = c10::elementSize(e.dtype);
    bool overflow = false;
    for (auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        throw CorruptData(str_cat(where, ": bad shape ", v["shape"].dump(), " (dimensions must be integers >= 0)"));
      const auto n = static_cast<uint64_t>(d.get<int64_t>());
      e.shape.push_back(static_cast<int64_t>(n));
      if (n != 0 && want > std::numeric_limits<uint64_t>::max() / 4 / n) overflow = true;
      else want *= n;
    }
    if (overflow && std::find(e.shape.begin(), e.shape.end(), 0) == e.shape.end())
      throw CorruptData(str_cat(where, ": shape ", v["shape"].dump(), " overflows a byte count"));
    if (overflow) want = 0;  // a zero dimension: no bytes, whatever the others say
    auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw CorruptData(where + ": data_offsets must be [begin, end], non-negative integers");
    e.begin = off[0].get<size_t>();
    e.end = off[1].get<size_t>();
    if (e.end < e.begin || e.end > data_size)
      throw CorruptData(str_cat(where, ": bytes [", e.begin, ", ", e.end, ") lie outside the data (",
                                data_size, " bytes); the file may be truncated"));
    if (e.end - e.begin != want)
      throw CorruptData(str_cat(where, ": holds ", e.end - e.begin, " bytes, its shape and dtype need ", want));
    st.entries_.emplace(name, std::move(e));
  }
  check_layout(st.entries_, data_size, path);
  return st;
}

const SafeTensors::Entry& SafeTensors::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw Error(str_cat("safetensors: '", path_, "' has no tensor '", name, "'"));
  return it->second;
}

at::Tensor SafeTensors::get(const std::string& name) const {
  const Entry& e = entry(name);
  const size_t hlen = [&] {
    auto b = static_cast<const unsigned char*>(map_->base);
    uint64_t h = 0;
    for (int i = 7; i >= 0; --i) h = (h << 8) | b[i];
    return h;
  }();
  auto src = static_cast<const unsigned char*>(map_->base) + 8 + hlen + e.begin;
  at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (e.end > e.begin) std::memcpy(out.data_ptr(), src, e.end - e.begin);
  return out;
}

std::vector<std::string> SafeTensors::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (auto& kv : entries_) out.push_back(kv.first);
  return out;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> cpu;
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> seen;
  size_t offset = 0;
  for (auto& [name, t] : tensors) {
    if (!seen.insert(name).second) throw Error(str_cat("save_safetensors: duplicate tensor name '", name, "'"));
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const size_t n = c.numel() * c.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
    cpu.push_back(std::move(c));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');

  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(str_cat("save_safetensors: cannot write '", tmp, "'"));
    unsigned char len[8];
    uint64_t hl = h.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(hl >> (8 * i));
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (auto& c : cpu)
      f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      throw Error(str_cat("save_safetensors: write to '", tmp, "' failed"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(str_cat("save_safetensors: cannot rename '", tmp, "' to '", path, "'"));
  }
}

}  // namespace wm
