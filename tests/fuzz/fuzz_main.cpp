// The fuzz targets' one binary: libFuzzer's entry points dispatch to the target named by the
// name the binary runs under (build-fuzz/tests/fuzz/fuzz_<target>, links to wm_fuzz_targets) or
// by WM_FUZZ_TARGET. An unknown or missing name lists the targets and exits 2.
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/fuzz/fuzz_input.h"

namespace {

wm::fuzz::TargetFn chosen = nullptr;

std::string target_name(const char* argv0) {
  if (const char* env = std::getenv("WM_FUZZ_TARGET"); env != nullptr && *env != '\0') return env;
  std::string base = argv0 != nullptr ? argv0 : "";
  if (const size_t slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
  return base.rfind("fuzz_", 0) == 0 ? base.substr(5) : "";
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const std::string name = target_name(*argc > 0 ? (*argv)[0] : nullptr);
  const auto& targets = wm::fuzz::targets();
  const auto it = targets.find(name);
  if (it == targets.end()) {
    std::fprintf(stderr, "fuzz: no target '%s'; run as fuzz_<target> or set WM_FUZZ_TARGET to one of:", name.c_str());
    for (const auto& [n, fn] : targets) std::fprintf(stderr, " %s", n.c_str());
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  chosen = it->second;
  std::atexit(wm::fuzz::remove_scratch_files);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return chosen(data, size); }
