// Dequantization of ggml's block types (runtime/gguf_quants.h) against the `gguf` Python
// package: block bytes and gguf.quants.dequantize's floats written by
// tools/gguf_fixtures/make_quant_fixtures.py (run by hand, gguf 0.19.0), compared bit for bit;
// block geometry against ggml's (the package's GGML_QUANT_SIZES, in the fixtures' sizes.txt);
// unsupported types and bad counts refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/gguf_quants.h"

namespace gguf_quants_test {

namespace fs = std::filesystem;
using wm::GgmlType;

const fs::path kDir = fs::path(WM_SOURCE_DIR) / "tests/runtime/fixtures/gguf_quants";

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct Case {
  const char* name;
  GgmlType type;
  int64_t block_values;  // ggml's, written out here as well as read from sizes.txt
  int64_t block_bytes;
};

const Case kCases[] = {
    {"F32", GgmlType::F32, 1, 4},        {"F16", GgmlType::F16, 1, 2},
    {"BF16", GgmlType::BF16, 1, 2},      {"Q8_0", GgmlType::Q8_0, 32, 34},
    {"Q4_0", GgmlType::Q4_0, 32, 18},    {"Q4_1", GgmlType::Q4_1, 32, 20},
    {"Q4_K", GgmlType::Q4_K, 256, 144},  {"Q5_K", GgmlType::Q5_K, 256, 176},
    {"Q6_K", GgmlType::Q6_K, 256, 210},
};

// The index of the first float whose bits differ, or -1.
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return int64_t(i);
  return a.size() == b.size() ? -1 : int64_t(std::min(a.size(), b.size()));
}

TEST(GgufQuants, BlockSizesAreGgmls) {
  std::ifstream f(kDir / "sizes.txt");
  ASSERT_TRUE(f.good()) << "missing " << (kDir / "sizes.txt");
  int rows = 0;
  std::string name;
  uint32_t id;
  int64_t values, bytes;
  while (f >> name >> id >> values >> bytes) {
    ++rows;
    SCOPED_TRACE(name);
    const GgmlType type = static_cast<GgmlType>(id);
    EXPECT_EQ(wm::ggml_type_name(type), name);
    ASSERT_TRUE(wm::quant_supported(type));
    EXPECT_EQ(wm::quant_block(type).values, values);
    EXPECT_EQ(wm::quant_block(type).bytes, bytes);
  }
  EXPECT_EQ(rows, 9);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(wm::quant_block(c.type).values, c.block_values);
    EXPECT_EQ(wm::quant_block(c.type).bytes, c.block_bytes);
    EXPECT_EQ(wm::quant_bytes(c.type, 3 * c.block_values), size_t(3 * c.block_bytes));
    EXPECT_EQ(wm::quant_bytes(c.type, 0), 0u);
  }
}

TEST(GgufQuants, DequantizeEqualsGgufPyBitForBit) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> blocks = read_bytes(kDir / (std::string(c.name) + ".blocks"));
    const std::vector<uint8_t> ref_bytes = read_bytes(kDir / (std::string(c.name) + ".f32"));
    ASSERT_FALSE(blocks.empty());
    ASSERT_EQ(blocks.size() % size_t(c.block_bytes), 0u);
    const int64_t n = int64_t(blocks.size()) / c.block_bytes * c.block_values;
    ASSERT_EQ(ref_bytes.size(), size_t(n) * sizeof(float));
    std::vector<float> ref(size_t(n), 0.0f), got(size_t(n), 0.0f);
    std::memcpy(ref.data(), ref_bytes.data(), ref_bytes.size());

    wm::dequantize(c.type, blocks.data(), n, got.data());
    const int64_t at = first_difference(got, ref);
    EXPECT_EQ(at, -1) << c.name << ": first difference at value " << at << " (block " << at / c.block_values
                      << "): got " << (at >= 0 ? got[at] : 0.0f) << ", gguf-py " << (at >= 0 ? ref[at] : 0.0f);

    // The tensor form: the same bits in the given shape; blocks read from an unaligned address.
    std::vector<uint8_t> shifted(blocks.size() + 1);
    std::memcpy(shifted.data() + 1, blocks.data(), blocks.size());
    const int64_t row = c.block_values == 1 ? 256 : c.block_values;
    const at::Tensor t = wm::dequantize_tensor(c.type, shifted.data() + 1, blocks.size(), {n / row, row});
    ASSERT_EQ(t.scalar_type(), at::kFloat);
    ASSERT_EQ(t.sizes(), (std::vector<int64_t>{n / row, row}));
    EXPECT_EQ(std::memcmp(t.data_ptr<float>(), ref.data(), ref_bytes.size()), 0);
  }
}

