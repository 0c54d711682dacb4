#pragma once
// Outputs that are whole or absent: a file is written under a temporary name in its own folder,
// `<folder>/.<name>.<pid>.part` (one of its own per output), and renamed to its final name only when the program commits it;
// if the program fails first, the temporary file is removed and nothing appears under the final
// name. While it exists the temporary name is registered with tools/cli/cleanup.h, so that a
// termination signal removes it too (in programs that call remove_temporaries_on_signal()).
// Header-only.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/error.h"
#include "tools/cli/cleanup.h"

namespace wm::cli {

// The temporary name of `path`: `<folder>/.<name>.<pid>.part`.
inline std::string part_path(const std::string& path) {
  const std::filesystem::path p(path);
  return (p.parent_path() / ("." + p.filename().string() + "." + std::to_string(::getpid()) + ".part")).string();
}

// A temporary name of `path` that no other output of this process holds now: part_path(path),
// or `<folder>/.<name>.<pid>-<k>.part` while that one is taken.
inline std::string unique_part_path(const std::string& path) {
  std::string tmp = part_path(path);
  const std::filesystem::path p(path);
  for (int k = 1; is_registered(tmp) && k < 1000; ++k)
    tmp = (p.parent_path() / ("." + p.filename().string() + "." + std::to_string(::getpid()) + "-" +
                              std::to_string(k) + ".part"))
              .string();
  return tmp;
}

// A final path and its temporary name, for writers that take a path (PNG, torch::save, FFmpeg):
// write to tmp(), then commit(). Without a commit the destructor removes the temporary file.
// A final path that exists and is no regular file (/dev/null, a FIFO) is written directly.
class OutputPath {
 public:
  // Throws wm::Error when `path` is empty or names a folder.
  explicit OutputPath(std::string path) : path_(std::move(path)) {
    namespace fs = std::filesystem;
    if (path_.empty()) throw Error("an output path is empty");
    std::error_code ec;
    if (fs::is_symlink(path_, ec)) {  // the link stays; its target is replaced
      const fs::path target = fs::weakly_canonical(path_, ec);
      if (!ec) path_ = target.string();
    }
    const fs::file_status st = fs::status(path_, ec);
    if (fs::is_directory(st)) throw Error(str_cat("cannot write ", path_, ": it is a folder"));
    if (fs::exists(st) && !fs::is_regular_file(st)) {
      tmp_ = path_;
      direct_ = true;
      return;
    }
    if (fs::path(path_).filename().empty()) throw Error(str_cat("cannot write ", path_, ": no file name"));
    tmp_ = unique_part_path(path_);
    slot_ = register_temporary(tmp_);
  }
  OutputPath(const OutputPath&) = delete;
  OutputPath& operator=(const OutputPath&) = delete;
  ~OutputPath() { discard(); }

  const std::string& path() const { return path_; }
  // Where the writer writes: the temporary name (the final path when written directly).
  const std::string& tmp() const { return tmp_; }
  bool committed() const { return committed_; }

  // Renames the temporary file to the final name (replacing a file there). Throws wm::Error
  // naming both when the rename fails (the temporary file is then removed).
  void commit() {
    if (committed_) return;
    if (!direct_) {
      std::error_code ec;
      std::filesystem::rename(tmp_, path_, ec);
      if (ec) {
        discard();
        throw Error(str_cat("cannot rename ", tmp_, " to ", path_, ": ", ec.message()));
      }
      unregister_temporary(slot_);
      slot_ = -1;
    }
    committed_ = true;
  }

  // Removes the temporary file now, unless committed (idempotent; never throws).
  void discard() noexcept {
    if (committed_ || direct_) return;
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
    unregister_temporary(slot_);
    slot_ = -1;
  }

 private:
  std::string path_, tmp_;
  int slot_ = -1;
  bool direct_ = false, committed_ = false;
};

// A file written through a stream, whole or absent.
class OutputFile {
 public:
  // Opens the temporary file for writing. Throws wm::Error naming the path if the folder
  // cannot be written.
  explicit OutputFile(std::string path) : out_path_(std::move(path)) {
    out_.open(out_path_.tmp(), std::ios::binary | std::ios::trunc);
    if (!out_) throw Error(str_cat("cannot write ", out_path_.path(), " (the folder is missing or not writable)"));
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() {
    if (!out_path_.committed()) {
      out_.close();
      out_path_.discard();
    }
  }

  std::ofstream& stream() { return out_; }
  const std::string& path() const { return out_path_.path(); }
  // Flushes, closes and renames to the final name. Throws wm::Error on a write failure (the
  // temporary file is then removed).
  void commit() {
    out_.flush();
    const bool ok = static_cast<bool>(out_);
    out_.close();
    if (!ok) {
      out_path_.discard();
      throw Error(str_cat("writing ", out_path_.path(), " failed"));
    }
    out_path_.commit();
  }

 private:
  OutputPath out_path_;
  std::ofstream out_;
};

}  // namespace wm::cli
