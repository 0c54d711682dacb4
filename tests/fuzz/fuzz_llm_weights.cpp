// libFuzzer target: a config.json and a safetensors file together, as loading checks them before
// it allocates anything (llmkv/weight_shapes.h): shapes that agree or not, tensors missing, extra
// or stored twice over, dtypes, offsets. The input is the config's text, one NUL byte, then the
// safetensors file (no NUL: the config alone, read and sized). Accepted pairs are checked for what
// acceptance promises: every parameter of the config found at its shape, and readable.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "llmkv/config.h"
#include "llmkv/weight_shapes.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace {

std::string scratch(const char* suffix) {
  const std::filesystem::path dir =
      std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
  return (dir / ("wm_fuzz_" + std::to_string(::getpid()) + suffix)).string();
}

const std::string& config_path() {
  static const std::string p = scratch(".weights.config.json");
  return p;
}
const std::string& weights_path() {
  static const std::string p = scratch(".weights.safetensors");
  return p;
}

void write(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();  // the fuzzing machine itself is broken
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

struct Cleanup {
  ~Cleanup() {
    std::remove(config_path().c_str());
    std::remove(weights_path().c_str());
  }
} cleanup;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t cfg_size = nul ? static_cast<size_t>(nul - data) : size;
  write(config_path(), data, cfg_size);
  if (nul) write(weights_path(), nul + 1, size - cfg_size - 1);
  try {
    const wm::llm::LlmConfig c = wm::llm::LlmConfig::load(config_path());
    const wm::llm::ParameterShapes shapes = wm::llm::llm_parameter_shapes(c);
    int64_t total = 0;
    for (const auto& [name, shape] : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      total += n;
    }
    if (total != wm::llm::llm_parameter_count(c)) std::abort();
    (void)wm::llm::llm_size_fields(c);
    if (!nul) return 0;
    std::vector<wm::SafeTensors> files;
    files.push_back(wm::SafeTensors::open(weights_path()));
    const auto where = wm::llm::check_llm_checkpoint(c, files, {}, "fuzz", "", config_path());
    if (where.size() != shapes.size()) std::abort();
    for (size_t i = 0; i < where.size(); ++i) {
      const auto& [name, f] = where[i];
      if (name != shapes[i].first || f != 0 || files[0].entry(name).shape != shapes[i].second) std::abort();
      const at::Tensor t = files[0].get(name);
      if (t.sizes() != at::IntArrayRef(shapes[i].second)) std::abort();
    }
  } catch (const wm::Error&) {
  }
  return 0;
}
