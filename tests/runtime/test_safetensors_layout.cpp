// The safetensors reader holds files to the format's layout: the tensors' byte ranges follow each
// other without overlap or gap and cover the data section. A range inside another tensor's bytes
// would read that tensor's data as its own (a norm weight made of embedding rows), so the error
// names both tensors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/temp_dir.h"

namespace wm {
namespace {

namespace fs = std::filesystem;

// A folder of its own per test (mkdtemp), removed after it.
class SafetensorsLayout : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = wm::testing::make_temp_dir("wm_st_layout_"); }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // A file of a header text and `data` bytes (0, 1, 2, ...) in the folder.
  std::string write_file(const std::string& name, const std::string& header, size_t data) const {
    const std::string path = (dir_ / name).string();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
    f << header;
    for (size_t i = 0; i < data; ++i) f.put(static_cast<char>(i & 0xff));
    return path;
  }
  fs::path dir_;
};

std::string open_error(const std::string& path) {
  try {
    SafeTensors::open(path);
  } catch (const CorruptData& e) {
    fs::remove(path);
    return e.what();
  }
  fs::remove(path);
  return "";
}

TEST_F(SafetensorsLayout, OverlappingRangesAreRefusedNamingBothTensors) {
  // A norm weight [4] F32 whose 16 bytes lie inside the embedding's 32.
  const std::string m = open_error(write_file(
      "overlap", R"({"embed":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]},)"
                 R"("norm":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
      32));
  ASSERT_FALSE(m.empty()) << "overlapping data_offsets were accepted";
  EXPECT_NE(m.find("'embed'"), std::string::npos) << m;
  EXPECT_NE(m.find("'norm'"), std::string::npos) << m;
  EXPECT_NE(m.find("overlap"), std::string::npos) << m;
  // Two tensors on the very same bytes.
  const std::string same = open_error(write_file(
      "same", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
      16));
  EXPECT_NE(same.find("'a'"), std::string::npos) << same;
  EXPECT_NE(same.find("'b'"), std::string::npos) << same;
}

TEST_F(SafetensorsLayout, GapsAndUncoveredBytesAreRefused) {
  const std::string gap = open_error(write_file(
      "gap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
      24));
  EXPECT_NE(gap.find("[8, 16)"), std::string::npos) << gap;
  EXPECT_NE(gap.find("'b'"), std::string::npos) << gap;
  const std::string tail = open_error(
      write_file("tail", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12));
  EXPECT_NE(tail.find("12 bytes"), std::string::npos) << tail;
  const std::string head = open_error(
      write_file("head", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
  EXPECT_NE(head.find("[0, 4)"), std::string::npos) << head;
}

TEST_F(SafetensorsLayout, ContiguousFilesInAnyHeaderOrderAreRead) {
  // Header order need not be offset order; empty tensors sit between the others.
  const std::string path = write_file(
      "ok", R"({"z":{"dtype":"U8","shape":[4],"data_offsets":[8,12]},"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
            R"("a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
      12);
  const SafeTensors st = SafeTensors::open(path);
  EXPECT_EQ(st.get("z")[0].item<int64_t>(), 8);
  EXPECT_EQ(st.get("a")[7].item<int64_t>(), 7);
  EXPECT_EQ(st.get("e").numel(), 0);
  fs::remove(path);
  // What save_safetensors writes passes.
  const std::string saved = (dir_ / "saved.safetensors").string();
  save_safetensors(saved, {{"x", at::ones({3})}, {"y", at::zeros({0})}, {"w", at::ones({2, 2}, at::kBFloat16)}});
  EXPECT_EQ(SafeTensors::open(saved).names().size(), 3u);
  fs::remove(saved);
}

}  // namespace
}  // namespace wm
