#pragma once
// A folder of outputs (PNG frames, a benchmark's results) that is whole or absent: the files are
// written into a hidden temporary folder and moved into place by commit(). When the folder does
// not exist yet, the temporary folder sits beside it, `<parent>/.<name>.<pid>.part/`, and
// becomes it on commit; when it exists, the temporary folder sits inside it, and commit moves
// each file in, replacing files of the same names (as it also does when the folder appeared in
// the meantime). Without a commit the destructor removes the temporary folder and everything in
// it; a termination signal does too (tools/cli/cleanup.h). The parents of `dir` that were
// missing are made, and removed again (when empty) unless it commits. The temporary folder holds
// plain files only. Header-only.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/run_folder.h"

namespace wm::cli {

class OutputFolder {
 public:
  // Creates the temporary folder (and the parents of `dir` that are missing). Throws wm::Error
  // naming `dir` when that fails.
  explicit OutputFolder(std::string dir) : dir_(std::move(dir)) {
    namespace fs = std::filesystem;
    if (dir_.empty()) throw Error("an output folder is empty");
    std::error_code ec;
    fs::path d = fs::absolute(dir_, ec).lexically_normal();
    if (ec) throw Error(str_cat("cannot write into ", dir_, ": ", ec.message()));
    if (!d.has_filename()) d = d.parent_path();  // "out/" -> "out"
    // Two folders of one process that are one folder get two temporary folders.
    static std::atomic<int> count{0};
    const int k = count++;
    const std::string pid = std::to_string(::getpid()) + (k ? "-" + std::to_string(k) : std::string());
    if (fs::exists(d, ec)) {
      if (!fs::is_directory(d, ec)) throw Error(str_cat("cannot write into ", dir_, ": it is not a folder"));
      staging_ = (d / (".wm." + pid + ".part")).string();
    } else {
      parents_.make(d.parent_path().string(), str_cat("cannot create the folder ", dir_));
      staging_ = (d.parent_path() / ("." + d.filename().string() + "." + pid + ".part")).string();
    }
    target_ = d.string();
    fs::remove_all(staging_, ec);
    if (!fs::create_directory(staging_, ec) || ec)
      throw Error(str_cat("cannot write into ", dir_, ": ", ec ? ec.message() : std::string("folder exists")));
    slot_ = register_temporary(staging_, /*folder=*/true);
  }
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;
  ~OutputFolder() { discard(); }

  // The folder as given.
  const std::string& dir() const { return dir_; }
  // The temporary folder, where the files are written until commit().
  const std::string& staging() const { return staging_; }
  // Where to write the file `name` (a plain name, no folder) until commit().
  std::string file(const std::string& name) const { return staging_ + "/" + name; }
  bool committed() const { return committed_; }

  // Moves the files into the folder. Throws wm::Error naming the file that could not be moved
  // (what was not moved yet is then removed).
  void commit() {
    namespace fs = std::filesystem;
    if (committed_) return;
    std::error_code ec;
    if (!fs::exists(target_, ec)) {
      fs::rename(staging_, target_, ec);
      if (ec) {
        discard();
        throw Error(str_cat("cannot rename ", staging_, " to ", target_, ": ", ec.message()));
      }
    } else {
      std::vector<fs::path> files;
      for (auto it = fs::directory_iterator(staging_, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
        files.push_back(it->path());
      if (ec) {
        const std::string what = ec.message();
        discard();
        throw Error(str_cat("cannot read ", staging_, ": ", what));
      }
      for (const fs::path& f : files) {
        const fs::path to = fs::path(target_) / f.filename();
        fs::rename(f, to, ec);
        if (ec) {
          const std::string what = ec.message();
          discard();
          throw Error(str_cat("cannot move ", f.string(), " to ", to.string(), ": ", what));
        }
      }
      fs::remove(staging_, ec);
    }
    unregister_temporary(slot_);
    slot_ = -1;
    committed_ = true;
    parents_.keep();
  }

  // Removes the temporary folder now, unless committed (idempotent; never throws).
  void discard() noexcept {
    if (committed_ || staging_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(staging_, ec);
    unregister_temporary(slot_);
    slot_ = -1;
    parents_.remove_empty();
  }

 private:
  MadeFolders parents_;  // the parents of dir it made
  std::string dir_, target_, staging_;
  int slot_ = -1;
  bool committed_ = false;
};

}  // namespace wm::cli
