// The fuzz targets (tests/fuzz, built only by tools/fuzz.sh with clang) link a reader library
// whose sources tests/fuzz/CMakeLists.txt lists by hand. A reader that starts to use another
// source (a header with its own .cpp) breaks only that link, which the test command reaches
// after the whole ctest run. This checks the list in the ordinary build: every .cpp beside a
// project header that the fuzz targets or the listed sources include, directly or not, is listed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/build_paths.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The sources of `text` (a CMakeLists) written as ${PROJECT_SOURCE_DIR}/path.cpp.
std::set<std::string> listed_sources(const std::string& text) {
  std::set<std::string> out;
  const std::regex re(R"(\$\{PROJECT_SOURCE_DIR\}/(\S+\.cpp))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.insert((*it)[1]);
  return out;
}

// The .cpp files the given files need: for every project header they include (transitively,
// through headers and the needed .cpp files too), the .cpp of the same name when there is one.
std::set<std::string> needed_sources(const fs::path& root, std::vector<std::string> start) {
  const std::regex inc(R"re(#include "([^"]+)")re");
  std::set<std::string> seen, need;
  while (!start.empty()) {
    const std::string f = start.back();
    start.pop_back();
    if (!seen.insert(f).second) continue;
    const std::string text = read(root / f);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), inc); it != std::sregex_iterator(); ++it) {
      const std::string h = (*it)[1];
      if (!fs::exists(root / h)) continue;  // not a project path
      start.push_back(h);
      if (h.size() > 2 && h.compare(h.size() - 2, 2, ".h") == 0) {
        const std::string c = h.substr(0, h.size() - 2) + ".cpp";
        if (fs::exists(root / c)) need.insert(c), start.push_back(c);
      }
    }
  }
  return need;
}

TEST(FuzzSources, TheReaderLibraryListsEverySourceItsTargetsNeed) {
  const fs::path root = WM_SOURCE_DIR;
  const std::string cmake = read(root / "tests/fuzz/CMakeLists.txt");
  const std::set<std::string> listed = listed_sources(cmake);
  ASSERT_GE(listed.size(), 5u) << "no source list found in tests/fuzz/CMakeLists.txt";
  std::vector<std::string> start(listed.begin(), listed.end());
  size_t targets = 0;
  for (const auto& e : fs::directory_iterator(root / "tests/fuzz")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("fuzz_", 0) == 0 && e.path().extension() == ".cpp") {
      start.push_back("tests/fuzz/" + name);
      ++targets;
    }
  }
  ASSERT_GE(targets, 5u) << "no fuzz targets found under tests/fuzz";
  for (const auto& c : needed_sources(root, start))
    EXPECT_TRUE(listed.count(c)) << c << " is needed by the fuzz targets' readers but not listed in "
                                 << "tests/fuzz/CMakeLists.txt (wm_fuzz_readers): the fuzz build would not link";
}

// The check finds the case that once broke the fuzz build: a listed reader including a header
// whose .cpp the list lacks.
TEST(FuzzSources, TheCheckFindsAnUnlistedDependency) {
  const fs::path root = wm::testing::make_temp_dir("wm_fuzz_sources_");
  fs::create_directories(root / "lib");
  std::ofstream(root / "lib/reader.cpp") << "#include \"lib/reader.h\"\n#include \"lib/json.h\"\n";
  std::ofstream(root / "lib/reader.h") << "#include <string>\n";
  std::ofstream(root / "lib/json.h") << "#include \"lib/error.h\"\n";
  std::ofstream(root / "lib/json.cpp") << "#include \"lib/json.h\"\n";
  std::ofstream(root / "lib/error.h") << "\n";
  const std::set<std::string> listed = listed_sources("add_library(x ${PROJECT_SOURCE_DIR}/lib/reader.cpp)");
  EXPECT_EQ(listed, (std::set<std::string>{"lib/reader.cpp"}));
  const std::set<std::string> need = needed_sources(root, {"lib/reader.cpp"});
  EXPECT_EQ(need, (std::set<std::string>{"lib/reader.cpp", "lib/json.cpp"}));
  fs::remove_all(root);
}

}  // namespace
