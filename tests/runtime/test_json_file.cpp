// runtime/json_file.h: the bounded JSON reader and the atomic text write.
#include "runtime/json_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "tests/temp_dir.h"

namespace wm::json_file_test {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

class JsonFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = wm::testing::make_temp_dir("wm_json_file_");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(JsonFile, WritesWholeAndReadsBack) {
  const std::string path = (dir_ / "config.json").string();
  write_text_atomically(path, "{\"a\": 1}\n", "test");
  EXPECT_EQ(read_json_file(path).at("a").get<int>(), 1);
  write_text_atomically(path, "{\"a\": 2}\n", "test");
  EXPECT_EQ(read_json_file(path).at("a").get<int>(), 2);
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST_F(JsonFile, ATemporaryNameTakenByALinkIsNeitherWrittenThroughNorRemoved) {
  const fs::path outside = dir_ / "outside.txt";
  std::ofstream(outside) << "keep me";
  const std::string path = (dir_ / "config.json").string();
  const fs::path tmp = path + ".tmp." + std::to_string(::getpid());
  fs::create_symlink(outside, tmp);
  EXPECT_THROW(write_text_atomically(path, "{}", "test"), Error);
  EXPECT_EQ(slurp(outside), "keep me");
  EXPECT_TRUE(fs::is_symlink(tmp));
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(JsonFile, ReadRefusesAFolderAndADeadLink) {
  EXPECT_THROW(read_json_file(dir_.string()), Error);
  const fs::path dead = dir_ / "dead.json";
  fs::create_symlink(dir_ / "nowhere.json", dead);
  EXPECT_THROW(read_json_file(dead.string()), Error);
}

}  // namespace
}  // namespace wm::json_file_test
