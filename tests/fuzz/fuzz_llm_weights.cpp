// libFuzzer target: a config.json and a safetensors file together, as loading checks them before
// it allocates anything (llmkv/weight_shapes.h): shapes that agree or not, tensors missing, extra
// or stored twice over, dtypes, offsets. The input is the config's text, one NUL byte, then the
// safetensors file (no NUL: the config alone, read and sized). Accepted pairs are checked for what
// acceptance promises: every parameter of the config found at its shape, and readable.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmkv/config.h"
#include "llmkv/weight_shapes.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

namespace fuzz_llm_weights {

WM_FUZZ_TARGET(llm_weights) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t cfg_size = nul ? static_cast<size_t>(nul - data) : size;
  const std::string& config = wm::fuzz::write_input(data, cfg_size, ".weights.config.json");
  if (nul) wm::fuzz::write_input(nul + 1, size - cfg_size - 1, ".weights.safetensors");
  const std::string& weights = wm::fuzz::scratch_path(".weights.safetensors");
  try {
    const wm::llm::LlmConfig c = wm::llm::LlmConfig::load(config);
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
    files.push_back(wm::SafeTensors::open(weights));
    const auto where = wm::llm::check_llm_checkpoint(c, files, {}, "fuzz", "", config);
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

}  // namespace fuzz_llm_weights
