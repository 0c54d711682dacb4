// The GGUF reader (runtime/gguf.h): files written by the `gguf` Python package
// (tools/gguf_fixtures/make_fixtures.py, run by hand) read back as its GGUFReader reads them;
// files written byte by byte here for the versions, alignments and every kind of damage; and
// SmolLM2-135M-Instruct's file when tools/get_model.sh has put it in the cache.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/gguf.h"
#include "tests/temp_dir.h"

namespace gguf_test {

namespace fs = std::filesystem;
using wm::CorruptData;
using wm::GgmlType;
using wm::GgufFile;
using wm::GgufValueType;

const fs::path kFixtures = fs::path(WM_SOURCE_DIR) / "tests/runtime/fixtures/gguf";

// A GGUF file written by hand: the header's counts are given, so a test can lie in them.
class Writer {
 public:
  Writer& u8(uint8_t v) { return raw(&v, 1); }
  Writer& u32(uint32_t v) { return raw(&v, 4); }
  Writer& u64(uint64_t v) { return raw(&v, 8); }
  Writer& f32(float v) { return raw(&v, 4); }
  Writer& str(const std::string& s) {
    u64(s.size());
    bytes.append(s);
    return *this;
  }
  Writer& raw(const void* p, size_t n) {
    bytes.append(static_cast<const char*>(p), n);
    return *this;
  }
  Writer& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    bytes.append("GGUF");
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  Writer& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
  Writer& kv_str(const std::string& key, const std::string& v) { return str(key).u32(8).str(v); }
  Writer& tensor_info(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  // Zero bytes up to the next multiple of `align` (the start of the data section).
  Writer& pad(size_t align = 32) {
    while (bytes.size() % align != 0) bytes.push_back('\0');
    return *this;
  }
  Writer& zeros(size_t n) {
    bytes.append(n, '\0');
    return *this;
  }
  std::string bytes;
};

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = wm::testing::make_temp_dir("wm_gguf_test_");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& bytes, const std::string& name = "t.gguf") {
    const std::string path = (dir_ / name).string();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  // The CorruptData message of opening these bytes; fails the test when it opens.
  std::string open_error(const std::string& bytes) {
    const std::string path = write(bytes);
    try {
      GgufFile::open(path);
    } catch (const CorruptData& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << "the message names no file: " << m;
      return m;
    }
    ADD_FAILURE() << "opened without an error";
    return {};
  }
  fs::path dir_;
};

// A valid file of two F32 tensors ("a" [4], "b" [2, 3]) and two keys, as bytes.
std::string small_file(uint32_t version = 3) {
  Writer w;
  w.header(2, 2, version).kv_str("general.architecture", "llama").kv_u32("llama.block_count", 2);
  w.tensor_info("a", {4}, 0, 0).tensor_info("b", {3, 2}, 0, 32).pad();
  for (int i = 0; i < 4; ++i) w.f32(static_cast<float>(i));
  w.zeros(16);
  for (int i = 0; i < 6; ++i) w.f32(10.0f + static_cast<float>(i));
  return w.bytes;
}

// ---- The files the gguf Python package wrote, against what its reader read from them ----

void expect_value(const GgufFile& g, const nlohmann::json& m) {
  const std::string key = m["key"];
  SCOPED_TRACE(key);
  const std::string type = m["type"];
  const wm::GgufValue& v = g.value(key);
  EXPECT_EQ(wm::gguf_value_type_name(v.type), type);
  const nlohmann::json& want = m["value"];
  if (type == "string") {
    EXPECT_EQ(g.get_string(key), want.get<std::string>());
  } else if (type == "bool") {
    EXPECT_EQ(g.get_bool(key), want.get<bool>());
  } else if (type == "float32" || type == "float64") {
    EXPECT_EQ(g.get_f64(key), want.get<double>());
  } else if (type == "uint64") {
    EXPECT_EQ(g.get_u64(key), want.get<uint64_t>());
  } else if (type == "array") {
    const std::string et = m["elem_type"];
    EXPECT_EQ(wm::gguf_value_type_name(v.elem_type), et);
    ASSERT_EQ(v.count, want.size());
    if (et == "string") {
      EXPECT_EQ(g.get_string_array(key), want.get<std::vector<std::string>>());
    } else if (et == "float32" || et == "float64") {
      const std::vector<float> got = g.get_f32_array(key);
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<float>(want[i].get<double>()));
    } else if (et == "bool") {
      ASSERT_EQ(v.raw.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(v.raw[i] != 0, want[i].get<bool>());
    } else if (et == "uint64") {
      // 2^64 - 1 is outside int64: the array getter refuses it by name.
      EXPECT_THROW(g.get_i64_array(key), CorruptData);
      ASSERT_EQ(v.raw.size(), 8 * want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        uint64_t x;
        std::memcpy(&x, v.raw.data() + 8 * i, 8);
        EXPECT_EQ(x, want[i].get<uint64_t>());
      }
    } else if (et == "array") {
      ASSERT_EQ(v.arrays.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        const wm::GgufValue& inner = v.arrays[i];
        EXPECT_EQ(inner.type, GgufValueType::ARRAY);
        ASSERT_EQ(inner.elem_type, GgufValueType::INT32);
        ASSERT_EQ(inner.count, want[i].size());
        for (size_t j = 0; j < inner.count; ++j) {
          int32_t x;
          std::memcpy(&x, inner.raw.data() + 4 * j, 4);
          EXPECT_EQ(x, want[i][j].get<int64_t>());
        }
      }
    } else {
      EXPECT_EQ(g.get_i64_array(key), want.get<std::vector<int64_t>>());
    }
  } else {  // a signed or unsigned integer up to 32 bits, or int64
    EXPECT_EQ(g.get_i64(key), want.get<int64_t>());
  }
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += {d[p[i] >> 4], d[p[i] & 15]};
  return s;
}

TEST_F(GgufTest, ReadsWhatTheGgufPackageWroteAsItsReaderDoes) {
  std::ifstream f(kFixtures / "expected.json");
  ASSERT_TRUE(f) << "missing " << (kFixtures / "expected.json");
  const nlohmann::json expected = nlohmann::json::parse(f);
  ASSERT_EQ(expected.size(), 2u);
  for (const auto& [name, want] : expected.items()) {
    SCOPED_TRACE(name);
    const GgufFile g = GgufFile::open((kFixtures / name).string());
    EXPECT_EQ(g.version(), want["version"].get<uint32_t>());
    EXPECT_EQ(g.alignment(), want["alignment"].get<uint32_t>());
    EXPECT_EQ(g.data_offset(), want["data_offset"].get<uint64_t>());
    ASSERT_EQ(g.keys().size(), want["metadata"].size());
    for (size_t i = 0; i < g.keys().size(); ++i) {
      EXPECT_EQ(g.keys()[i], want["metadata"][i]["key"].get<std::string>());  // file order
      expect_value(g, want["metadata"][i]);
    }
    ASSERT_EQ(g.tensors().size(), want["tensors"].size());
    for (size_t i = 0; i < g.tensors().size(); ++i) {
      const wm::GgufTensor& t = g.tensors()[i];
      const nlohmann::json& wt = want["tensors"][i];
      SCOPED_TRACE(t.name);
      EXPECT_EQ(t.name, wt["name"].get<std::string>());
      EXPECT_EQ(static_cast<uint32_t>(t.type), wt["type"].get<uint32_t>());
      EXPECT_EQ(t.dims, wt["dims"].get<std::vector<int64_t>>());
      EXPECT_EQ(t.offset, wt["offset"].get<uint64_t>());
      EXPECT_EQ(t.nbytes, wt["nbytes"].get<size_t>());
      EXPECT_EQ(hex(t.data, t.nbytes), wt["hex"].get<std::string>());
      EXPECT_EQ(&g.tensor(t.name), &t);
    }
  }
}

TEST_F(GgufTest, TypedGettersCheckTypeAndRange) {
  const GgufFile g = GgufFile::open((kFixtures / "all_types.gguf").string());
  EXPECT_EQ(g.get_u32("test.u8"), 250u);
  EXPECT_EQ(g.get_u32("test.u32"), 4000000000u);
  EXPECT_EQ(g.get_i64("test.i8"), -100);
  EXPECT_EQ(g.get_i64("test.i64"), -9000000000000000000LL);
  EXPECT_EQ(g.get_u64("test.u64"), 18000000000000000000ULL);
  EXPECT_FLOAT_EQ(g.get_f32("test.f32"), 0.1f);
  EXPECT_EQ(g.get_u32("missing.key", 7u), 7u);
  EXPECT_EQ(g.get_string("missing.key", "x"), "x");
  EXPECT_FALSE(g.has("missing.key"));
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const CorruptData& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message([&] { g.get_u32("test.i8"); });  // -100
  EXPECT_NE(m.find("'test.i8' is -100, outside the range of uint32"), std::string::npos) << m;
  m = message([&] { g.get_u32("test.u64"); });
  EXPECT_NE(m.find("outside the range of uint32"), std::string::npos) << m;
  m = message([&] { g.get_i64("test.u64"); });
  EXPECT_NE(m.find("outside the range of int64"), std::string::npos) << m;
  m = message([&] { g.get_string("test.u32"); });
  EXPECT_NE(m.find("key 'test.u32' is uint32, expected a string"), std::string::npos) << m;
  EXPECT_NE(m.find("all_types.gguf"), std::string::npos) << m;
  m = message([&] { g.get_f32("test.string"); });
  EXPECT_NE(m.find("is string, expected a float"), std::string::npos) << m;
  m = message([&] { g.get_u32("test.array.u32"); });
  EXPECT_NE(m.find("is an array of uint32, expected an integer"), std::string::npos) << m;
  m = message([&] { g.get_string_array("test.array.i32"); });
  EXPECT_NE(m.find("an array of int32, expected an array of strings"), std::string::npos) << m;
  m = message([&] { g.get_u32("no.such.key"); });
  EXPECT_NE(m.find("no metadata key 'no.such.key'"), std::string::npos) << m;
  m = message([&] { g.tensor("no.such.tensor"); });
  EXPECT_NE(m.find("no tensor 'no.such.tensor'"), std::string::npos) << m;
  m = message([&] { g.get_bool("test.u8"); });
  EXPECT_NE(m.find("expected a bool"), std::string::npos) << m;
}

// ---- Files written here ----

TEST_F(GgufTest, ReadsVersions2And3AndTheDataInPlace) {
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE(version);
    const GgufFile g = GgufFile::open(write(small_file(version)));
    EXPECT_EQ(g.version(), version);
    EXPECT_EQ(g.alignment(), 32u);
    EXPECT_EQ(g.get_string("general.architecture"), "llama");
    EXPECT_EQ(g.get_u32("llama.block_count"), 2u);
    const wm::GgufTensor& b = g.tensor("b");
    EXPECT_EQ(b.dims, (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(b.numel, 6);
    EXPECT_EQ(b.nbytes, 24u);
    EXPECT_EQ(b.offset, 32u);
    float x[6];
    std::memcpy(x, b.data, sizeof x);
    EXPECT_EQ(x[5], 15.0f);
    // The data is the file's, mapped: the pointer lies at the data offset of the mapping.
    EXPECT_EQ(g.tensor("a").data + 32, b.data);
    EXPECT_EQ(g.data_offset() % 32, 0u);
    EXPECT_EQ(g.data_offset() + g.data_size(), small_file(version).size());
  }
}

TEST_F(GgufTest, CopiesKeepTheMappingAlive) {
  const wm::GgufTensor* t = nullptr;
  std::vector<GgufFile> keep;
  {
    GgufFile g = GgufFile::open(write(small_file()));
    keep.push_back(g);
  }
  t = &keep[0].tensor("a");
  float x[4];
  std::memcpy(x, t->data, sizeof x);
  EXPECT_EQ(x[3], 3.0f);
}

TEST_F(GgufTest, BlockSizesAndBytesAreGgmls) {
  using wm::ggml_type_traits;
  const std::vector<std::tuple<GgmlType, uint32_t, uint32_t>> want = {
      {GgmlType::F32, 1, 4},      {GgmlType::F16, 1, 2},      {GgmlType::BF16, 1, 2},    {GgmlType::Q4_0, 32, 18},
      {GgmlType::Q4_1, 32, 20},   {GgmlType::Q5_0, 32, 22},   {GgmlType::Q5_1, 32, 24},  {GgmlType::Q8_0, 32, 34},
      {GgmlType::Q8_1, 32, 36},   {GgmlType::Q2_K, 256, 84},  {GgmlType::Q3_K, 256, 110}, {GgmlType::Q4_K, 256, 144},
      {GgmlType::Q5_K, 256, 176}, {GgmlType::Q6_K, 256, 210}, {GgmlType::Q8_K, 256, 292}};
  for (auto [t, bs, bb] : want) {
    SCOPED_TRACE(wm::ggml_type_name(t));
    ASSERT_NE(ggml_type_traits(t), nullptr);
    EXPECT_EQ(ggml_type_traits(t)->block_size, bs);
    EXPECT_EQ(ggml_type_traits(t)->block_bytes, bb);
  }
  for (uint32_t gone : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 1000u}) EXPECT_EQ(ggml_type_traits(gone), nullptr) << gone;
  // A Q4_1 tensor of two rows of 64: 4 blocks of 20 bytes.
  Writer w;
  w.header(1, 0).tensor_info("q", {64, 2}, 3, 0).pad().zeros(80);
  const GgufFile g = GgufFile::open(write(w.bytes));
  EXPECT_EQ(g.tensor("q").nbytes, 80u);
  EXPECT_EQ(g.tensor("q").type, GgmlType::Q4_1);
}

TEST_F(GgufTest, HonoursGeneralAlignment) {
  Writer w;
  w.header(2, 1).kv_u32("general.alignment", 64);
  w.tensor_info("a", {4}, 0, 0).tensor_info("b", {4}, 0, 64).pad(64).zeros(80);
  const GgufFile g = GgufFile::open(write(w.bytes));
  EXPECT_EQ(g.alignment(), 64u);
  EXPECT_EQ(g.data_offset() % 64, 0u);
  EXPECT_EQ(g.tensor("b").offset, 64u);

  Writer bad;
  bad.header(0, 1).kv_u32("general.alignment", 48);
  EXPECT_NE(open_error(bad.bytes).find("'general.alignment': is 48, not a power of two"), std::string::npos);
  Writer wrong_type;
  wrong_type.header(0, 1).kv_str("general.alignment", "32");
  EXPECT_NE(open_error(wrong_type.bytes).find("is string, the format says uint32"), std::string::npos);
}

TEST_F(GgufTest, ReadsNestedArraysAndEveryScalarInAnArray) {
  Writer w;
  w.header(0, 2);
  // [[1, 2], [3]] of uint16, then [["x"], []] of strings
  w.str("n.u16").u32(9).u32(9).u64(2);
  w.u32(2).u64(2).raw("\x01\x00\x02\x00", 4);
  w.u32(2).u64(1).raw("\x03\x00", 2);
  w.str("n.str").u32(9).u32(9).u64(2);
  w.u32(8).u64(1).str("x");
  w.u32(8).u64(0);
  const GgufFile g = GgufFile::open(write(w.bytes));
  const wm::GgufValue& a = g.value("n.u16");
  ASSERT_EQ(a.arrays.size(), 2u);
  EXPECT_EQ(a.arrays[0].elem_type, GgufValueType::UINT16);
  EXPECT_EQ(a.arrays[1].raw, (std::vector<uint8_t>{3, 0}));
  const wm::GgufValue& s = g.value("n.str");
  ASSERT_EQ(s.arrays.size(), 2u);
  EXPECT_EQ(s.arrays[0].strings, std::vector<std::string>{"x"});
  EXPECT_TRUE(s.arrays[1].strings.empty());
}

// ---- Damage: each a CorruptData naming the problem, the key or tensor, and the file ----

TEST_F(GgufTest, RefusesATruncatedFile) {
  const std::string good = small_file();
  // Cut inside the data: tensor b's bytes pass the end.
  std::string m = open_error(good.substr(0, good.size() - 4));
  EXPECT_NE(m.find("tensor 'b'"), std::string::npos) << m;
  EXPECT_NE(m.find("past the end of the data section"), std::string::npos) << m;
  // Cut inside the metadata and inside the tensor infos: what was being read is named.
  // (A cut that leaves fewer bytes than the counts need at the least fails on the counts.)
  m = open_error(good.substr(0, 60));
  EXPECT_NE(m.find("the header: 2 tensors"), std::string::npos) << m;
  Writer one_key;
  one_key.header(0, 1).kv_str("general.architecture", "llama");
  m = open_error(one_key.bytes.substr(0, one_key.bytes.size() - 2));  // inside the value
  EXPECT_NE(m.find("key 'general.architecture'"), std::string::npos) << m;
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  const size_t info_a = 24 + 45 + 33;  // the header, then the two entries
  m = open_error(good.substr(0, info_a + 8 + 1 + 2));  // inside tensor a's dimension count
  EXPECT_NE(m.find("tensor 'a'"), std::string::npos) << m;
  // Every prefix fails cleanly.
  for (size_t n = 0; n < good.size(); n += 7) {
    const std::string path = write(good.substr(0, n), "prefix.gguf");
    EXPECT_THROW(GgufFile::open(path), CorruptData) << n;
  }
}

TEST_F(GgufTest, RefusesBadMagicAndVersions) {
  std::string b = small_file();
  b[0] = 'X';
  EXPECT_NE(open_error(b).find("no GGUF magic"), std::string::npos);
  EXPECT_NE(open_error(small_file(1)).find("GGUF v1"), std::string::npos);
  EXPECT_NE(open_error(small_file(4)).find("version 4"), std::string::npos);
  EXPECT_NE(open_error(small_file(0x03000000)).find("big-endian"), std::string::npos);
  EXPECT_NE(open_error("GGUF").find("too short"), std::string::npos);
}

TEST_F(GgufTest, RefusesATensorPastTheEnd) {
  Writer w;
  w.header(1, 0).tensor_info("blk.0.attn_q.weight", {4}, 0, 1ull << 40).pad().zeros(16);
  const std::string m = open_error(w.bytes);
  EXPECT_NE(m.find("tensor 'blk.0.attn_q.weight'"), std::string::npos) << m;
  EXPECT_NE(m.find("past the end of the data section"), std::string::npos) << m;
  // An offset near 2^64 whose end would wrap.
  Writer wrap;
  wrap.header(1, 0).tensor_info("w", {8}, 0, ~uint64_t{31}).pad().zeros(32);
  EXPECT_NE(open_error(wrap.bytes).find("past the end"), std::string::npos);
}

TEST_F(GgufTest, RefusesOverlappingTensors) {
  Writer w;
  w.header(2, 0).tensor_info("first", {16}, 0, 0).tensor_info("second", {8}, 0, 32).pad().zeros(96);
  const std::string m = open_error(w.bytes);
  EXPECT_NE(m.find("tensor 'second'"), std::string::npos) << m;
  EXPECT_NE(m.find("overlap tensor 'first'"), std::string::npos) << m;
}

TEST_F(GgufTest, RefusesAnUnknownType) {
  Writer w;
  w.header(1, 0).tensor_info("odd", {32}, 4, 0).pad().zeros(64);  // 4: Q4_2, removed from ggml
  std::string m = open_error(w.bytes);
  EXPECT_NE(m.find("tensor 'odd': unknown ggml type 4"), std::string::npos) << m;
  Writer v;
  v.header(0, 1).str("k").u32(13).u32(0);
  m = open_error(v.bytes);
  EXPECT_NE(m.find("key 'k': unknown value type 13"), std::string::npos) << m;
}

TEST_F(GgufTest, RefusesAHugeStringAtOnce) {
  Writer w;
  w.header(0, 1).str("tokenizer.chat_template").u32(8).u64(1ull << 40).zeros(64);
  const std::string m = open_error(w.bytes);
  EXPECT_NE(m.find("key 'tokenizer.chat_template'"), std::string::npos) << m;
  EXPECT_NE(m.find("a string of 1099511627776 bytes"), std::string::npos) << m;
  // A key of 2^40 bytes, and an array of 2^40 strings, the same.
  Writer k;
  k.header(0, 1).u64(1ull << 40).zeros(64);
  EXPECT_NE(open_error(k.bytes).find("metadata entry 0: the key of 1099511627776 bytes"), std::string::npos);
  Writer a;
  a.header(0, 1).str("tokenizer.ggml.tokens").u32(9).u32(8).u64(1ull << 40).zeros(64);
  EXPECT_NE(open_error(a.bytes).find("an array of 1099511627776 string"), std::string::npos);
}

TEST_F(GgufTest, RefusesMoreTensorsOrKeysThanTheFileCanHold) {
  Writer w;
  w.header(1ull << 50, 0).zeros(64);
  std::string m = open_error(w.bytes);
  EXPECT_NE(m.find("1125899906842624 tensors"), std::string::npos) << m;
  Writer k;
  k.header(0, ~uint64_t{0}).zeros(64);
  m = open_error(k.bytes);
  EXPECT_NE(m.find("18446744073709551615 metadata entries"), std::string::npos) << m;
}

TEST_F(GgufTest, RefusesAMisalignedOffset) {
  Writer w;
  w.header(1, 0).tensor_info("m", {4}, 0, 4).pad().zeros(32);
  const std::string m = open_error(w.bytes);
  EXPECT_NE(m.find("tensor 'm': offset 4 is not a multiple of the alignment 32"), std::string::npos) << m;
}

TEST_F(GgufTest, RefusesBadDimensions) {
  auto one = [&](std::vector<uint64_t> dims, uint32_t type) {
    Writer w;
    w.header(1, 0).tensor_info("d", std::move(dims), type, 0).pad().zeros(64);
    return open_error(w.bytes);
  };
  EXPECT_NE(one({4, 0}, 0).find("dimension 1 is 0 (must be positive"), std::string::npos);
  EXPECT_NE(one({1ull << 62, 1ull << 62}, 0).find("product overflows"), std::string::npos);
  EXPECT_NE(one({1ull << 63}, 0).find("must be positive"), std::string::npos);
  EXPECT_NE(one({1, 1, 1, 1, 1}, 0).find("5 dimensions"), std::string::npos);
  EXPECT_NE(one({48}, 8).find("first dimension 48 is not a multiple of Q8_0's block of 32"), std::string::npos);
  EXPECT_NE(one({1ull << 62}, 0).find("its byte size overflows"), std::string::npos);  // 2^62 floats
}

TEST_F(GgufTest, RefusesDuplicates) {
  Writer k;
  k.header(0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2);
  EXPECT_NE(open_error(k.bytes).find("key 'a.b': appears twice"), std::string::npos);
  Writer t;
  t.header(2, 0).tensor_info("w", {4}, 0, 0).tensor_info("w", {4}, 0, 32).pad().zeros(64);
  EXPECT_NE(open_error(t.bytes).find("tensor 'w': appears twice"), std::string::npos);
}

TEST_F(GgufTest, RefusesBadBoolsAndDeepNesting) {
  Writer b;
  b.header(0, 1).str("flag").u32(7).u8(2);
  EXPECT_NE(open_error(b.bytes).find("key 'flag': a bool of value 2"), std::string::npos);
  Writer d;
  d.header(0, 1).str("deep").u32(9);
  for (int i = 0; i < 20; ++i) d.u32(9).u64(1);
  d.zeros(64);
  EXPECT_NE(open_error(d.bytes).find("key 'deep': arrays nested deeper than"), std::string::npos);
}

// ---- SmolLM2-135M-Instruct, when tools/get_model.sh has fetched it (tests never download) ----

fs::path smollm2_path() {
  fs::path cache;
  if (const char* c = std::getenv("WM_MODEL_CACHE"); c && *c) cache = c;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) cache = fs::path(x) / "worldmem/models";
  else if (const char* h = std::getenv("HOME"); h && *h) cache = fs::path(h) / ".cache/worldmem/models";
  return cache / "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST_F(GgufTest, OpensSmolLM2FromTheCache) {
  const fs::path path = smollm2_path();
  if (!fs::exists(path)) GTEST_SKIP() << path << " is absent: `bash tools/get_model.sh smollm2` fetches it";
  const GgufFile g = GgufFile::open(path.string());
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_u32("llama.block_count"), 30u);
  EXPECT_EQ(g.get_u32("llama.embedding_length"), 576u);
  EXPECT_EQ(g.get_u32("llama.attention.head_count"), 9u);
  EXPECT_EQ(g.get_u32("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(g.get_u32("llama.feed_forward_length"), 1536u);
  EXPECT_EQ(g.get_u32("llama.context_length"), 8192u);
  EXPECT_EQ(g.get_f32("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(g.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(g.get_string("tokenizer.ggml.pre"), "smollm");
  const std::vector<std::string> tokens = g.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(g.get_i64_array("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_NE(g.get_string("tokenizer.chat_template").find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(g.tensors().size(), 272u);
  int q4_1 = 0, f32 = 0;
  for (const wm::GgufTensor& t : g.tensors()) {
    q4_1 += t.type == GgmlType::Q4_1;
    f32 += t.type == GgmlType::F32;
  }
  EXPECT_EQ(q4_1, 210);
  EXPECT_EQ(f32, 61);
  const wm::GgufTensor& emb = g.tensor("token_embd.weight");
  EXPECT_EQ(emb.type, GgmlType::Q8_0);
  EXPECT_EQ(emb.dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb.nbytes, 576u / 32 * 34 * 49152);
  EXPECT_EQ(g.data_offset() + g.data_size(), fs::file_size(path));
  // As the gguf package's GGUFReader reads it: the data section's start, the last tensor.
  EXPECT_EQ(g.data_offset(), 1785664u);
  const wm::GgufTensor& last = g.tensors().back();
  EXPECT_EQ(last.name, "output_norm.weight");
  EXPECT_EQ(last.offset, 96574464u);
  EXPECT_EQ(last.nbytes, 2304u);
  // llama.cpp's writer lays the tensors out in order, each at the next aligned offset.
  uint64_t at = 0;
  for (const wm::GgufTensor& t : g.tensors()) {
    EXPECT_EQ(t.offset, at) << t.name;
    at = (t.offset + t.nbytes + 31) / 32 * 32;
  }
}

}  // namespace gguf_test
