#include "runtime/json_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"

namespace wm {

namespace fs = std::filesystem;

nlohmann::json read_json_file(const std::string& path) {
  std::error_code ec;
  if (path.empty()) throw Error("a JSON file's path is empty");
  if (std::filesystem::is_directory(path, ec)) throw Error(str_cat(path, ": is a folder, not a JSON file"));
  if (std::filesystem::is_symlink(path, ec) && !std::filesystem::exists(path, ec))
    throw Error(str_cat(path, ": is a link to ", std::filesystem::read_symlink(path, ec).string(),
                        ", which does not exist"));
  // A device or FIFO (a link to /dev/zero) would be read without end; a model's largest JSON, a
  // tokenizer.json, is tens of MB.
  constexpr uintmax_t kMaxBytes = uintmax_t(256) << 20;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw Error(str_cat(path, ": is not a regular file"));
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxBytes)
    throw Error(str_cat(path, ": is ", size, " bytes, more than a JSON file of a model folder may be (", kMaxBytes, ")"));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str_cat(path, ": cannot open"));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(str_cat(path, ": cannot read"));
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat(path, ": not valid JSON: ", e.what()));
  }
}

void check_index_file_name(const std::string& name, const std::string& index) {
  const fs::path p(name);
  if (name.empty() || p.is_absolute() || p.has_parent_path() || name == "." || name == "..")
    throw Error(str_cat(index, ": weight_map names '", name, "', not a file name inside the folder"));
}

void write_text_atomically(const std::string& path, const std::string& text, const std::string& who) {
  const std::string tmp = str_cat(path, ".tmp.", ::getpid());
  // Created here and only here (O_EXCL, no link followed): what is removed on failure is this
  // process's own file, never one that was there before.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(str_cat(who, ": cannot create '", tmp, "': ", std::strerror(errno),
                        errno == EEXIST ? " (left there by something else: remove it to go on)" : ""));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool written = done == text.size() && ::close(fd) == 0;
  if (done != text.size()) ::close(fd);
  std::error_code ec;
  if (!written) {
    fs::remove(tmp, ec);
    throw Error(str_cat(who, ": write to '", tmp, "' failed"));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error(str_cat(who, ": cannot rename '", tmp, "' to '", path, "'"));
  }
}

}  // namespace wm
