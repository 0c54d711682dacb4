#pragma once
// Scratch folders for tests: a test writes its files inside a folder of its own, made by mkdtemp,
// never under a name of the shared temporary folder that another user could guess (a process id)
// and make first, or point elsewhere with a symbolic link.
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace wm::testing {

// A new folder in `parent` (by default the system's temporary folder) named `prefix` and six
// random characters, made for the caller alone by mkdtemp (a name no one had, mode 0700), so that
// removing it afterwards removes only what the test put there. Throws when it cannot be made.
inline std::filesystem::path make_temp_dir(const std::string& prefix,
                                           const std::filesystem::path& parent = std::filesystem::temp_directory_path()) {
  std::string name = (parent / (prefix + "XXXXXX")).string();
  if (::mkdtemp(name.data()) == nullptr)
    throw std::runtime_error("cannot make a folder " + name + ": " + std::strerror(errno));
  return std::filesystem::path(name);
}

}  // namespace wm::testing
