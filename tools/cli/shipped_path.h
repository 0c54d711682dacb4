#pragma once
// Defaults that name what the repository ships (assets/models/tiny-llm, configs/qwen2-0.5b.json)
// are relative to the repository's root; a program started elsewhere finds them beside its own
// binary: in a folder above it (a build tree inside the repository) or in <prefix>/share/wm of an
// installed one. Header-only.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace wm::cli {

// The places where the shipped path `rel` is looked for, in order: the working directory, each
// folder above the running binary (up to 4 levels), <binary>/../share/wm.
inline std::vector<std::string> shipped_candidates(const std::string& rel) {
  namespace fs = std::filesystem;
  std::vector<std::string> out = {rel};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path d = exe.parent_path();
    for (int up = 0; up < 4 && !d.empty() && d != d.parent_path(); ++up) {
      d = d.parent_path();
      out.push_back((d / rel).string());
    }
    out.push_back((exe.parent_path().parent_path() / "share" / "wm" / rel).string());
  }
  return out;
}

// The first of shipped_candidates(rel) that exists, or "" (then `tried` lists them all).
inline std::string find_shipped(const std::string& rel, std::string* tried = nullptr) {
  std::string list;
  for (const std::string& c : shipped_candidates(rel)) {
    std::error_code ec;
    if (std::filesystem::exists(c, ec)) return c;
    list += (list.empty() ? "" : ", ") + c;
  }
  if (tried) *tried = list;
  return "";
}

}  // namespace wm::cli
