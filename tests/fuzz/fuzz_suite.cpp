// libFuzzer target: the suite / trajectory JSON reader (suite_from_json, with the pose and
// revisit checks on, as the programs load suites).
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"
#include "tools/world/suite.h"

WM_FUZZ_TARGET(suite) {
  const std::string& path = wm::fuzz::write_input(data, size, ".suite.json");
  try {
    wm::world::Suite s = wm::world::load_suite(path);
    (void)s;
  } catch (const wm::Error&) {
  }
  return 0;
}
