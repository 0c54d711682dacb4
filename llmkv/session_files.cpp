#include "llmkv/session_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <set>
#include <string_view>
#include <cstdint>

#include "runtime/error.h"
#include "runtime/hash.h"
#include "runtime/spill_file.h"

namespace wm::llm {

// The file-local helpers, in a namespace of their own: the unity build puts this file in one unit
// with others whose file-local names are the same.
namespace session_files_impl {

constexpr const char kMagic2[] = "WMSESS2\n";
constexpr const char kMagic3[] = "WMSESS3\n";
constexpr size_t kMagicLen = 8;
constexpr const char kIndex[] = "index.json";
constexpr const char kLock[] = ".wmsess.lock";
constexpr size_t kRecordHead = 20;  // tag, length, the two's XXH64
constexpr size_t kRecordOver = 28;  // head and the payload's XXH64

using Piece = SessionFiles::Piece;
using Layout = SessionFiles::Layout;

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_u64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}

std::string errno_text(int e) { return std::strerror(e); }

// A decoded block into the snapshot's window or bank, by the kind its listing names.
void place(SessionSnapshot& snap, const std::string& kind, Block b, const std::string& where) {
  if (kind == "window")
    snap.window.push_back(std::move(b));
  else if (kind == "bank")
    snap.bank.push_back(std::move(b));
  else
    throw CorruptData(str_cat(where, ": a block of unknown kind '", kind, "'"));
}

bool is_hex16(const std::string& s, size_t at) {
  if (s.size() < at + 16) return false;
  for (size_t i = at; i < at + 16; ++i)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}
// "s-" + 16 lowercase hex + ".wmsess", exactly.
bool is_session_file(const std::string& f) {
  return f.size() == 2 + 16 + 7 && f.compare(0, 2, "s-") == 0 && is_hex16(f, 2) && f.compare(18, 7, ".wmsess") == 0;
}
// One of the folder's own names + ".tmp-" + 16 lowercase hex, exactly.
bool is_own_temporary(const std::string& f) {
  const size_t n = f.size();
  if (n < 5 + 16 || !is_hex16(f, n - 16) || f.compare(n - 21, 5, ".tmp-") != 0) return false;
  const std::string target = f.substr(0, n - 21);
  return target == kIndex || is_session_file(target);
}

std::string random_hex() {
  static std::mt19937_64 gen{std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32) ^
                             static_cast<uint64_t>(std::time(nullptr))};
  return hex64(gen());
}

void write_all(int fd, const char* p, size_t n, uint64_t at, const std::string& what) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error(str_cat("cannot write ", what, ": ", errno_text(w < 0 ? errno : ENOSPC)));
    p += w;
    n -= static_cast<size_t>(w);
    at += static_cast<uint64_t>(w);
  }
}

