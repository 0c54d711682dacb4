#pragma once
// Shared by the fuzz targets: the readers under test take file paths, so each input is written
// to a scratch file in a folder of the process's own (mkdtemp, on /dev/shm when it exists) and
// read back through the same entry point the programs use. Errors the readers are meant to
// raise (wm::Error and its CorruptData) are the expected outcome of a bad input; anything else
// escaping, a crash, a sanitizer report or an allocation over the fuzzer's -malloc_limit_mb is a
// finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <string>

#include "tests/temp_dir.h"

namespace wm::fuzz {

// This process's scratch folder, made on first use: a name no one else had, mode 0700, so that
// no file of another user's making is written through or removed.
inline const std::filesystem::path& scratch_dir() {
  static const auto* dir = [] {  // outlives the atexit cleanup
    const std::filesystem::path parent =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    try {
      return new std::filesystem::path(wm::testing::make_temp_dir("wm_fuzz_", parent));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz: %s\n", e.what());
      std::abort();  // the fuzzing machine itself is broken
    }
  }();
  return *dir;
}

// The scratch path for this process and suffix, in its scratch folder (the readers do not look at
// the suffix; a target that needs two files asks for two suffixes).
inline std::map<std::string, std::string>& scratch_paths() {
  static auto* paths = new std::map<std::string, std::string>();  // outlives the atexit cleanup
  return *paths;
}
inline const std::string& scratch_path(const char* suffix) {
  auto& paths = scratch_paths();
  auto it = paths.find(suffix);
  if (it == paths.end()) it = paths.emplace(suffix, (scratch_dir() / ("input" + std::string(suffix))).string()).first;
  return it->second;
}

// Writes the input to the scratch file and returns its path.
inline const std::string& write_input(const uint8_t* data, size_t size, const char* suffix) {
  const std::string& path = scratch_path(suffix);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();  // the fuzzing machine itself is broken
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Removes this process's scratch folder and the files in it (at exit); none was made when no
// input was written.
inline void remove_scratch_files() {
  if (scratch_paths().empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(scratch_dir(), ec);
}

// Every target is one function in one binary (tests/fuzz/fuzz_main.cpp picks the target from
// the name it runs under, fuzz_<target>, or WM_FUZZ_TARGET): the targets compile together
// instead of each paying for the readers' headers.
using TargetFn = int (*)(const uint8_t* data, size_t size);
inline std::map<std::string, TargetFn>& targets() {
  static std::map<std::string, TargetFn> t;
  return t;
}
struct RegisterTarget {
  RegisterTarget(const char* name, TargetFn fn) { targets()[name] = fn; }
};

}  // namespace wm::fuzz

// WM_FUZZ_TARGET(name) { ...body over data, size... } defines and registers target `name`.
#define WM_FUZZ_TARGET(name)                                                                   \
  static int wm_fuzz_target_##name(const uint8_t* data, size_t size);                          \
  static const ::wm::fuzz::RegisterTarget wm_fuzz_register_##name{#name, wm_fuzz_target_##name}; \
  static int wm_fuzz_target_##name(const uint8_t* data, size_t size)
