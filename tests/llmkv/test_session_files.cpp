// The session folder (llmkv/session_files.h): a session saved and loaded into another session
// object continues with the same tokens; a damaged file is refused, reported when the folder is
// opened and its session left out (the others found); a damaged index is refused, the folder
// untouched; files no index names are removed; erase forgets a session.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "llmkv/hf_folder.h"
#include "llmkv/session_files.h"
#include "runtime/error.h"

namespace wm::llm {
// Named, not anonymous: in the unity build this file shares a unit with suites whose helpers
// have the same names (kVocab, positions(), ...).
namespace session_files_test {

namespace fs = std::filesystem;

struct Fixture {
  std::string dir = std::string(WM_SOURCE_DIR) + "/assets/models/tiny-llm";
  LlmModel model = load_llm(dir, at::kCPU);
  Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
  GenerateOptions go() const {
    GenerateOptions g;
    g.max_new_tokens = 10;
    return g;
  }
};

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

void flip_byte(const fs::path& p, size_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x10));
}

TEST(SessionFiles, SavedSessionContinuesWithTheSameTokens) {
  Fixture fx;
  const fs::path d = fresh_dir("wm_session_files_a");
  LlmSession a(fx.model, fx.tok, at::kCPU);
  a.generate(fx.tok.encode("rode 42\nsora 17\n", false), fx.go());
  std::vector<std::string> logs;
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_GT(files.save("conv", a, {{"turns", 1}}), 1000u);
  }
  SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
  EXPECT_TRUE(logs.empty());
  ASSERT_EQ(files.found().count("conv"), 1u);
  EXPECT_EQ(files.found().at("conv").next_position, a.next_position());
  LlmSession b(fx.model, fx.tok, at::kCPU);
  EXPECT_EQ(files.load("conv", b)["turns"], 1);
  const std::vector<int64_t> next = fx.tok.encode("Recall:\nrode", false);
  EXPECT_EQ(a.generate(next, fx.go()).tokens, b.generate(next, fx.go()).tokens);
  EXPECT_THROW(files.load("other", b), Error);
  EXPECT_TRUE(files.erase("conv"));
  EXPECT_FALSE(files.erase("conv"));
  EXPECT_FALSE(fs::exists(d / files.found().at("conv").file));
  fs::remove_all(d);
}

TEST(SessionFiles, DamagedFilesAreReportedAndNeverUsed) {
  Fixture fx;
  const fs::path d = fresh_dir("wm_session_files_b");
  LlmSession a(fx.model, fx.tok, at::kCPU);
  a.feed(fx.tok.encode("rode 42\nsora 17\n", false));
  {
    SessionFiles files(d.string(), {});
    files.save("one", a, nullptr);
    files.save("two", a, nullptr);
  }
  // Damage "one" in its blocks' bytes; leave an orphan and a temporary behind.
  std::string one;
  for (const auto& e : fs::directory_iterator(d)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.find("\"name\":\"one\"") != std::string::npos) one = e.path().string();
  }
  ASSERT_FALSE(one.empty());
  flip_byte(one, fs::file_size(one) - 100);
  {
    std::string bytes;
    std::ifstream in(one, std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_THROW(SessionFiles::decode(bytes, one, nullptr, nullptr), CorruptData);
    EXPECT_THROW(SessionFiles::decode(bytes.substr(0, bytes.size() / 2), one, nullptr, nullptr), CorruptData);
  }
  std::ofstream(d / "s-0123456789abcdef.wmsess") << "cut short";
  std::ofstream(d / "index.json.tmp") << "{";
  std::vector<std::string> logs;
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_EQ(files.found().count("one"), 0u);
    EXPECT_EQ(files.found().count("two"), 1u);
    ASSERT_EQ(logs.size(), 2u) << ::testing::PrintToString(logs);
    EXPECT_NE(logs[0].find("session 'one'"), std::string::npos) << logs[0];
    EXPECT_NE(logs[0].find("checksum"), std::string::npos) << logs[0];
    EXPECT_NE(logs[1].find("removed 1 file(s)"), std::string::npos) << ::testing::PrintToString(logs);
    EXPECT_FALSE(fs::exists(d / "index.json.tmp"));
    EXPECT_FALSE(fs::exists(one));
    EXPECT_FALSE(fs::exists(d / "s-0123456789abcdef.wmsess"));
  }
  // The index reopened lists "two" alone.
  logs.clear();
  {
    SessionFiles files(d.string(), [&](const std::string& m) { logs.push_back(m); });
    EXPECT_TRUE(logs.empty());
    EXPECT_EQ(files.size(), 1u);
  }
  // A damaged index: refused, the folder left as it is.
  std::ofstream(d / "index.json", std::ios::trunc) << "{\"version\": 1, \"sessions\": ";
  const size_t n_files = static_cast<size_t>(std::distance(fs::directory_iterator(d), fs::directory_iterator()));
  EXPECT_THROW(SessionFiles(d.string(), {}), CorruptData);
  EXPECT_EQ(static_cast<size_t>(std::distance(fs::directory_iterator(d), fs::directory_iterator())), n_files);
  fs::remove_all(d);
}

}  // namespace session_files_test
}  // namespace wm::llm
