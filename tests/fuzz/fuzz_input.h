#pragma once
// Shared by the fuzz targets: the readers under test take file paths, so each input is written
// to one scratch file per process (on /dev/shm when it exists) and read back through the same
// entry point the programs use. Errors the readers are meant to raise (wm::Error and its
// CorruptData) are the expected outcome of a bad input; anything else escaping, a crash, a
// sanitizer report or an allocation over the fuzzer's -malloc_limit_mb is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

namespace wm::fuzz {

// The scratch path for this process and suffix (the readers do not look at the suffix; a target
// that needs two files asks for two suffixes).
inline std::map<std::string, std::string>& scratch_paths() {
  static auto* paths = new std::map<std::string, std::string>();  // outlives the atexit cleanup
  return *paths;
}
inline const std::string& scratch_path(const char* suffix) {
  auto& paths = scratch_paths();
  auto it = paths.find(suffix);
  if (it == paths.end()) {
    const std::filesystem::path dir = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    it = paths.emplace(suffix, (dir / ("wm_fuzz_" + std::to_string(::getpid()) + suffix)).string()).first;
  }
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

// Removes this process's scratch files (at exit).
inline void remove_scratch_files() {
  for (const auto& [suffix, path] : scratch_paths()) std::remove(path.c_str());
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