// Reads a file of the folder whole, never through a symbolic link, a regular file only.
// Throws wm::CorruptData for a link or a file of another kind, wm::Error when it cannot be read
// (errno_out set to the reason; 0 for damage).
std::string read_file_at(int dirfd, const std::string& f, const std::string& where, int* errno_out = nullptr) {
  if (errno_out) *errno_out = 0;
  const int fd = ::openat(dirfd, f.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    if (e == ELOOP) throw CorruptData(str_cat(where, ": a symbolic link, not a file of the folder (not followed)"));
    if (errno_out) *errno_out = e;
    throw Error(str_cat(where, ": cannot open: ", errno_text(e)));
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    if (errno_out) *errno_out = errno;
    throw Error(str_cat(where, ": cannot stat: ", errno_text(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw CorruptData(str_cat(where, ": not a regular file"));
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, &out[done], out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      if (errno_out) *errno_out = errno;
      throw Error(str_cat(where, ": cannot read: ", errno_text(errno)));
    }
    if (n == 0) break;  // shrank meanwhile: what there is
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

// Writes `bytes` as `target` of the folder whole or not at all: a temporary of the folder's own
// pattern (created exclusively, never through a link), flushed, renamed over `target`, the
// folder flushed after. Throws wm::Error naming the folder on a failure (the temporary removed).
void write_whole_at(int dirfd, const std::string& dir, const std::string& target, const std::string& bytes) {
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    tmp = target + ".tmp-" + random_hex();
    fd = ::openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw Error(str_cat("cannot create a temporary '", tmp, "' in '", dir, "': ", errno_text(errno)));
  const std::string what = str_cat("'", dir, "/", tmp, "'");
  try {
    write_all(fd, bytes.data(), bytes.size(), 0, what);
    if (::fsync(fd) != 0) throw Error(str_cat("cannot flush ", what, " to the disk: ", errno_text(errno)));
    if (::close(fd) != 0) {
      fd = -1;
      throw Error(str_cat("cannot write ", what, ": ", errno_text(errno)));
    }
    fd = -1;
    if (::renameat(dirfd, tmp.c_str(), dirfd, target.c_str()) != 0)
      throw Error(str_cat("cannot rename ", what, " to '", target, "': ", errno_text(errno)));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlinkat(dirfd, tmp.c_str(), 0);
    throw;
  }
  ::fsync(dirfd);
}

// A record of format 3.
void put_record(std::string& out, const char* tag, const std::string& payload, uint64_t* sum = nullptr) {
  const size_t at = out.size();
  out.append(tag, 4);
  put_u64(out, payload.size());
  put_u64(out, xxh64(out.data() + at, 12));
  out += payload;
  const uint64_t s = xxh64(payload.data(), payload.size());
  put_u64(out, s);
  if (sum) *sum = s;
}

// A record's head checks out at `at` of `bytes`: its payload's length, or false.
bool record_at(const std::string& bytes, size_t at, std::string* tag, uint64_t* len) {
  if (at > bytes.size() || bytes.size() - at < kRecordOver) return false;
  if (get_u64(bytes, at + 12) != xxh64(bytes.data() + at, 12)) return false;
  const uint64_t n = get_u64(bytes, at + 4);
  if (n > bytes.size() - at - kRecordOver) return false;
  *tag = bytes.substr(at, 4);
  *len = n;
  return true;
}

// A block's metadata alone: what its head BLOB holds.
Block head_of(const Block& b) {
  Block h;
  h.id = b.id;
  h.meta = b.meta;
  return h;
}

// Tokens [from[l], from[l] + n[l]) of every layer of `b`, without metadata.
Block slice_of(const Block& b, const std::vector<int64_t>& from, const std::vector<int64_t>& n) {
  Block p;
  p.id = b.id;
  p.layers.resize(b.layers.size());
  for (size_t l = 0; l < b.layers.size(); ++l) {
    const LayerKv& s = b.layers[l];
    LayerKv& d = p.layers[l];
    d.k = s.k.narrow(1, from[l], n[l]);
    d.v = s.v.narrow(1, from[l], n[l]);
    d.pos = s.pos.narrow(0, from[l], n[l]);
    d.logw = s.logw.narrow(0, from[l], n[l]);
  }
  return p;
}

uint64_t bits_of(double d) {
  uint64_t u = 0;
  std::memcpy(&u, &d, sizeof u);
  return u;
}
double double_of(uint64_t u) {
  double d = 0;
  std::memcpy(&d, &u, sizeof d);
  return d;
}

nlohmann::json piece_json(const Piece& p) { return nlohmann::json::array({p.offset, p.bytes, p.sum, p.tokens}); }

// A BLOB record of format 3: its payload's length and XXH64, and whether the payload matches.
struct Blob {
  uint64_t bytes, sum;
  bool ok;
};

// The records of a format-3 file: its BLOBs by payload offset, and the last whole manifest's
// payload [man_at, man_at + man_len), its record ending at man_end.
struct Records {
  std::map<uint64_t, Blob> blobs;
  size_t man_at = 0, man_len = 0, man_end = 0;
};

// Walks the records of `bytes` from the magic. Throws wm::CorruptData when no manifest is whole,
// or when a whole one lies past the point where the records stop.
Records scan_records(const std::string& bytes, const std::string& where) {
  Records rec;
  size_t pos = kMagicLen;
  std::string tag;
  uint64_t len = 0;
  while (record_at(bytes, pos, &tag, &len)) {
    const size_t at = pos + kRecordHead;
    const uint64_t sum = get_u64(bytes, at + len);
    const bool ok = xxh64(bytes.data() + at, len) == sum;
    if (tag == "BLOB") {
      rec.blobs[at] = {len, sum, ok};
    } else if (tag == "MANI") {
      if (ok) rec.man_at = at, rec.man_len = len, rec.man_end = at + len + 8;
    } else {
      break;
    }
    pos = at + len + 8;
  }
  // The records stop at `pos`: a save cut short leaves a tail, but a whole manifest after it
  // means the file was damaged in the middle.
  for (size_t m = bytes.find("MANI", pos + 1); m != std::string::npos; m = bytes.find("MANI", m + 1))
    if (record_at(bytes, m, &tag, &len) &&
        xxh64(bytes.data() + m + kRecordHead, len) == get_u64(bytes, m + kRecordHead + len))
      throw CorruptData(str_cat(where, ": damaged at byte ", pos, ", before its last manifest"));
  if (rec.man_end == 0)
    throw CorruptData(str_cat(where, ": no whole manifest (the file is damaged or its first write cut short)"));
  return rec;
}

// The layers of block `id`'s pieces (each [layers]) joined along the tokens. Throws
// wm::CorruptData when they do not join.
std::vector<LayerKv> join_pieces(std::vector<std::vector<LayerKv>>& parts, const std::string& id,
                                 const std::string& where) {
  if (parts.size() == 1) return std::move(parts[0]);
  std::vector<LayerKv> layers(parts[0].size());
  for (size_t l = 0; l < parts[0].size(); ++l) {
    std::vector<at::Tensor> k, v, ps, lw;
    for (const auto& part : parts) {
      k.push_back(part[l].k);
      v.push_back(part[l].v);
      ps.push_back(part[l].pos);
      lw.push_back(part[l].logw);
    }
    try {
      layers[l] = {at::cat(k, 1), at::cat(v, 1), at::cat(ps, 0), at::cat(lw, 0)};
    } catch (const c10::Error& ex) {
      throw CorruptData(str_cat(where, ": block '", id, "': its pieces do not join: ", ex.what_without_backtrace()));
    }
  }
  return layers;
}

// Reads the blocks a format-3 manifest lists out of the file's bytes, and records in `lay` the
// pieces of each (its chains) and the bytes they hold (live).
struct ManifestBlocks {
  const std::string& bytes;
  const std::string& where;
  const Records& rec;
  Layout& lay;
  std::set<uint64_t> used;  // payload offsets already counted in lay.live

  // The bytes of the BLOB a manifest entry [offset, bytes, sum, ...] names; *p gets the three.
  // Throws wm::CorruptData when no such whole BLOB lies before the manifest.
  std::string_view blob(const nlohmann::json& r, Piece* p) {
    p->offset = r.at(0).get<uint64_t>();
    p->bytes = r.at(1).get<uint64_t>();
    p->sum = r.at(2).get<uint64_t>();
    auto it = rec.blobs.find(p->offset);
    if (it == rec.blobs.end() || it->second.bytes != p->bytes || it->second.sum != p->sum || p->offset > rec.man_at)
      throw CorruptData(str_cat(where, ": the manifest names bytes at ", p->offset, " that hold no such block"));
    if (!it->second.ok) throw CorruptData(str_cat(where, ": the block at byte ", p->offset, " is damaged (checksum)"));
    if (used.insert(p->offset).second) lay.live += p->bytes + kRecordOver;
    return std::string_view(bytes.data() + p->offset, p->bytes);
  }

  // The layers of the pieces block `id` lists in `pieces`, each checked against its entry; the
  // pieces are appended to `chain`. Throws wm::CorruptData.
  std::vector<std::vector<LayerKv>> read_pieces(const nlohmann::json& pieces, const std::string& id,
                                                std::vector<Piece>& chain) {
    std::vector<std::vector<LayerKv>> parts;
    for (const auto& pj : pieces) {
      Piece p;
      const std::string_view pb = blob(pj, &p);
      p.tokens = pj.at(3).get<std::vector<int64_t>>();
      Block piece = decode_block(pb.data(), pb.size(), where);
      if (piece.id != id) throw CorruptData(str_cat(where, ": block '", id, "' holds a piece of '", piece.id, "'"));
      if (piece.layers.size() != p.tokens.size() || (!parts.empty() && parts[0].size() != p.tokens.size()))
        throw CorruptData(str_cat(where, ": block '", id, "': its pieces' layers disagree"));
      for (size_t l = 0; l < p.tokens.size(); ++l)
        if (piece.layers[l].n_tokens() != p.tokens[l])
          throw CorruptData(str_cat(where, ": block '", id, "': a piece's tokens disagree with the manifest"));
      parts.push_back(std::move(piece.layers));
      chain.push_back(std::move(p));
    }
    if (parts.empty()) throw CorruptData(str_cat(where, ": block '", id, "' has no pieces"));
    return parts;
  }

  // The block of listing entry e (its head, stats and pieces joined), of the given kind.
  Block read(const nlohmann::json& e, const std::string& kind) {
    Piece hp;
    const std::string_view hb = blob(e.at("head"), &hp);
    Block b = decode_block(hb.data(), hb.size(), where);
    if (!b.layers.empty()) throw CorruptData(str_cat(where, ": block '", b.id, "': its head holds tokens"));
    const auto& st = e.at("stats");
    b.stats.attn_ema = double_of(st.at(0).get<uint64_t>());
    b.stats.last_use = st.at(1).get<int64_t>();
    b.stats.uses = st.at(2).get<int64_t>();
    std::vector<Piece>& chain = lay.chains[kind + ":" + b.id];
    if (!chain.empty()) throw CorruptData(str_cat(where, ": ", kind, " block '", b.id, "' is listed twice"));
    std::vector<std::vector<LayerKv>> parts = read_pieces(e.at("pieces"), b.id, chain);
    b.layers = join_pieces(parts, b.id, where);
    return b;
  }
};

// Format 3's bytes read back, and what the next save needs of them (*layout).
SessionSnapshot decode3(const std::string& bytes, const std::string& where, std::string* name, nlohmann::json* note,
                        Layout* layout) {
  const Records rec = scan_records(bytes, where);
  SessionSnapshot snap;
  Layout lay;
  lay.current = true;
  lay.end = rec.man_end;
  ManifestBlocks blocks{bytes, where, rec, lay, {}};
  try {
    const nlohmann::json h = nlohmann::json::parse(bytes.begin() + static_cast<std::ptrdiff_t>(rec.man_at),
                                                   bytes.begin() + static_cast<std::ptrdiff_t>(rec.man_at + rec.man_len));
    if (name) *name = h.at("name").get<std::string>();
    if (note) *note = h.at("note");
    snap.state = h.at("state");
    for (const auto& e : h.at("blocks")) {
      const std::string kind = e.at("kind").get<std::string>();
      place(snap, kind, blocks.read(e, kind), where);
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat(where, ": a malformed manifest: ", e.what()));
  }
  lay.live += kMagicLen + rec.man_len + kRecordOver;
  for (const auto& [off, b] : rec.blobs)
    if (b.ok && off < rec.man_end) lay.blobs[{b.sum, b.bytes}] = off;
  if (layout) *layout = std::move(lay);
  return snap;
}

// The records of one format-3 save: the BLOBs neither the file nor this save holds yet, and the
// manifest's listing of the blocks. Written whole (`old` null) they follow the magic at `base`;
// else they are appended at base = old->end and reuse the pieces the file holds.
struct ManifestWriter {
  ManifestWriter(uint64_t base_, const Layout* old_) : base(base_), old(old_) {
    lay.current = true;
    if (old) lay.blobs = old->blobs;
  }
  uint64_t base;
  const Layout* old;
  std::string out;  // the records, to be written at `base`
  Layout lay;       // the file's layout once they are
  std::set<uint64_t> used;  // payload offsets already counted in lay.live
  nlohmann::json blocks = nlohmann::json::array();

  void count(const Piece& p) {
    if (used.insert(p.offset).second) lay.live += p.bytes + kRecordOver;
  }

  // A blob the file holds (or this save writes) with these bytes; else appended to out.
  void put(const std::string& payload, Piece* p) {
    p->sum = xxh64(payload.data(), payload.size());
    p->bytes = payload.size();
    auto b = lay.blobs.find({p->sum, p->bytes});
    if (b != lay.blobs.end()) {
      p->offset = b->second;
    } else {
      p->offset = base + out.size() + kRecordHead;
      put_record(out, "BLOB", payload);
      lay.blobs[{p->sum, p->bytes}] = p->offset;
    }
    count(*p);
  }

  // The pieces the file holds of block b, as long as they are its first tokens still, appended
  // to chain: its pieces where it was (window or bank), else where it was of the other kind.
  // Returns the tokens they cover, per layer.
  std::vector<int64_t> reuse(const Block& b, const char* kind, std::vector<Piece>& chain) {
    const size_t nl = b.layers.size();
    std::vector<int64_t> from(nl, 0);
    if (!old) return from;
    auto c = old->chains.find(std::string(kind) + ":" + b.id);
    if (c == old->chains.end()) c = old->chains.find((kind[0] == 'w' ? "bank:" : "window:") + b.id);
    if (c == old->chains.end()) return from;
    for (const Piece& p : c->second) {
      bool fits = p.tokens.size() == nl;
      for (size_t l = 0; fits && l < nl; ++l) fits = from[l] + p.tokens[l] <= b.layers[l].n_tokens();
      if (!fits) break;
      const std::string bytes = encode_block(slice_of(b, from, p.tokens), nullptr);
      if (bytes.size() != p.bytes || xxh64(bytes.data(), bytes.size()) != p.sum) break;
      count(p);
      chain.push_back(p);
      for (size_t l = 0; l < nl; ++l) from[l] += p.tokens[l];
    }
    return from;
  }

  // Block b of the given kind ("window" or "bank") into the listing: its head, the pieces reused
  // and one piece of the tokens after them.
  void add(const Block& b, const char* kind) {
    nlohmann::json e = {{"kind", kind}};
    Piece head;
    put(encode_block(head_of(b), nullptr), &head);
    e["head"] = piece_json(head);
    std::vector<Piece>& chain = lay.chains[std::string(kind) + ":" + b.id];
    WM_CHECK(chain.empty(), kind, " block '", b.id, "' is in the snapshot twice");
    const std::vector<int64_t> from = reuse(b, kind, chain);
    const size_t nl = b.layers.size();
    std::vector<int64_t> rest(nl);
    bool any = false;
    for (size_t l = 0; l < nl; ++l) {
      rest[l] = b.layers[l].n_tokens() - from[l];
      if (rest[l] > 0) any = true;
    }
    if (any || chain.empty()) {
      Piece p;
      p.tokens = rest;
      put(encode_block(slice_of(b, from, rest), nullptr), &p);
      chain.push_back(std::move(p));
    }
    nlohmann::json pieces = nlohmann::json::array();
    for (const Piece& p : chain) pieces.push_back(piece_json(p));
    e["pieces"] = std::move(pieces);
    e["stats"] = {bits_of(b.stats.attn_ema), b.stats.last_use, b.stats.uses};
    blocks.push_back(std::move(e));
  }
};

// Appends out's records to file f of the folder, which ends (or is cut back) at old_end: the
// BLOBs first, flushed, then the manifest, flushed. Never through a link, never into a file with
// other names. False (nothing written) when the file is not such a file or is shorter than
// old_end; throws wm::Error naming `where` when a write fails (the file cut back as it was).
bool append_records(int dirfd, const std::string& f, const std::string& where, const std::string& out,
                    size_t blobs_end, uint64_t old_end) {
  const int fd = ::openat(dirfd, f.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 ||
      static_cast<uint64_t>(st.st_size) < old_end) {
    if (fd >= 0) ::close(fd);
    return false;
  }
  try {
    if (static_cast<uint64_t>(st.st_size) != old_end && ::ftruncate(fd, static_cast<off_t>(old_end)) != 0)
      throw Error(str_cat("cannot cut ", where, " to its last manifest: ", errno_text(errno)));
    write_all(fd, out.data(), blobs_end, old_end, where);
    if (blobs_end > 0 && ::fdatasync(fd) != 0)
      throw Error(str_cat("cannot flush ", where, " to the disk: ", errno_text(errno)));
    write_all(fd, out.data() + blobs_end, out.size() - blobs_end, old_end + blobs_end, where);
    if (::fdatasync(fd) != 0) throw Error(str_cat("cannot flush ", where, " to the disk: ", errno_text(errno)));
  } catch (...) {
    (void)!::ftruncate(fd, static_cast<off_t>(old_end));  // the file as it was
    ::close(fd);
    throw;
  }
  ::close(fd);
  return true;
}

// What the folder's index lists: session name -> its file (entries naming another file are
// left out, logged), whether there is an index, and whether an entry was left out.
struct IndexListing {
  std::map<std::string, std::string> listed;
  bool present = true;
  bool ignored = false;
};

// Reads the folder's index (a hint: the files' own headers decide). Throws wm::CorruptData for a
// damaged index (the folder is left as it is), wm::Error when it cannot be read.
IndexListing read_index(int dirfd, const std::string& dir, const std::function<void(const std::string&)>& log) {
  IndexListing out;
  const std::string where = str_cat("the session index '", dir, "/", kIndex, "'");
  int why = 0;
  std::string text;
  try {
    text = read_file_at(dirfd, kIndex, where, &why);
  } catch (const CorruptData& e) {
    throw CorruptData(str_cat(e.what(), " (the folder is left as it is; move it away to start afresh)"));
  } catch (const Error&) {
    if (why != ENOENT) throw;
    out.present = false;
    return out;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object() || j.value("version", 0) != 1 || !j.contains("sessions") || !j["sessions"].is_object())
      throw CorruptData("not a session index of version 1");
    for (const auto& [n, f] : j["sessions"].items()) {
      const std::string file = f.is_string() ? f.get<std::string>() : f.dump();
      if (file != SessionFiles::file_of(n)) {
        if (log)
          log(str_cat(where, " names '", file, "' for session '", n, "', not its file '", SessionFiles::file_of(n),
                      "': the entry is ignored (that path is not touched)"));
        out.ignored = true;
        continue;
      }
      out.listed[n] = file;
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat(where, " is damaged: ", e.what(),
                              " (the folder is left as it is; move it away to start afresh)"));
  } catch (const CorruptData& e) {
    throw CorruptData(str_cat(where, ": ", e.what(), " (the folder is left as it is; move it away to start afresh)"));
  }
  return out;
}

// The folder's session files, sorted; its own temporaries (of writes cut short) are removed and
// counted in *temporaries, other files left alone. Throws wm::Error when it cannot be listed.
std::vector<std::string> list_session_files(int dirfd, const std::string& dir, int* temporaries) {
  std::vector<std::string> files;
  *temporaries = 0;
  const int dup = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  WM_CHECK(dup >= 0, "cannot list the session folder '", dir, "': ", errno_text(errno));
  DIR* d = ::fdopendir(dup);
  if (!d) {
    ::close(dup);
    WM_CHECK(false, "cannot list the session folder '", dir, "': ", errno_text(errno));
  }
  ::rewinddir(d);
  while (const dirent* e = ::readdir(d)) {
    const std::string f = e->d_name;
    if (is_session_file(f)) {
      files.push_back(f);
    } else if (is_own_temporary(f)) {
      if (::unlinkat(dirfd, f.c_str(), 0) == 0) ++*temporaries;
    }
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

std::string utc_stamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

int64_t next_position_of(const SessionSnapshot& snap) {
  return snap.state.at("next_pos").get<int64_t>() + (snap.state.at("pending").is_null() ? 0 : 1);
}

}  // namespace session_files_impl

SessionFiles::Fd::~Fd() {
  if (fd >= 0) ::close(fd);
}

std::string SessionFiles::file_of(const std::string& name) {
  return "s-" + hex64(xxh64(name.data(), name.size())) + ".wmsess";
}

std::string SessionFiles::encode(const std::string& name, const SessionSnapshot& snap, const nlohmann::json& note) {
  using namespace session_files_impl;
  std::vector<std::string> blocks;
  nlohmann::json list = nlohmann::json::array();
  size_t offset = 0;
  auto add = [&](const Block& b, const char* kind) {
    blocks.push_back(encode_block(b, nullptr));
    list.push_back({kind, offset, blocks.back().size()});
    offset += blocks.back().size();
  };
  for (const auto& b : snap.window) add(b, "window");
  for (const auto& b : snap.bank) add(b, "bank");
  const std::string header = nlohmann::json{{"name", name}, {"note", note}, {"state", snap.state}, {"blocks", list}}.dump();
  std::string out(kMagic2, kMagicLen);
  out.reserve(kMagicLen + 16 + header.size() + offset + 8);
  put_u64(out, header.size());
  out += header;
  for (const auto& b : blocks) out += b;
  put_u64(out, xxh64(out.data(), out.size()));
  return out;
}

SessionSnapshot SessionFiles::decode(const std::string& bytes, const std::string& where, std::string* name,
                                     nlohmann::json* note) {
  using namespace session_files_impl;
  if (bytes.size() >= kMagicLen && bytes.compare(0, kMagicLen, kMagic3) == 0)
    return decode3(bytes, where, name, note, nullptr);
  if (bytes.size() < kMagicLen + 16 || bytes.compare(0, kMagicLen, kMagic2) != 0)
    throw CorruptData(where + ": not a session file");
  const size_t body = bytes.size() - 8;
  if (get_u64(bytes, body) != xxh64(bytes.data(), body))
    throw CorruptData(where + ": the checksum does not match (the file is damaged or cut short)");
  const uint64_t hlen = get_u64(bytes, kMagicLen);
  if (hlen > body - kMagicLen - 8) throw CorruptData(where + ": the header runs past the end");
  const size_t base = kMagicLen + 8 + hlen;
  SessionSnapshot snap;
  try {
    const nlohmann::json h = nlohmann::json::parse(bytes.substr(kMagicLen + 8, hlen));
    if (name) *name = h.at("name").get<std::string>();
    if (note) *note = h.at("note");
    snap.state = h.at("state");
    for (const auto& e : h.at("blocks")) {
      const std::string kind = e.at(0).get<std::string>();
      const uint64_t off = e.at(1).get<uint64_t>(), n = e.at(2).get<uint64_t>();
      if (off > body - base || n > body - base - off)
        throw CorruptData(str_cat(where, ": a block lies past the end"));
      Block b = decode_block(bytes.data() + base + off, n, where);
      place(snap, kind, std::move(b), where);
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat(where, ": a malformed header: ", e.what()));
  }
  return snap;
}

SessionFiles::SessionFiles(std::string dir, std::function<void(const std::string&)> log, SessionFolderOptions opt)
    : dir_(std::move(dir)), log_(std::move(log)), opt_(std::move(opt)) {
  using namespace session_files_impl;
  WM_CHECK(!dir_.empty(), "the session folder is not named");
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  WM_CHECK(!ec && std::filesystem::is_directory(dir_), "cannot make the session folder '", dir_, "'",
           ec ? ": " + ec.message() : "");
  dirfd_.fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  WM_CHECK(dirfd_.fd >= 0, "cannot open the session folder '", dir_, "': ", errno_text(errno));
  lock_folder();

  const IndexListing index = read_index(dirfd_.fd, dir_, log_);
  int temporaries = 0;
  const std::vector<std::string> files = list_session_files(dirfd_.fd, dir_, &temporaries);
  if (temporaries > 0) say(str_cat(dir_, ": removed ", temporaries, " temporary file(s) of writes cut short"));

  std::vector<std::pair<int64_t, std::string>> by_time;  // (mtime in ns, name): the first clock
  std::vector<std::string> adopted;
  for (const auto& f : files) {
    int64_t mtime = 0;
    const std::string got = adopt_file(f, &mtime);
    if (got.empty()) continue;
    by_time.emplace_back(mtime, got);
    if (!index.listed.count(got)) adopted.push_back(got);
  }
  for (const auto& [n, f] : index.listed)
    if (!entries_.count(n)) say(str_cat("session '", n, "': the index names it, its file ", f, " is missing or not used; the session starts afresh"));
  if (!index.present && !entries_.empty())
    say(str_cat(dir_, ": no index: rebuilt from the headers of ", entries_.size(), " session file(s)"));
  else if (!adopted.empty())
    say(str_cat(dir_, ": adopted ", adopted.size(), " session file(s) the index did not name (",
                adopted.size() <= 8 ? nlohmann::json(adopted).dump() : std::string("...") , ")"));
  std::sort(by_time.begin(), by_time.end());
  for (const auto& [t, n] : by_time) entries_[n].used = ++clock_;
  bool same = index.present && !index.ignored && index.listed.size() == entries_.size();
  for (const auto& [n, en] : entries_) same = same && index.listed.count(n);
  if (!same && (index.present || !entries_.empty())) write_index();
}

void SessionFiles::lock_folder() {
  using namespace session_files_impl;
  // One owner at a time: the lock, then the owner's pid in the lock file.
  lockfd_.fd = ::openat(dirfd_.fd, kLock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  WM_CHECK(lockfd_.fd >= 0, "cannot open the lock file '", dir_, "/", kLock, "': ", errno_text(errno),
           " (is the session folder writable?)");
  if (::flock(lockfd_.fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    std::string holder;
    if (e == EWOULDBLOCK) {
      char buf[32] = {};
      const ssize_t n = ::pread(lockfd_.fd, buf, sizeof buf - 1, 0);
      for (ssize_t i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) holder.push_back(buf[i]);
      throw Error(str_cat("the session folder '", dir_, "' is in use by another server",
                          holder.empty() ? std::string() : " (pid " + holder + ")",
                          ": one process per folder (its lock: ", kLock, ")"));
    }
    throw Error(str_cat("cannot lock the session folder '", dir_, "': ", errno_text(e)));
  }
  struct stat st {};
  if (::fstat(lockfd_.fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1) {
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(lockfd_.fd, 0) == 0) (void)!::pwrite(lockfd_.fd, pid.data(), pid.size(), 0);
  }
}

std::string SessionFiles::adopt_file(const std::string& f, int64_t* mtime) {
  using namespace session_files_impl;
  const std::string where = str_cat(dir_, "/", f);
  std::string got;
  bool fatal = false;
  try {
    StoredSession s;
    Entry en;
    int why = 0;
    std::string bytes;
    try {
      bytes = read_file_at(dirfd_.fd, f, where, &why);
    } catch (const Error&) {
      if (why == ENOENT) return "";  // gone meanwhile
      // Out of resources, not a fault of the file: the folder is not opened.
      fatal = why == EMFILE || why == ENFILE || why == ENOMEM || why == EINTR || why == EAGAIN;
      throw;  // else below: moved aside
    }
    const SessionSnapshot snap = bytes.compare(0, kMagicLen, kMagic3) == 0
                                     ? decode3(bytes, where, &got, &s.note, &en.layout)
                                     : decode(bytes, where, &got, &s.note);
    if (file_of(got) != f) throw CorruptData(str_cat(where, ": holds session '", got, "', whose file is ", file_of(got)));
    s.file = f;
    s.next_position = next_position_of(snap);
    en.bytes = bytes.size();
    struct stat st {};
    *mtime = 0;
    if (::fstatat(dirfd_.fd, f.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
      *mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    found_[got] = std::move(s);
    entries_[got] = std::move(en);
    return got;
  } catch (const std::exception& e) {
    if (fatal) throw;
    const std::string moved = quarantine(f, e.what());
    say(str_cat(got.empty() ? "a session file" : "session '" + got + "'", " is not used: ", e.what(), "; ",
                moved.empty() ? "it is left where it is" : "moved aside to '" + moved + "' (kept, not deleted)",
                "; the session starts afresh"));
    return "";
  }
}

SessionFiles::~SessionFiles() = default;

uint64_t SessionFiles::total_bytes() const {
  uint64_t t = 0;
  for (const auto& [n, e] : entries_) t += e.bytes;
  return t;
}

void SessionFiles::write_index() {
  using namespace session_files_impl;
  nlohmann::json s = nlohmann::json::object();
  for (const auto& [n, e] : entries_) s[n] = file_of(n);
  write_whole_at(dirfd_.fd, dir_, kIndex, nlohmann::json{{"version", 1}, {"sessions", s}}.dump());
}

std::string SessionFiles::quarantine(const std::string& file, const std::string& why) {
  using namespace session_files_impl;
  if (!is_session_file(file)) return "";  // only the folder's own names move
  const std::string base = file + ".damaged-" + utc_stamp();
  for (int i = 1; i <= 100; ++i) {
    const std::string to = i == 1 ? base : str_cat(base, "-", i);
    // Never over an existing name: link the new name (fails if taken), then drop the old one.
    if (::linkat(dirfd_.fd, file.c_str(), dirfd_.fd, to.c_str(), 0) == 0) {
      ::unlinkat(dirfd_.fd, file.c_str(), 0);
      ::fsync(dirfd_.fd);
      return to;
    }
    if (errno == EEXIST) continue;
    if (::renameat2(dirfd_.fd, file.c_str(), dirfd_.fd, to.c_str(), RENAME_NOREPLACE) == 0) {
      ::fsync(dirfd_.fd);
      return to;
    }
    if (errno == EEXIST) continue;
    say(str_cat(dir_, "/", file, " (", why, ") cannot be moved aside: ", errno_text(errno)));
    return "";
  }
  return "";
}

void SessionFiles::remove_file(const std::string& file) {
  using namespace session_files_impl;
  WM_CHECK(is_session_file(file), "'", file, "' is not a session file's name");
  if (::unlinkat(dirfd_.fd, file.c_str(), 0) != 0 && errno != ENOENT)
    throw Error(str_cat("cannot remove '", dir_, "/", file, "': ", errno_text(errno)));
  ::fsync(dirfd_.fd);
}

uint64_t SessionFiles::save(const std::string& name, const LlmSession& session, const nlohmann::json& note) {
  return store(name, session.snapshot(), note).written;
}

uint64_t SessionFiles::save(const std::string& name, const SessionSnapshot& snap, const nlohmann::json& note) {
  return store(name, snap, note).written;
}

SaveReport SessionFiles::store(const std::string& name, const SessionSnapshot& snap, const nlohmann::json& note) {
  using namespace session_files_impl;
  const std::string f = file_of(name);
  const std::string where = str_cat("'", dir_, "/", f, "'");
  auto it = entries_.find(name);
  const Layout* old = it != entries_.end() && it->second.layout.current ? &it->second.layout : nullptr;

  // The records to append (or, written whole, to follow the magic), and the manifest.
  for (int pass = 0; pass < 2; ++pass) {
    const bool whole = pass == 1 || old == nullptr;
    ManifestWriter w(whole ? kMagicLen : old->end, whole ? nullptr : old);
    for (const auto& b : snap.window) w.add(b, "window");
    for (const auto& b : snap.bank) w.add(b, "bank");
    const std::string manifest =
        nlohmann::json{{"name", name}, {"note", note}, {"state", snap.state}, {"blocks", w.blocks}}.dump();
    std::string& out = w.out;
    Layout& lay = w.lay;
    const size_t blobs_end = out.size();
    put_record(out, "MANI", manifest);
    lay.live += kMagicLen + manifest.size() + kRecordOver;
    lay.end = w.base + out.size();
    // Dead bytes past the live ones: the file is written whole instead.
    if (!whole && lay.end - lay.live > lay.live) continue;
    SaveReport rep;
    rep.file_bytes = lay.end;
    if (whole) {
      // Only the blobs this save names (a whole file starts afresh).
      out.insert(0, kMagic3, kMagicLen);
      write_whole_at(dirfd_.fd, dir_, f, out);
      rep.rewritten = true;
    } else if (!append_records(dirfd_.fd, f, where, out, blobs_end, old->end)) {
      old = nullptr;  // written whole
      continue;
    }
    rep.written = out.size();
    const bool fresh = it == entries_.end();
    Entry& en = entries_[name];
    en.bytes = lay.end;
    en.used = ++clock_;
    en.layout = std::move(lay);
    if (fresh) {
      try {
        write_index();
      } catch (...) {
        entries_.erase(name);
        throw;
      }
    }
    rep.evicted = apply_budget(name);
    return rep;
  }
  throw Error("unreachable");  // the second pass always returns or throws
}

std::vector<std::string> SessionFiles::apply_budget(const std::string& saved) {
  std::vector<std::string> evicted;
  if (opt_.max_bytes == 0) return evicted;
  uint64_t total = total_bytes();
  while (total > opt_.max_bytes) {
    const std::string* lru = nullptr;
    uint64_t oldest = UINT64_MAX;
    for (const auto& [n, e] : entries_)
      if (n != saved && e.used < oldest && !(opt_.pinned && opt_.pinned(n))) oldest = e.used, lru = &n;
    if (!lru) break;
    const std::string n = *lru;
    try {
      remove_file(file_of(n));
    } catch (const std::exception& e) {
      say(str_cat("session '", n, "' could not be erased for the folder's budget: ", e.what()));
      break;
    }
    total -= entries_[n].bytes;
    entries_.erase(n);
    evicted.push_back(n);
  }
  if (!evicted.empty()) {
    try {
      write_index();
    } catch (const std::exception& e) {
      say(str_cat("the index could not be written after the budget erased ", evicted.size(), " session(s): ",
                  e.what(), " (the next open finds the files gone)"));
    }
  }
  return evicted;
}

nlohmann::json SessionFiles::load(const std::string& name, LlmSession& session) {
  using namespace session_files_impl;
  auto it = entries_.find(name);
  WM_CHECK(it != entries_.end(), "no session '", name, "' is saved in ", dir_);
  const std::string f = file_of(name);
  const std::string where = str_cat("session '", name, "' (", dir_, "/", f, ")");
  std::string got;
  nlohmann::json note;
  SessionSnapshot snap;
  int why = 0;
  try {
    const std::string bytes = read_file_at(dirfd_.fd, f, where, &why);
    Layout lay;
    const bool v3 = bytes.compare(0, kMagicLen, kMagic3) == 0;
    snap = v3 ? decode3(bytes, where, &got, &note, &lay) : decode(bytes, where, &got, &note);
    if (got != name) throw CorruptData(str_cat(where, ": the file holds session '", got, "'"));
    it->second.layout = std::move(lay);
    it->second.bytes = bytes.size();
    it->second.used = ++clock_;
  } catch (const Error& e) {
    session.reset();
    const bool transient = why == EMFILE || why == ENFILE || why == ENOMEM || why == EINTR || why == EAGAIN;
    if (transient) throw;
    // Damaged or unreadable: moved aside (never deleted), the session forgotten; a file gone
    // is forgotten too.
    const std::string moved = why == ENOENT ? std::string() : quarantine(f, e.what());
    if (why == ENOENT || !moved.empty()) {
      entries_.erase(it);
      try {
        write_index();
      } catch (const std::exception& ie) {
        say(str_cat("the index could not be written: ", ie.what()));
      }
      if (!moved.empty()) say(str_cat(where, ": moved aside to '", moved, "' (kept, not deleted)"));
    }
    throw;
  } catch (...) {
    session.reset();
    throw;
  }
  try {
    session.restore(snap);
  } catch (...) {
    session.reset();
    throw;
  }
  return note;
}

bool SessionFiles::erase(const std::string& name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return false;
  remove_file(file_of(name));
  entries_.erase(it);
  write_index();
  return true;
}

}  // namespace wm::llm
