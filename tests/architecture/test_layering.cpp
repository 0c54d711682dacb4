// Data flows one way (README, "Architecture"): programs and the viewer -> session -> memory
// policies and models -> core. So nothing in the library (runtime/, dit/, worldkv/, llmkv/)
// includes from tools/ or viewer/, and the core (runtime/) includes nothing of the paths above
// it. This scans the source tree's include lines.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <system_error>
#include <vector>

#include "runtime/build_paths.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;

struct Rule {
  std::string folder;                  // files under this top-level folder ...
  std::vector<std::string> forbidden;  // ... include nothing under these
};

const std::vector<Rule> kRules = {
    {"runtime", {"tools", "viewer", "dit", "worldkv", "llmkv"}},
    {"dit", {"tools", "viewer"}},
    {"worldkv", {"tools", "viewer"}},
    {"llmkv", {"tools", "viewer"}},
};

struct Violation {
  std::string file;  // relative to the root
  int line = 0;
  std::string include;  // as written
  std::string target;   // the top-level folder it reaches
};

struct Scan {
  std::vector<Violation> violations;
  std::vector<size_t> files;  // files scanned per rule
  size_t includes = 0;        // include lines read
};

bool is_source(const fs::path& p) {
  static const std::vector<std::string> exts = {".h", ".hpp", ".hh", ".cpp", ".cc", ".cxx", ".inl", ".inc", ".cu"};
  for (const auto& e : exts)
    if (p.extension() == e) return true;
  return false;
}

// The top-level folder (relative to root) that an include of `name` from `file` reaches: a
// quoted include is looked up beside the file first (so "../tools/x.h" counts), then from the
// root, which is on every target's include path.
std::string top_folder(const fs::path& root, const fs::path& file, const std::string& name, bool quoted) {
  fs::path rel = fs::path(name).lexically_normal();
  if (quoted) {
    std::error_code ec;
    const fs::path beside = (file.parent_path() / name).lexically_normal();
    if (fs::exists(beside, ec)) rel = beside.lexically_relative(root);
  }
  auto it = rel.begin();
  return it == rel.end() ? std::string() : it->string();
}

Scan scan(const fs::path& root, const std::vector<Rule>& rules) {
  static const std::regex include_line(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  Scan out;
  for (const Rule& rule : rules) {
    size_t n = 0;
    const fs::path dir = root / rule.folder;
    if (fs::is_directory(dir)) {
      for (const auto& entry : fs::recursive_directory_iterator(dir)) {
        if (!entry.is_regular_file() || !is_source(entry.path())) continue;
        ++n;
        std::ifstream in(entry.path());
        std::string text;
        int line = 0;
        while (std::getline(in, text)) {
          ++line;
          std::smatch m;
          if (!std::regex_search(text, m, include_line)) continue;
          ++out.includes;
          const std::string target = top_folder(root, entry.path(), m[2].str(), m[1].str() == "\"");
          for (const auto& f : rule.forbidden)
            if (target == f)
              out.violations.push_back({entry.path().lexically_relative(root).string(), line, m[2].str(), target});
        }
      }
    }
    out.files.push_back(n);
  }
  return out;
}

std::string describe(const std::vector<Violation>& vs) {
  std::string s;
  for (const auto& v : vs) s += v.file + ":" + std::to_string(v.line) + " includes \"" + v.include + "\" (" + v.target + "/)\n";
  return s;
}

TEST(Layering, TheLibraryIncludesOneWay) {
  const Scan s = scan(WM_SOURCE_DIR, kRules);
  ASSERT_EQ(s.files.size(), kRules.size());
  for (size_t r = 0; r < kRules.size(); ++r)
    EXPECT_GE(s.files[r], 5u) << "too few sources under " << kRules[r].folder << "/: is WM_SOURCE_DIR the tree?";
  EXPECT_GT(s.includes, 200u);
  EXPECT_TRUE(s.violations.empty()) << "includes against the layering:\n" << describe(s.violations);
}

TEST(Layering, TheScanFindsEveryWayOfBreakingIt) {
  // A small tree with one include of each kind; the scan must name exactly the bad ones.
  const fs::path root = wm::testing::make_temp_dir("wm_layering_");
  auto write = [&](const std::string& rel, const std::string& text) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  };
  write("tools/media/x.h", "#pragma once\n");
  write("viewer/app.h", "#pragma once\n");
  write("runtime/a.h", "#pragma once\n#include \"runtime/b.h\"\n#include \"dit/model.h\"\n");
  write("runtime/b.cpp", "// #include \"tools/media/x.h\" in a comment is not an include\n#include \"../tools/media/x.h\"\n");
  write("dit/c.h", "#  include <viewer/app.h>\n#include <vector>\n");
  write("worldkv/d.cpp", "#include \"dit/model.h\"\n#include \"runtime/a.h\"\n");  // downwards: fine
  write("llmkv/e.cpp", "#include \"tools/llm_tasks/sample.h\"\n");
  write("tools/f.cpp", "#include \"viewer/app.h\"\n#include \"worldkv/d.h\"\n");  // programs may
  const Scan s = scan(root, kRules);
  fs::remove_all(root);
  std::vector<std::string> got;
  for (const auto& v : s.violations) got.push_back(v.file + ":" + std::to_string(v.line) + " " + v.target);
  std::sort(got.begin(), got.end());
  const std::vector<std::string> want = {"dit/c.h:1 viewer", "llmkv/e.cpp:1 tools", "runtime/a.h:3 dit",
                                         "runtime/b.cpp:2 tools"};
  EXPECT_EQ(got, want) << describe(s.violations);
  EXPECT_EQ(s.files, (std::vector<size_t>{2, 1, 1, 1}));
}

}  // namespace
