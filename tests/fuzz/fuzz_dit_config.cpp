// libFuzzer target: the world model's config reader (load_config: JSON, fields, ranges).
#include <nlohmann/json.hpp>

#include "dit/config.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

WM_FUZZ_TARGET(dit_config) {
  const std::string& path = wm::fuzz::write_input(data, size, ".dit.json");
  try {
    wm::dit::DitConfig c = wm::dit::load_config(path);
    // An accepted config round-trips through its JSON form.
    if (wm::dit::config_to_json(wm::dit::config_from_json(wm::dit::config_to_json(c))) != wm::dit::config_to_json(c))
      std::abort();
  } catch (const wm::Error&) {
  }
  return 0;
}
