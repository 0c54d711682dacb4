#include "runtime/spill_file.h"

#include <fcntl.h>
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

void read_all(int fd, void* data, size_t n, const std::string& path) {
  auto p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error(str_cat("spill file '", path, "': read failed: ", std::strerror(errno)));
    }
    if (r == 0) throw CorruptData(str_cat("spill file '", path, "': truncated"));
    p += r;
    n -= static_cast<size_t>(r);
  }
}

at::ScalarType dtype_from_name(const std::string& s, const std::string& path) {
  for (auto t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort, at::kChar,
                 at::kByte, at::kBool})
    if (safetensors_dtype_name(t) == s) return t;
  throw CorruptData(str_cat("spill file '", path, "': unknown dtype '", s, "'"));
}

}  // namespace

size_t write_spill_file(const std::string& path, const Block& block) {
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

  nlohmann::json h = {{"id", block.id},
                      {"n_layers", block.layers.size()},
                      {"kind", block.meta.kind},
                      {"pose", block.meta.pose},
                      {"priority", block.meta.priority},
                      {"pinned", block.meta.pinned},
                      {"created", block.meta.created},
                      {"has_embedding", has_emb},
                      {"attn_ema", block.stats.attn_ema},
                      {"last_use", block.stats.last_use},
                      {"uses", block.stats.uses},
                      {"payload_bytes", offset},
                      {"tensors", tj}};
  const std::string hs = h.dump();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(hs.size()) >> (8 * i));

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

Block read_spill_file(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY);
  if (f.fd < 0) throw Error(str_cat("spill file '", path, "': cannot open: ", std::strerror(errno)));
  struct stat sb {};
  if (fstat(f.fd, &sb) != 0) throw Error(str_cat("spill file '", path, "': cannot stat"));
  const size_t fsize = static_cast<size_t>(sb.st_size);
  if (fsize < 24) throw CorruptData(str_cat("spill file '", path, "': ", fsize, " bytes, too short"));
  char magic[8];
  unsigned char len[8];
  read_all(f.fd, magic, 8, path);
  if (std::memcmp(magic, kMagic, 8) != 0) throw CorruptData(str_cat("spill file '", path, "': bad magic"));
  read_all(f.fd, len, 8, path);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | len[i];
  if (hlen > fsize - 24) throw CorruptData(str_cat("spill file '", path, "': header length ", hlen, " exceeds file"));
  std::string hs(hlen, '\0');
  read_all(f.fd, hs.data(), hlen, path);
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(hs);
  } catch (const std::exception& e) {
    throw CorruptData(str_cat("spill file '", path, "': header is not JSON: ", e.what()));
  }
  Xxh64 sum;
  sum.update(hs.data(), hs.size());
  try {
    const size_t payload = h.at("payload_bytes").get<size_t>();
    if (16 + hlen + payload + 8 != fsize)
      throw CorruptData(str_cat("spill file '", path, "': ", fsize, " bytes, the header describes ",
                                16 + hlen + payload + 8, " (truncated or extended)"));
    std::vector<at::Tensor> tensors;
    size_t expect_off = 0;
    for (auto& tj : h.at("tensors")) {
      const auto dt = dtype_from_name(tj.at("dtype").get<std::string>(), path);
      const auto shape = tj.at("shape").get<std::vector<int64_t>>();
      if (tj.at("offset").get<size_t>() != expect_off)
        throw CorruptData(str_cat("spill file '", path, "': tensor offsets are not contiguous"));
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dt));
      const size_t n = t.numel() * t.element_size();
      if (expect_off + n > payload) throw CorruptData(str_cat("spill file '", path, "': tensor past the payload"));
      read_all(f.fd, t.data_ptr(), n, path);
      sum.update(t.data_ptr(), n);
      expect_off += n;
      tensors.push_back(std::move(t));
    }
    if (expect_off != payload) throw CorruptData(str_cat("spill file '", path, "': payload size mismatch"));
    unsigned char tail[8];
    read_all(f.fd, tail, 8, path);
    uint64_t stored = 0;
    for (int i = 7; i >= 0; --i) stored = (stored << 8) | tail[i];
    if (stored != sum.digest())
      throw CorruptData(str_cat("spill file '", path, "': checksum mismatch (stored ", stored, ", computed ",
                                sum.digest(), ")"));

    Block b;
    b.id = h.at("id").get<std::string>();
    const size_t nl = h.at("n_layers").get<size_t>();
    const bool has_emb = h.at("has_embedding").get<bool>();
    if (tensors.size() != nl * 4 + (has_emb ? 1 : 0))
      throw CorruptData(str_cat("spill file '", path, "': ", tensors.size(), " tensors for ", nl, " layers"));
    for (size_t i = 0; i < nl; ++i) {
      LayerKv l{tensors[4 * i], tensors[4 * i + 1], tensors[4 * i + 2], tensors[4 * i + 3]};
      b.layers.push_back(std::move(l));
    }
    if (has_emb) b.meta.embedding = tensors.back();
    b.meta.kind = h.at("kind").get<std::string>();
    b.meta.pose = h.at("pose").get<std::vector<double>>();
    b.meta.priority = h.at("priority").get<double>();
    b.meta.pinned = h.at("pinned").get<bool>();
    b.meta.created = h.at("created").get<int64_t>();
    b.stats.attn_ema = h.at("attn_ema").get<double>();
    b.stats.last_use = h.at("last_use").get<int64_t>();
    b.stats.uses = h.at("uses").get<int64_t>();
    return b;
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat("spill file '", path, "': malformed header: ", e.what()));
  }
}

}  // namespace wm
