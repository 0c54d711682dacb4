#pragma once
// Outputs that are whole or absent: a file is written under a temporary name in its own folder
// and renamed to its final name only when the program commits it; if the program fails first,
// the temporary file is removed and nothing appears under the final name. Header-only.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/error.h"

namespace wm::cli {

class OutputFile {
 public:
  // Opens `<folder>/.<name>.<pid>.part` for writing. Throws wm::Error naming the path if the
  // folder cannot be written.
  explicit OutputFile(std::string path) : path_(std::move(path)) {
    namespace fs = std::filesystem;
    const fs::path p(path_);
    tmp_ = (p.parent_path() / ("." + p.filename().string() + "." + std::to_string(::getpid()) + ".part")).string();
    out_.open(tmp_, std::ios::binary | std::ios::trunc);
    if (!out_) throw Error(str_cat("cannot write ", path_, " (the folder is missing or not writable)"));
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() {
    if (!committed_) {
      out_.close();
      std::error_code ec;
      std::filesystem::remove(tmp_, ec);
    }
  }

  std::ofstream& stream() { return out_; }
  // Flushes, closes and renames to the final name. Throws wm::Error on a write failure (the
  // temporary file is then removed).
  void commit() {
    out_.flush();
    const bool ok = static_cast<bool>(out_);
    out_.close();
    if (!ok) throw Error(str_cat("writing ", path_, " failed"));
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) throw Error(str_cat("cannot rename ", tmp_, " to ", path_, ": ", ec.message()));
    committed_ = true;
  }

 private:
  std::string path_, tmp_;
  std::ofstream out_;
  bool committed_ = false;
};

}  // namespace wm::cli
