// libFuzzer target: the GGUF reader (header, metadata of every type, tensor infos, layout), then
// every getter on every key and a read of every tensor's first and last byte.
#include "runtime/error.h"
#include "runtime/gguf.h"
#include "tests/fuzz/fuzz_input.h"

WM_FUZZ_TARGET(gguf) {
  const std::string& path = wm::fuzz::write_input(data, size, ".gguf");
  try {
    const wm::GgufFile g = wm::GgufFile::open(path);
    for (const std::string& key : g.keys()) {
      // Each getter either returns or throws wm::CorruptData for the wrong type or range.
      auto attempt = [](auto&& f) {
        try {
          f();
        } catch (const wm::CorruptData&) {
        }
      };
      attempt([&] { g.get_string(key); });
      attempt([&] { g.get_bool(key); });
      attempt([&] { g.get_u32(key); });
      attempt([&] { g.get_u64(key); });
      attempt([&] { g.get_i64(key); });
      attempt([&] { g.get_f32(key); });
      attempt([&] { g.get_string_array(key); });
      attempt([&] { g.get_i64_array(key); });
      attempt([&] { g.get_f32_array(key); });
    }
    volatile uint8_t sink = 0;
    for (const wm::GgufTensor& t : g.tensors()) {
      const wm::GgmlTypeTraits* tr = wm::ggml_type_traits(t.type);
      if (tr == nullptr || t.numel < 1 || t.nbytes != static_cast<size_t>(t.numel) / tr->block_size * tr->block_bytes)
        std::abort();
      if (t.offset + t.nbytes > g.data_size()) std::abort();
      if (&g.tensor(t.name) != &t) std::abort();
      if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    }
  } catch (const wm::Error&) {
  }
  return 0;
}
