#pragma once
// The message of an exception as a program prints it at its edge: libtorch's errors carry a C++
// backtrace after their message ("Exception raised from ... frame #0 ...", or the frames alone
// after an "[enforce fail at ...]" of its allocator), which is cut off; the message is what a
// user acts on. An allocation that failed reads as "out of memory: ...". Header-only, no
// libtorch needed.
#include <algorithm>
#include <exception>
#include <string>

namespace wm::cli {

inline std::string error_text(const std::exception& e) {
  std::string s = e.what();
  size_t cut = s.find("Exception raised from ");
  for (size_t at = 0; at < s.size();) {  // the first line that starts a backtrace
    const size_t eol = s.find('\n', at);
    const size_t b = s.find_first_not_of(" \t", at);
    if (b != std::string::npos && b < (eol == std::string::npos ? s.size() : eol) && s.compare(b, 7, "frame #") == 0) {
      cut = std::min(cut, at);
      break;
    }
    if (eol == std::string::npos) break;
    at = eol + 1;
  }
  if (cut != std::string::npos) s.erase(cut);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  // libtorch's CPU allocator: "[enforce fail at alloc_cpu.cpp:N] ... DefaultCPUAllocator: can't
  // allocate memory: you tried to allocate N bytes. Error code 12 (Cannot allocate memory)".
  const size_t oom = s.find("can't allocate memory: ");
  if (oom != std::string::npos && s.rfind("out of memory", 0) != 0)
    s = "out of memory: " + s.substr(oom + 23);
  return s.empty() ? std::string("unknown error") : s;
}

}  // namespace wm::cli
