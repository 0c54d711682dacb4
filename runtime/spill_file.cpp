#include "runtime/spill_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/hash.h"
#include "runtime/safetensors.h"

namespace wm {
namespace {

constexpr char kMagic[8] = {'W', 'M', 'K', 'V', 'B', 'L', 'K', '1'};

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(str_cat("spill file '", path, "': write failed: ", std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

at::ScalarType dtype_from_name(const std::string& s, const std::string& where) {
  for (auto t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort, at::kChar,
                 at::kByte, at::kBool})
    if (safetensors_dtype_name(t) == s) return t;
  throw CorruptData(str_cat(where, ": unknown dtype '", s, "'"));
}

}  // namespace

namespace {

// A block laid out for the format: the header's JSON and the tensors (contiguous, on the CPU) in
// payload order.
struct Encoded {
  std::string header;
  std::vector<at::Tensor> tensors;
  size_t payload = 0;
};

Encoded lay_out(const Block& block, const nlohmann::json& extra) {
  std::vector<at::Tensor> tensors;
  nlohmann::json tj = nlohmann::json::array();
  size_t offset = 0;
  auto add = [&](const at::Tensor& t) {
    at::Tensor c = t.to(at::kCPU).contiguous();
    const size_t n = c.numel() * c.element_size();
    tj.push_back({{"dtype", safetensors_dtype_name(c.scalar_type())}, {"shape", c.sizes().vec()}, {"offset", offset}});
    offset += n;
    tensors.push_back(std::move(c));
  };
  for (auto& l : block.layers) {
    add(l.k);
    add(l.v);
    add(l.pos);
    add(l.logw);
  }
  const bool has_emb = block.meta.embedding.defined();
  if (has_emb) add(block.meta.embedding);

  nlohmann::json payload = nullptr;
  if (block.meta.payload) payload = {{"type", block.meta.payload->type()}, {"data", block.meta.payload->to_json()}};
  nlohmann::json h = {{"id", block.id},
                      {"n_layers", block.layers.size()},
                      {"kind", block.meta.kind},
                      {"meta_payload", payload},
                      {"priority", block.meta.priority},
                      {"pinned", block.meta.pinned},
                      {"created", block.meta.created},
                      {"has_embedding", has_emb},
                      {"attn_ema", block.stats.attn_ema},
                      {"last_use", block.stats.last_use},
                      {"uses", block.stats.uses},
                      {"payload_bytes", offset},
                      {"tensors", tj}};
  if (!extra.is_null() && !extra.empty()) h["extra"] = extra;
  return Encoded{h.dump(), std::move(tensors), offset};
}

void put_u64le(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

std::string encode_block(const Block& block, const nlohmann::json& extra) {
  const Encoded e = lay_out(block, extra);
  const std::string& hs = e.header;
  std::string out(16 + hs.size() + e.payload + 8, '\0');
  auto* p = reinterpret_cast<unsigned char*>(&out[0]);
  std::memcpy(p, kMagic, 8);
  put_u64le(p + 8, hs.size());
  std::memcpy(p + 16, hs.data(), hs.size());
  size_t at = 16 + hs.size();
  for (const auto& t : e.tensors) {
    const size_t n = t.numel() * t.element_size();
    if (n > 0) std::memcpy(p + at, t.data_ptr(), n);
    at += n;
  }
  put_u64le(p + at, xxh64(p + 16, hs.size() + e.payload));
  return out;
}

size_t write_spill_file(const std::string& path, const Block& block) {
  const Encoded e = lay_out(block, nullptr);
  const std::string& hs = e.header;
  const std::vector<at::Tensor>& tensors = e.tensors;
  const size_t offset = e.payload;
  unsigned char len[8];
  put_u64le(len, hs.size());

  const std::string tmp = path + ".tmp";
  Xxh64 sum;
  {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (f.fd < 0) throw Error(str_cat("spill file '", tmp, "': cannot create: ", std::strerror(errno)));
    write_all(f.fd, kMagic, 8, tmp);
    write_all(f.fd, len, 8, tmp);
    write_all(f.fd, hs.data(), hs.size(), tmp);
    sum.update(hs.data(), hs.size());
    for (auto& t : tensors) {
      const size_t n = t.numel() * t.element_size();
      write_all(f.fd, t.data_ptr(), n, tmp);
      sum.update(t.data_ptr(), n);
    }
    const uint64_t d = sum.digest();
    unsigned char tail[8];
    for (int i = 0; i < 8; ++i) tail[i] = static_cast<unsigned char>(d >> (8 * i));
    write_all(f.fd, tail, 8, tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(str_cat("spill file: cannot rename '", tmp, "' to '", path, "'"));
  }
  return 16 + hs.size() + offset + 8;
}

namespace {

// A read-only mapping of a whole file, unmapped on scope exit.
struct Mapped {
  const unsigned char* data = nullptr;
  size_t size = 0;
  ~Mapped() {
    if (data != nullptr) ::munmap(const_cast<unsigned char*>(data), size);
  }
};

uint64_t read_u64le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// One tensor as the header declares it, validated against the payload before anything is
// allocated.
struct TensorSpec {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  size_t offset = 0, bytes = 0;
};

// Checked element count and byte size of a shape; throws CorruptData on a negative dimension or
// an overflow, and when the bytes exceed `limit` (what the payload can hold).
size_t checked_bytes(const std::vector<int64_t>& shape, size_t element_size, size_t limit, const std::string& where) {
  for (int64_t d : shape) {
    if (d < 0) throw CorruptData(str_cat(where, ": negative dimension ", d));
    if (d == 0) return 0;  // an empty tensor (a layer a block holds no tokens of) needs no bytes
  }
  size_t bytes = element_size;
  for (int64_t d : shape) {
    if (bytes > limit / static_cast<size_t>(d))
      throw CorruptData(str_cat(where, ": shape ", at::IntArrayRef(shape), " needs more bytes than the payload's ",
                                limit));
    bytes *= static_cast<size_t>(d);
  }
  if (bytes > limit)
    throw CorruptData(str_cat(where, ": shape ", at::IntArrayRef(shape), " needs more bytes than the payload's ", limit));
  return bytes;
}

// The header's "tensors" list: each tensor's dtype, shape, offset and bytes, their offsets
// contiguous from 0 and covering the payload's `payload` bytes. Throws wm::CorruptData naming
// `where` and the tensor.
std::vector<TensorSpec> spill_tensor_specs(const nlohmann::json& tj, size_t payload, const std::string& where) {
  if (!tj.is_array()) throw CorruptData(where + ": 'tensors' is not an array");
  std::vector<TensorSpec> specs;
  size_t expect_off = 0;
  for (size_t i = 0; i < tj.size(); ++i) {
    const auto& t = tj[i];
    const std::string tw = str_cat(where, " tensor ", i);
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("offset"))
      throw CorruptData(tw + ": needs dtype, shape and offset");
    if (!t["dtype"].is_string()) throw CorruptData(tw + ": dtype is not a string");
    if (!t["shape"].is_array()) throw CorruptData(tw + ": shape is not an array");
    if (!t["offset"].is_number_unsigned()) throw CorruptData(tw + ": offset is not a non-negative integer");
    TensorSpec s;
    s.dtype = dtype_from_name(t["dtype"].get<std::string>(), where);
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer()) throw CorruptData(tw + ": a dimension is not an integer");
      s.shape.push_back(d.get<int64_t>());
    }
    s.offset = t["offset"].get<size_t>();
    if (s.offset != expect_off) throw CorruptData(where + ": tensor offsets are not contiguous");
    s.bytes = checked_bytes(s.shape, c10::elementSize(s.dtype), payload - expect_off, tw);
    expect_off += s.bytes;
    specs.push_back(std::move(s));
  }
  if (expect_off != payload)
    throw CorruptData(str_cat(where, ": the tensors cover ", expect_off, " of the payload's ", payload, " bytes"));
  return specs;
}

// The tensors the specs describe, copied out of the payload `data`.
std::vector<at::Tensor> spill_tensors(const std::vector<TensorSpec>& specs, const unsigned char* data) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(specs.size());
  for (const auto& s : specs) {
    at::Tensor t = at::empty(s.shape, at::TensorOptions().dtype(s.dtype));
    if (s.bytes > 0) std::memcpy(t.data_ptr(), data + s.offset, s.bytes);
    tensors.push_back(std::move(t));
  }
  return tensors;
}

}  // namespace

// Order: the fixed-size frame, then the whole header (every shape, dtype and offset checked
// against the payload the file actually holds, so nothing a header declares can make us
// allocate more than the file's size), then the checksum over the mapped bytes, and only then
// the tensors are allocated and filled.
Block read_spill_file(const std::string& path) {
  Mapped m;
  {
    Fd f;
    f.fd = ::open(path.c_str(), O_RDONLY);
    if (f.fd < 0) throw Error(str_cat("spill file '", path, "': cannot open: ", std::strerror(errno)));
    struct stat sb {};
    if (fstat(f.fd, &sb) != 0) throw Error(str_cat("spill file '", path, "': cannot stat"));
    if (!S_ISREG(sb.st_mode)) throw Error(str_cat("spill file '", path, "': not a regular file"));
    const size_t fsize = static_cast<size_t>(sb.st_size);
    if (fsize < 24) throw CorruptData(str_cat("spill file '", path, "': ", fsize, " bytes, too short"));
    void* base = ::mmap(nullptr, fsize, PROT_READ, MAP_PRIVATE, f.fd, 0);
    if (base == MAP_FAILED) throw Error(str_cat("spill file '", path, "': cannot map: ", std::strerror(errno)));
    m.data = static_cast<const unsigned char*>(base);
    m.size = fsize;
  }
  return decode_block(m.data, m.size, str_cat("spill file '", path, "'"));
}

Block decode_block(const void* bytes, size_t size, const std::string& where, nlohmann::json* extra) {
  struct {
    const unsigned char* data;
    size_t size;
  } m{static_cast<const unsigned char*>(bytes), size};
  if (m.size < 24) throw CorruptData(str_cat(where, ": ", m.size, " bytes, too short"));
  const size_t fsize = m.size;
  if (std::memcmp(m.data, kMagic, 8) != 0) throw CorruptData(str_cat(where, ": bad magic"));
  const uint64_t hlen = read_u64le(m.data + 8);
  if (hlen > fsize - 24) throw CorruptData(str_cat(where, ": header length ", hlen, " exceeds its ", fsize, " bytes"));
  const char* hs = reinterpret_cast<const char*>(m.data + 16);
  const size_t payload = fsize - 24 - hlen;  // what the file holds between header and checksum
  const unsigned char* data = m.data + 16 + hlen;

  nlohmann::json h;
  try {
    h = nlohmann::json::parse(hs, hs + hlen);
  } catch (const std::exception& e) {
    throw CorruptData(str_cat(where, ": header is not JSON: ", e.what()));
  }
  Block b;
  std::vector<TensorSpec> specs;
  bool has_emb = false;
  size_t nl = 0;
  bool has_payload = false;  // the metadata's BlockPayload, decoded once the checksum holds
  std::string payload_type;
  nlohmann::json payload_data;
  try {
    if (!h.is_object()) throw CorruptData(where + ": header is not an object");
    const auto& pj = h.at("payload_bytes");
    if (!pj.is_number_unsigned() || pj.get<uint64_t>() != payload)
      throw CorruptData(str_cat(where, ": ", fsize, " bytes, the header describes a payload of ", pj.dump(),
                                " bytes where the file holds ", payload, " (truncated or extended)"));
    specs = spill_tensor_specs(h.at("tensors"), payload, where);

    const auto& nlj = h.at("n_layers");
    if (!nlj.is_number_unsigned()) throw CorruptData(where + ": n_layers is not a non-negative integer");
    nl = nlj.get<size_t>();
    has_emb = h.at("has_embedding").get<bool>();
    if (nl > specs.size() || specs.size() != nl * 4 + (has_emb ? 1 : 0))
      throw CorruptData(str_cat(where, ": ", specs.size(), " tensors for ", nl, " layers"));
    b.id = h.at("id").get<std::string>();
    b.meta.kind = h.at("kind").get<std::string>();
    if (h.contains("meta_payload") && !h["meta_payload"].is_null()) {
      const auto& pj = h["meta_payload"];
      if (!pj.is_object() || !pj.contains("type") || !pj["type"].is_string() || !pj.contains("data"))
        throw CorruptData(where + ": 'meta_payload' needs a type name and data");
      has_payload = true;
      payload_type = pj["type"].get<std::string>();
      payload_data = pj["data"];
    }
    b.meta.priority = h.at("priority").get<double>();
    b.meta.pinned = h.at("pinned").get<bool>();
    b.meta.created = h.at("created").get<int64_t>();
    b.stats.attn_ema = h.at("attn_ema").get<double>();
    b.stats.last_use = h.at("last_use").get<int64_t>();
    b.stats.uses = h.at("uses").get<int64_t>();
    if (extra != nullptr) *extra = h.contains("extra") ? h["extra"] : nlohmann::json();
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat(where, ": malformed header: ", e.what()));
  }

  Xxh64 sum;
  sum.update(hs, hlen);
  sum.update(data, payload);
  const uint64_t stored = read_u64le(data + payload);
  if (stored != sum.digest())
    throw CorruptData(str_cat(where, ": checksum mismatch (stored ", stored, ", computed ", sum.digest(), ")"));

  if (has_payload) {
    try {
      b.meta.payload = decode_block_payload(payload_type, payload_data);
    } catch (const nlohmann::json::exception& e) {
      throw CorruptData(str_cat(where, ": malformed '", payload_type, "' payload: ", e.what()));
    } catch (const CorruptData& e) {
      throw CorruptData(str_cat(where, ": ", e.what()));
    } catch (const Error& e) {  // e.g. no decoder registered for the type (the file itself is sound)
      throw Error(str_cat(where, ": ", e.what()));
    }
  }

  const std::vector<at::Tensor> tensors = spill_tensors(specs, data);
  for (size_t i = 0; i < nl; ++i)
    b.layers.push_back(LayerKv{tensors[4 * i], tensors[4 * i + 1], tensors[4 * i + 2], tensors[4 * i + 3]});
  if (has_emb) b.meta.embedding = tensors.back();
  return b;
}

}  // namespace wm
