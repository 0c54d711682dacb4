#pragma once
// The message of an exception as a program prints it at its edge: libtorch's errors carry a C++
// backtrace after their message ("Exception raised from ... frame #0 ..."), which is cut off;
// the message is what a user acts on. Header-only, no libtorch needed.
#include <exception>
#include <string>

namespace wm::cli {

inline std::string error_text(const std::exception& e) {
  std::string s = e.what();
  const size_t cut = s.find("Exception raised from ");
  if (cut != std::string::npos) s.erase(cut);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s.empty() ? std::string("unknown error") : s;
}

}  // namespace wm::cli
