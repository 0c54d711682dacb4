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
#include <string>

namespace wm::fuzz {

// The scratch path for this process, with the given suffix (the readers do not look at it).
inline const std::string& scratch_path(const char* suffix) {
  static const std::string path = [&] {
    const std::filesystem::path dir = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    return (dir / ("wm_fuzz_" + std::to_string(::getpid()) + suffix)).string();
  }();
  return path;
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

// Removes the scratch file when the process exits.
struct ScratchCleanup {
  const char* suffix;
  ~ScratchCleanup() { std::remove(scratch_path(suffix).c_str()); }
};

}  // namespace wm::fuzz
