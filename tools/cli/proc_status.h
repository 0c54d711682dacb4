#pragma once
// A field of /proc/self/status (Linux) in bytes: "VmHWM:" (peak resident set), "RssAnon:"
// (anonymous resident memory, without file pages the kernel may drop), "RssFile:" (resident file
// pages, mapped files included). 0 where the file or the field is absent. Header-only.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace wm::cli {

inline double proc_status_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  const size_t n = std::strlen(field);
  for (std::string line; std::getline(f, line);)
    if (line.compare(0, n, field) == 0) return std::atof(line.c_str() + n) * 1024.0;  // the file says kB
  return 0;
}

}  // namespace wm::cli
