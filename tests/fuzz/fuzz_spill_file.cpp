// libFuzzer target: the spill-file reader (frame, header, checksum, tensors). An accepted file
// must write back to the same bytes' worth of block: read, write, read again, bit-equal.
#include <cstring>

#include "runtime/error.h"
#include "runtime/spill_file.h"
#include "tests/fuzz/fuzz_input.h"

namespace fuzz_spill_file {
bool same(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const size_t n = a.numel() * a.element_size();
  return n == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), n) == 0;
}

WM_FUZZ_TARGET(spill_file) {
  const std::string& path = wm::fuzz::write_input(data, size, ".wmkv");
  wm::Block b;
  try {
    b = wm::read_spill_file(path);
  } catch (const wm::Error&) {
    return 0;
  }
  // Accepted: the block must survive a round trip unchanged.
  const std::string& again = wm::fuzz::scratch_path(".rewritten.wmkv");
  try {
    wm::write_spill_file(again, b);
  } catch (const wm::Error&) {
    return 0;  // e.g. a dtype the writer does not name; the reader's side is what is fuzzed
  }
  wm::Block r = wm::read_spill_file(again);
  if (r.id != b.id || r.layers.size() != b.layers.size() || !same(r.meta.embedding, b.meta.embedding)) std::abort();
  for (size_t i = 0; i < b.layers.size(); ++i)
    if (!same(r.layers[i].k, b.layers[i].k) || !same(r.layers[i].v, b.layers[i].v) ||
        !same(r.layers[i].pos, b.layers[i].pos) || !same(r.layers[i].logw, b.layers[i].logw))
      std::abort();
  return 0;
}

}  // namespace fuzz_spill_file
