// wm_tools, the one executable of the programs that link libtorch (tools/wm_tools.cpp): each
// program's name is a link to it that runs that program, and `wm_tools PROGRAM` runs one by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/build_paths.h"
#include "tests/cli/program_runner.h"

namespace wm::test_wm_tools {
namespace {

namespace fs = std::filesystem;
using wm::testing::build_dir;
using wm::testing::program_path;
using wm::testing::run_program;
using wm::testing::RunResult;

class WmTools : public ::testing::Test {
 protected:
  void SetUp() override {
    tools_ = (build_dir() / "tools" / "wm_tools").string();
    std::error_code ec;
    if (!fs::exists(tools_, ec)) GTEST_SKIP() << "wm_tools is not built (looked in " << build_dir() << ")";
    dir_ = wm::testing::make_temp_dir("wm_tools_test_");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  RunResult run(const std::vector<std::string>& argv) { return run_program(argv, dir_, fs::path(WM_SOURCE_DIR), 60); }

  std::string tools_;
  fs::path dir_;
};

// The programs the tests and the READMEs name are links to wm_tools, by a path relative to their
// folder (the build folder can move).
TEST_F(WmTools, ProgramsAreRelativeLinksToIt) {
  int seen = 0;
  for (const char* name : {"wm_render", "wm_llm", "wm_serve", "wm_bench_core", "wm_pth_convert"}) {
    const std::string p = program_path(name);
    if (p.empty()) continue;
    ++seen;
    ASSERT_TRUE(fs::is_symlink(p)) << p;
    EXPECT_TRUE(fs::read_symlink(p).is_relative()) << p << " -> " << fs::read_symlink(p);
    EXPECT_TRUE(fs::equivalent(p, tools_)) << p;
  }
  EXPECT_GT(seen, 0);
}

// Through its link, a program is itself: its own help, not another's nor the dispatcher's.
TEST_F(WmTools, LinkRunsTheProgramItNames) {
  for (const char* name : {"wm_bench_core", "wm_pth_convert"}) {
    const std::string p = program_path(name);
    if (p.empty()) continue;
    const RunResult r = run({p, "--help"});
    EXPECT_TRUE(r.exited && r.code == 0) << r.err;
    EXPECT_EQ(r.out.rfind(std::string(name) + ":", 0), 0u) << name << " printed:\n" << r.out;
  }
}

// By name, with or without the prefix; the program sees its full name first.
TEST_F(WmTools, RunsAProgramByName) {
  for (const char* name : {"pth_convert", "wm_pth_convert"}) {
    const RunResult r = run({tools_, name, "--help"});
    EXPECT_TRUE(r.exited && r.code == 0) << r.err;
    EXPECT_EQ(r.out.rfind("wm_pth_convert:", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("Usage: wm_pth_convert "), std::string::npos) << r.out;
  }
}

// No program, an unknown one: exit 2 and the list; --help: the list on stdout, exit 0.
TEST_F(WmTools, UnknownProgramIsRefusedWithTheList) {
  RunResult r = run({tools_, "no_such_program"});
  EXPECT_TRUE(r.exited && r.code == 2) << r.err;
  EXPECT_NE(r.err.find("no program 'no_such_program'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("  wm_render\n"), std::string::npos) << r.err;
  r = run({tools_});
  EXPECT_TRUE(r.exited && r.code == 2) << r.err;
  EXPECT_NE(r.err.find("Usage: wm_tools PROGRAM"), std::string::npos) << r.err;
  r = run({tools_, "--help"});
  EXPECT_TRUE(r.exited && r.code == 0) << r.err;
  EXPECT_NE(r.out.find("  wm_llm\n"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace wm::test_wm_tools
