#pragma once
// Helpers shared by the runtime tests.
#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/block.h"
#include "tests/temp_dir.h"

namespace wm::test {

// A folder of the test's own (make_temp_dir: mkdtemp under the system's temporary folder),
// removed with what the test put there when it goes out of scope.
struct TempFolder {
  explicit TempFolder(const std::string& prefix) : path(wm::testing::make_temp_dir(prefix)) {}
  ~TempFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  std::filesystem::path path;
};

// A block payload for the core's tests (each path defines its own): a few numbers, readable
// back from spill files.
class TestPayload final : public BlockPayload {
 public:
  explicit TestPayload(std::vector<double> v) : values(std::move(v)) {}
  std::vector<double> values;
  std::string type() const override { return "test.values"; }
  nlohmann::json to_json() const override { return values; }
  static std::shared_ptr<const BlockPayload> from_json(const nlohmann::json& j) {
    return std::make_shared<TestPayload>(j.get<std::vector<double>>());
  }
};
inline const bool kTestPayloadRegistered = register_block_payload("test.values", &TestPayload::from_json);

// The TestPayload's numbers; empty when the metadata has none.
inline std::vector<double> payload_values(const BlockMeta& m) {
  const TestPayload* p = m.payload_as<TestPayload>();
  return p ? p->values : std::vector<double>{};
}

// Damages a file: the byte at `at` becomes its complement, so it always changes (writing a fixed
// byte leaves the file intact when that byte was already there). Returns false when the file
// cannot be read or written there.
inline bool flip_byte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  char c = 0;
  if (!f.seekg(static_cast<std::streamoff>(at)).get(c)) return false;
  return static_cast<bool>(f.seekp(static_cast<std::streamoff>(at)).put(static_cast<char>(~c)).flush());
}

// True when two tensors have the same dtype, shape and bytes.
inline bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor x = a.to(at::kCPU).contiguous(), y = b.to(at::kCPU).contiguous();
  if (x.numel() == 0) return true;  // an empty tensor's data pointer may be null
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

inline bool blocks_bit_equal(const Block& a, const Block& b) {
  if (a.id != b.id || a.n_layers() != b.n_layers()) return false;
  for (int l = 0; l < a.n_layers(); ++l) {
    const auto &x = a.layers[l], &y = b.layers[l];
    if (!bit_equal(x.k, y.k) || !bit_equal(x.v, y.v) || !bit_equal(x.pos, y.pos) || !bit_equal(x.logw, y.logw))
      return false;
  }
  return true;
}

// A block with random K/V (dtype), random log-weights, positions t = base + i, and a different
// token count per layer when ragged (as compression leaves it).
inline Block random_block(const std::string& id, int layers, int heads, int n, int d, at::ScalarType dtype,
                          int n_axes = 1, bool ragged = false, int64_t base = 0) {
  Block b;
  b.id = id;
  for (int l = 0; l < layers; ++l) {
    const int nl = ragged ? std::max(1, n - l) : n;
    LayerKv kv;
    kv.k = at::randn({heads, nl, d}).to(dtype);
    kv.v = at::randn({heads, nl, d}).to(dtype);
    kv.pos = at::arange(base, base + nl, at::kLong).unsqueeze(1).repeat({1, n_axes});
    kv.logw = at::rand({nl}).log_();
    b.layers.push_back(kv);
  }
  b.meta.kind = "chunk";
  b.meta.payload = std::make_shared<TestPayload>(std::vector<double>{1.5, -2.25, 0.125});
  b.meta.priority = 0.5;
  b.stats.uses = 3;
  return b;
}

}  // namespace wm::test
