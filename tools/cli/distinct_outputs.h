#pragma once
// Outputs of one run that name one file (`--json X --csv X`, `X` and `./X`, a link and its
// target, two hard links) would overwrite each other, and an output that names an input would
// replace it: a program checks its paths before any work and refuses both, naming the options.
// A device or FIFO (/dev/null) may take any number of outputs. Header-only.
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"

namespace wm::cli {

// A path as the file it names: absolute, "." and ".." resolved, links followed as far as they
// exist.
inline std::string resolved_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) return path;
  const fs::path c = fs::weakly_canonical(p, ec);
  p = ec ? p.lexically_normal() : c;
  // A link to a file that does not exist yet names that file (weakly_canonical stops at it).
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = fs::weakly_canonical(target.is_absolute() ? target : p.parent_path() / target, ec);
  }
  return p.lexically_normal().string();
}

// Whether two paths name one file: the same resolved path, or one existing file (hard links).
inline bool same_file(const std::string& a, const std::string& b) {
  if (resolved_path(a) == resolved_path(b)) return true;
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// A path that takes any number of writers: an existing device, FIFO or socket.
inline bool shared_sink(const std::string& path) {
  struct stat s {};
  return ::stat(path.c_str(), &s) == 0 && (S_ISCHR(s.st_mode) || S_ISBLK(s.st_mode) || S_ISFIFO(s.st_mode) ||
                                           S_ISSOCK(s.st_mode));
}

// (option or description, path); entries with an empty path are not given and skipped.
using NamedPaths = std::vector<std::pair<std::string, std::string>>;

// Throws wm::Error when two outputs name one file, or an output names an input (e.g. "--model's
// config.json"), naming both and the path.
inline void require_distinct_outputs(const NamedPaths& outputs, const NamedPaths& inputs = {}) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [oi, pi] = outputs[i];
    if (pi.empty() || shared_sink(pi)) continue;
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      const auto& [oj, pj] = outputs[j];
      if (!pj.empty() && same_file(pi, pj))
        throw Error(str_cat(oi, " and ", oj, " name one file (", resolved_path(pi),
                            "): each output needs a path of its own"));
    }
    for (const auto& [in, p] : inputs)
      if (!p.empty() && same_file(pi, p))
        throw Error(str_cat(oi, " names ", resolved_path(pi), ", which is ", in, ": an output must not replace an input"));
  }
}

}  // namespace wm::cli