TEST(GgufQuants, UnsupportedTypesThrowNamingThem) {
  const uint8_t zeros[512] = {};
  float out[256];
  for (GgmlType type : {GgmlType::Q5_0, GgmlType::Q2_K, GgmlType::Q8_K, static_cast<GgmlType>(99)}) {
    EXPECT_FALSE(wm::quant_supported(type));
    EXPECT_THROW(wm::quant_block(type), wm::Error);
    EXPECT_THROW(wm::quant_bytes(type, 256), wm::Error);
    EXPECT_THROW(wm::dequantize(type, zeros, 256, out), wm::Error);
    EXPECT_THROW(wm::dequantize_tensor(type, zeros, 144, {256}), wm::Error);
  }
  EXPECT_EQ(wm::ggml_type_name(static_cast<GgmlType>(99)), "unknown(99)");
  try {
    wm::dequantize(GgmlType::Q5_0, zeros, 32, out);
    FAIL() << "Q5_0 accepted";
  } catch (const wm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q5_0"), std::string::npos) << e.what();
  }
}

TEST(GgufQuants, BadCountsAndShapesThrow) {
  const uint8_t zeros[1024] = {};
  std::vector<float> out(1024, 7.0f);
  EXPECT_THROW(wm::dequantize(GgmlType::Q4_K, zeros, 255, out.data()), wm::Error);
  EXPECT_THROW(wm::dequantize(GgmlType::Q8_0, zeros, 33, out.data()), wm::Error);
  EXPECT_THROW(wm::dequantize(GgmlType::Q4_0, zeros, -32, out.data()), wm::Error);
  EXPECT_THROW(wm::quant_bytes(GgmlType::Q6_K, 100), wm::Error);
  EXPECT_EQ(out[0], 7.0f);  // nothing written
  // A bad count names the type and the count.
  try {
    wm::dequantize(GgmlType::Q4_K, zeros, 255, out.data());
  } catch (const wm::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Q4_K"), std::string::npos) << m;
    EXPECT_NE(m.find("255"), std::string::npos) << m;
  }
  // The tensor form: rows not made of whole blocks, a byte count that is not the tensor's.
  EXPECT_THROW(wm::dequantize_tensor(GgmlType::Q8_0, zeros, 34, {2, 32}), wm::Error) << "too few bytes";
  EXPECT_THROW(wm::dequantize_tensor(GgmlType::Q8_0, zeros, 34 * 2, {64, 1}), wm::Error) << "row of 1";
  EXPECT_THROW(wm::dequantize_tensor(GgmlType::Q8_0, zeros, 34 * 3, {2, 32}), wm::Error) << "too many bytes";
  EXPECT_THROW(wm::dequantize_tensor(GgmlType::Q8_0, zeros, 34, {-1, 32}), wm::Error);
  EXPECT_EQ(wm::dequantize_tensor(GgmlType::Q8_0, zeros, 34 * 2, {2, 32}).sum().item<float>(), 0.0f);
  EXPECT_EQ(wm::dequantize_tensor(GgmlType::Q4_K, zeros, 0, {0, 256}).numel(), 0);
}

// dot_row on the fixtures' blocks against a double dot of the dequantized values: per row of
// 256 values and over the whole fixture (2,560 values; the float types' last row, which holds
// infinities and NaNs, left out). Tolerance: 1e-6 of sum |w_i x_i| (float32 sums in another order
// than the reference's; the worst measured here was 1.8e-7).
TEST(GgufQuants, DotRowMatchesDequantizeThenDot) {
  std::mt19937 rng(55);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> blocks = read_bytes(kDir / (std::string(c.name) + ".blocks"));
    const int64_t n = 2560;
    ASSERT_GE(int64_t(blocks.size()), n / c.block_values * c.block_bytes);
    std::vector<float> w(n), x(n);
    wm::dequantize(c.type, blocks.data(), n, w.data());
    for (float& v : x) v = normal(rng);
    for (int64_t len : {int64_t(256), n}) {
      for (int64_t begin = 0; begin + len <= n; begin += len) {
        double ref = 0.0, mag = 0.0;
        for (int64_t i = begin; i < begin + len; ++i) {
          ref += double(w[i]) * double(x[i]);
          mag += std::fabs(double(w[i]) * double(x[i]));
        }
        const uint8_t* row = blocks.data() + begin / c.block_values * c.block_bytes;
        const float got = wm::dot_row(c.type, row, x.data() + begin, len);
        EXPECT_LE(std::fabs(double(got) - ref), 1e-6 * mag)
            << "values [" << begin << ", " << begin + len << "): got " << got << ", reference " << ref;
      }
    }
  }
  float x[256] = {};
  const uint8_t zeros[256] = {};
  EXPECT_THROW(wm::dot_row(GgmlType::Q4_K, zeros, x, 128), wm::Error);
  EXPECT_THROW(wm::dot_row(GgmlType::Q5_0, zeros, x, 32), wm::Error);
  EXPECT_EQ(wm::dot_row(GgmlType::Q8_0, zeros, x, 0), 0.0f);
}

}  // namespace gguf_quants_test
