// libFuzzer target: the LLM path's config.json reader (both layouts, every field range-checked).
#include <nlohmann/json.hpp>

#include "llmkv/config.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

WM_FUZZ_TARGET(llm_config) {
  const std::string& path = wm::fuzz::write_input(data, size, ".config.json");
  try {
    wm::llm::LlmConfig c = wm::llm::LlmConfig::load(path);
    // An accepted config round-trips through its JSON form.
    if (wm::llm::LlmConfig::from_json(c.to_json()).to_json() != c.to_json()) std::abort();
  } catch (const wm::Error&) {
  }
  return 0;
}
