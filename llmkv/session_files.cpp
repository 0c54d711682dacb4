#include "llmkv/session_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "runtime/error.h"
#include "runtime/hash.h"
#include "runtime/spill_file.h"

namespace wm::llm {

namespace {

constexpr const char kMagic[] = "WMSESS2\n";
constexpr size_t kMagicLen = sizeof kMagic - 1;
constexpr const char kIndex[] = "index.json";

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_u64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}

std::string errno_text() { return std::strerror(errno); }

// Writes `bytes` to `path` whole or not at all: a temporary file, flushed to the disk, renamed
// over `path`, the folder flushed after.
void write_whole(const std::string& dir, const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(str_cat("cannot write '", tmp, "': ", errno_text()));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(str_cat("cannot write '", tmp, "': ", why));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(str_cat("cannot flush '", tmp, "' to the disk: ", why));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw Error(str_cat("cannot rename '", tmp, "' to '", path, "': ", why));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str_cat("cannot read '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(str_cat("cannot read '", path, "'"));
  return ss.str();
}

std::string file_of(const std::string& name) { return "s-" + hex64(xxh64(name.data(), name.size())) + ".wmsess"; }

}  // namespace

std::string SessionFiles::encode(const std::string& name, const SessionSnapshot& snap, const nlohmann::json& note) {
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
  std::string out(kMagic, kMagicLen);
  out.reserve(kMagicLen + 16 + header.size() + offset + 8);
  put_u64(out, header.size());
  out += header;
  for (const auto& b : blocks) out += b;
  put_u64(out, xxh64(out.data(), out.size()));
  return out;
}

SessionSnapshot SessionFiles::decode(const std::string& bytes, const std::string& where, std::string* name,
                                     nlohmann::json* note) {
  if (bytes.size() < kMagicLen + 16 || bytes.compare(0, kMagicLen, kMagic) != 0)
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
      if (kind == "window")
        snap.window.push_back(std::move(b));
      else if (kind == "bank")
        snap.bank.push_back(std::move(b));
      else
        throw CorruptData(str_cat(where, ": a block of unknown kind '", kind, "'"));
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat(where, ": a malformed header: ", e.what()));
  }
  return snap;
}

SessionFiles::SessionFiles(std::string dir, std::function<void(const std::string&)> log)
    : dir_(std::move(dir)), log_(std::move(log)) {
  WM_CHECK(!dir_.empty(), "the session folder is not named");
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  WM_CHECK(!ec && std::filesystem::is_directory(dir_), "cannot make the session folder '", dir_, "'",
           ec ? ": " + ec.message() : "");
  WM_CHECK(::access(dir_.c_str(), W_OK) == 0, "the session folder '", dir_, "' is not writable");
  const std::string index_path = path_of(kIndex);
  std::map<std::string, std::string> listed;
  if (std::filesystem::exists(index_path)) {
    try {
      const nlohmann::json j = nlohmann::json::parse(read_whole(index_path));
      if (!j.is_object() || j.value("version", 0) != 1 || !j.contains("sessions") || !j["sessions"].is_object())
        throw CorruptData("not a session index of version 1");
      for (const auto& [n, f] : j["sessions"].items()) listed[n] = f.get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      throw CorruptData(str_cat("the session index '", index_path, "' is damaged: ", e.what(),
                                " (the folder is left as it is; move it away to start afresh)"));
    } catch (const CorruptData& e) {
      throw CorruptData(str_cat("the session index '", index_path, "': ", e.what()));
    }
  }
  bool dropped = false;
  for (const auto& [n, f] : listed) {
    const std::string where = path_of(f);
    try {
      WM_CHECK(f == file_of(n), "the index names the file '", f, "', not this session's");
      std::string got;
      StoredSession s;
      const SessionSnapshot snap = decode(read_whole(path_of(f)), where, &got, &s.note);
      if (got != n) throw CorruptData(str_cat(where, ": the file holds session '", got, "'"));
      s.file = f;
      s.next_position = snap.state.at("next_pos").get<int64_t>() + (snap.state.at("pending").is_null() ? 0 : 1);
      found_[n] = std::move(s);
      index_[n] = f;
    } catch (const std::exception& e) {
      if (log_) log_(str_cat("session '", n, "' is not used: ", e.what(), "; the session starts afresh"));
      std::error_code rm;
      std::filesystem::remove(path_of(f), rm);
      dropped = true;
    }
  }
  if (dropped) write_index();
  // Files no index names: a session's first write cut short before its index, or a temporary.
  int orphans = 0;
  std::set<std::string> named;
  for (const auto& [n, f] : index_) named.insert(f);
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    const std::string f = e.path().filename().string();
    if (f == kIndex) continue;
    if (!named.count(f) && (f.rfind("s-", 0) == 0 || f.size() > 4 && f.compare(f.size() - 4, 4, ".tmp") == 0)) {
      std::error_code rm;
      std::filesystem::remove(e.path(), rm);
      ++orphans;
    }
  }
  if (orphans > 0 && log_)
    log_(str_cat(dir_, ": removed ", orphans, " file(s) no index named (writes cut short)"));
}

void SessionFiles::write_index() {
  nlohmann::json s = nlohmann::json::object();
  for (const auto& [n, f] : index_) s[n] = f;
  write_whole(dir_, path_of(kIndex), nlohmann::json{{"version", 1}, {"sessions", s}}.dump());
}

size_t SessionFiles::save(const std::string& name, const LlmSession& session, const nlohmann::json& note) {
  return save(name, session.snapshot(), note);
}

size_t SessionFiles::save(const std::string& name, const SessionSnapshot& snap, const nlohmann::json& note) {
  const std::string bytes = encode(name, snap, note);
  const std::string f = file_of(name);
  write_whole(dir_, path_of(f), bytes);
  if (!index_.count(name)) {
    index_[name] = f;
    try {
      write_index();
    } catch (...) {
      index_.erase(name);
      throw;
    }
  }
  return bytes.size();
}

nlohmann::json SessionFiles::load(const std::string& name, LlmSession& session) {
  auto it = index_.find(name);
  WM_CHECK(it != index_.end(), "no session '", name, "' is saved in ", dir_);
  const std::string where = str_cat("session '", name, "' (", path_of(it->second), ")");
  std::string got;
  nlohmann::json note;
  try {
    const SessionSnapshot snap = decode(read_whole(path_of(it->second)), where, &got, &note);
    if (got != name) throw CorruptData(str_cat(where, ": the file holds session '", got, "'"));
    session.restore(snap);
  } catch (...) {
    session.reset();
    throw;
  }
  return note;
}

bool SessionFiles::erase(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return false;
  const std::string f = it->second;
  index_.erase(it);
  write_index();
  std::error_code rm;
  std::filesystem::remove(path_of(f), rm);
  return true;
}

}  // namespace wm::llm
