#pragma once
// Folders a run makes for itself, and removes again: a program never deletes what it did not
// create (tools/cli/cleanup.h).
//   MadeFolders  the folders of a path that were missing (an output's, a spill folder's), created
//                and remembered; removed at the end, and on a termination signal, when they are
//                empty then (so a failed run leaves no empty folder behind, and a user's files
//                in one stay).
//   RunFolder    a fresh folder of this run's own files inside a folder the user names
//                (`<parent>/<prefix>.<pid>`), never one that existed: the run's scratch files
//                (spill files) live there, and it goes with them at the end or on a signal.
//   leftover_report  what earlier runs left in such a parent (their run folders, whose process
//                is gone, and loose spill files), for a warning: a run reports them and does not
//                touch them.
// Header-only.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tools/cli/cleanup.h"

namespace wm::cli {

class MadeFolders {
 public:
  MadeFolders() = default;
  MadeFolders(const MadeFolders&) = delete;
  MadeFolders& operator=(const MadeFolders&) = delete;
  ~MadeFolders() { remove_empty(); }

  // Creates `dir` and its missing parents, remembering those it created. Throws wm::Error
  // naming `option` and the folder when one cannot be made, or when `dir` is not a folder.
  void make(const std::string& dir, const std::string& option) {
    namespace fs = std::filesystem;
    if (dir.empty()) throw Error(str_cat(option, " is empty"));
    std::error_code ec;
    fs::path d = fs::absolute(dir, ec).lexically_normal();
    if (ec) throw Error(str_cat(option, ": cannot make the folder ", dir, ": ", ec.message()));
    if (!d.has_filename()) d = d.parent_path();
    std::vector<fs::path> missing;
    for (fs::path p = d; !p.empty() && !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path()) {
      missing.push_back(p);
      if (p == p.parent_path()) break;
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (!fs::create_directory(*it, ec) || ec) {
        const std::string why = ec ? ec.message() : std::string("it appeared meanwhile");
        throw Error(str_cat(option, ": cannot make the folder ", dir,
                            *it == d ? ": " + why : str_cat(" (", it->string(), ": ", why, ")")));
      }
      made_.push_back({it->string(), register_made_folder(it->string())});
    }
    if (!fs::is_directory(d, ec)) throw Error(str_cat(option, ": ", dir, " is not a folder"));
  }

  // Removes the folders it made that are empty now, deepest first, and forgets them all
  // (never throws).
  void remove_empty() noexcept {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
      std::error_code ec;
      if (std::filesystem::is_empty(it->first, ec) && !ec) std::filesystem::remove(it->first, ec);
      unregister_temporary(it->second);
    }
    made_.clear();
  }

  // Forgets the folders it made: they stay (a run that succeeded and left results there).
  void keep() noexcept {
    for (const auto& m : made_) unregister_temporary(m.second);
    made_.clear();
  }

 private:
  std::vector<std::pair<std::string, int>> made_;  // path, cleanup slot
};

class RunFolder {
 public:
  // Makes `parent` (and its missing parents: removed again at the end when empty) and in it a
  // fresh `<prefix>.<pid>` (or `<prefix>.<pid>-k` when that name is taken). Throws wm::Error
  // naming `option` when that fails.
  RunFolder(const std::string& parent, const std::string& prefix, const std::string& option) {
    namespace fs = std::filesystem;
    parents_.make(parent, option);
    std::error_code ec;
    const fs::path p = fs::absolute(parent, ec).lexically_normal();
    for (int k = 0; k < 1000 && path_.empty(); ++k) {
      const fs::path d = p / str_cat(prefix, ".", ::getpid(), k ? str_cat("-", k) : std::string());
      if (fs::create_directory(d, ec) && !ec) path_ = d.string();
      else if (ec) throw Error(str_cat(option, ": cannot make a folder in ", parent, ": ", ec.message()));
    }
    if (path_.empty()) throw Error(str_cat(option, ": no free folder name ", prefix, ".", ::getpid(), "-k in ", parent));
    made_.push_back({path_, register_temporary(path_, /*folder=*/true)});
  }
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;
  ~RunFolder() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
      std::error_code ec;
      std::filesystem::remove_all(it->first, ec);
      unregister_temporary(it->second);
    }
  }

  const std::string& path() const { return path_; }
  // Makes `<path>/<name>` (a part of the run, e.g. one policy's spill files), removed with it.
  std::string subfolder(const std::string& name) {
    const std::string d = path_ + "/" + name;
    std::error_code ec;
    if (!std::filesystem::create_directory(d, ec) || ec)
      throw Error(str_cat("cannot make the folder ", d, ": ", ec ? ec.message() : std::string("it exists")));
    made_.push_back({d, register_temporary(d, /*folder=*/true)});
    return d;
  }

 private:
  MadeFolders parents_;
  std::string path_;
  std::vector<std::pair<std::string, int>> made_;
};

// What earlier runs left in `parent`: folders `<prefix>.<pid>[-k]` of processes that no longer
// run, and loose spill files (*.wmkv), counted with their bytes. Empty when there is nothing.
inline std::string leftover_report(const std::string& parent, const std::string& prefix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int64_t folders = 0, files = 0;
  uint64_t bytes = 0;
  std::string first;
  auto add_file = [&](const fs::directory_entry& f) {
    std::error_code e;
    if (f.is_regular_file(e)) ++files, bytes += f.file_size(e);
  };
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code e;
    if (it->is_directory(e) && name.rfind(prefix + ".", 0) == 0) {
      const std::string rest = name.substr(prefix.size() + 1);
      size_t used = 0;
      long pid = 0;
      try {
        pid = std::stol(rest, &used);
      } catch (const std::exception&) {
        continue;
      }
      if (used == 0 || (used < rest.size() && rest[used] != '-') || pid <= 0) continue;
      if (pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // running
      ++folders;
      if (first.empty()) first = it->path().string();
      for (auto f = fs::recursive_directory_iterator(it->path(), e); !e && f != fs::recursive_directory_iterator();
           f.increment(e))
        add_file(*f);
    } else if (it->path().extension() == ".wmkv") {
      if (first.empty()) first = it->path().string();
      add_file(*it);
    }
  }
  if (folders == 0 && files == 0) return "";
  return str_cat(parent, " holds what earlier runs left: ", files, " files, ", bytes / 1024, " KiB",
                 folders ? str_cat(" in ", folders, " run folders") : std::string(), " (", first,
                 folders + files > 1 ? ", ..." : "", "); this run neither reads nor removes them");
}

}  // namespace wm::cli
