// libFuzzer target: the safetensors reader (header, shapes, offsets), then every tensor read.
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

WM_FUZZ_TARGET(safetensors) {
  const std::string& path = wm::fuzz::write_input(data, size, ".safetensors");
  try {
    wm::SafeTensors st = wm::SafeTensors::open(path);
    for (const auto& name : st.names()) {
      at::Tensor t = st.get(name);
      if (t.numel() * t.element_size() != st.entry(name).end - st.entry(name).begin) std::abort();
    }
  } catch (const wm::Error&) {
  }
  return 0;
}
