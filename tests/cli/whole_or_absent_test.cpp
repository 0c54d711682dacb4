// Outputs that are whole or absent (tools/cli/output_file.h, output_folder.h, Mp4Writer), the
// removal of temporary paths on a termination signal (tools/cli/cleanup.h), and the finite
// validator (tools/cli/validators.h).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/output_file.h"
#include "tools/cli/output_folder.h"
#include "tools/cli/validators.h"
#include "tools/media/mp4_reader.h"
#include "tools/media/mp4_writer.h"

namespace wm::cli {
namespace {

namespace fs = std::filesystem;

class WholeOrAbsent : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = wm::testing::make_temp_dir(std::string("wm_whole_") + info->name() + "_");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Names in dir_ (hidden ones too).
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& e : fs::directory_iterator(dir_)) n.push_back(e.path().filename().string());
    std::sort(n.begin(), n.end());
    return n;
  }
  static wm::Image frame(int w, int h, int t) {
    wm::Image im(w, h);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) im.pixel(x, y)[c] = static_cast<uint8_t>((x * 7 + y * 3 + t * 11 + c * 50) & 255);
    return im;
  }
  fs::path dir_;
};

TEST_F(WholeOrAbsent, Mp4WriterWithoutCloseLeavesNothing) {
  const std::string path = (dir_ / "a.mp4").string();
  {
    media::Mp4Writer w(path, 32, 32, 10, 1);
    EXPECT_EQ(w.temporary_path(), part_path(path));
    for (int t = 0; t < 5; ++t) w.write(frame(32, 32, t));
    EXPECT_TRUE(fs::exists(w.temporary_path()));
    EXPECT_FALSE(fs::exists(path));
  }  // an error path: no close()
  EXPECT_TRUE(names().empty()) << names().front();
}

TEST_F(WholeOrAbsent, Mp4WriterFinishKeepsTheNameUntilClose) {
  const std::string path = (dir_ / "b.mp4").string();
  media::Mp4Writer w(path, 32, 32, 10, 1);
  for (int t = 0; t < 4; ++t) w.write(frame(32, 32, t));
  w.finish();
  EXPECT_FALSE(fs::exists(path));
  EXPECT_THROW(w.write(frame(32, 32, 4)), wm::Error);
  w.close();
  EXPECT_EQ(names(), std::vector<std::string>{"b.mp4"});
  EXPECT_EQ(media::VideoReader::count_frames(path), 4);
}

TEST_F(WholeOrAbsent, OutputFileCommitOrNothing) {
  const std::string path = (dir_ / "r.json").string();
  {
    OutputFile f(path);
    f.stream() << "{}";
  }
  EXPECT_TRUE(names().empty());
  {
    OutputFile f(path);
    f.stream() << "{}";
    f.commit();
  }
  EXPECT_EQ(names(), std::vector<std::string>{"r.json"});
  EXPECT_THROW(OutputFile("/proc/x/r.json"), wm::Error);
  EXPECT_THROW(OutputPath(dir_.string()), wm::Error);  // a folder
  // A device is written directly, never replaced.
  OutputPath dev("/dev/null");
  EXPECT_EQ(dev.tmp(), "/dev/null");
  dev.commit();
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

TEST_F(WholeOrAbsent, OutputFolderMovesFilesInOnlyOnCommit) {
  const fs::path out = dir_ / "frames";
  {
    OutputFolder f(out.string());
    std::ofstream(f.file("a.png")) << "a";
  }
  EXPECT_TRUE(names().empty());
  {
    OutputFolder f(out.string());
    std::ofstream(f.file("a.png")) << "a";
    EXPECT_FALSE(fs::exists(out));
    f.commit();
  }
  EXPECT_EQ(names(), std::vector<std::string>{"frames"});
  // Into a folder that exists: the files join those there.
  {
    OutputFolder f(out.string() + "/");
    std::ofstream(f.file("b.png")) << "b";
    f.commit();
  }
  std::vector<std::string> in;
  for (const auto& e : fs::directory_iterator(out)) in.push_back(e.path().filename().string());
  std::sort(in.begin(), in.end());
  EXPECT_EQ(in, (std::vector<std::string>{"a.png", "b.png"}));
  // Two folders for one path in one process.
  {
    OutputFolder a((dir_ / "same").string()), b((dir_ / "same").string());
    std::ofstream(a.file("1")) << "1";
    std::ofstream(b.file("2")) << "2";
    a.commit();
    b.commit();
  }
  EXPECT_TRUE(fs::exists(dir_ / "same/1") && fs::exists(dir_ / "same/2"));
  EXPECT_THROW(OutputFolder("/proc/x"), wm::Error);
}

// A child registers a file and a folder, then is terminated: both are gone and the child ended
// by the signal itself.
TEST_F(WholeOrAbsent, TerminationSignalRemovesRegisteredPaths) {
  for (int sig : {SIGTERM, SIGINT}) {
    const fs::path file = dir_ / ".x.part", folder = dir_ / ".d.part";
    std::ofstream(file) << "x";
    fs::create_directories(folder);
    std::ofstream(folder / "f1") << "1";
    std::ofstream(folder / "f2") << "2";
    const std::string fs_ = file.string(), ds = folder.string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::signal(sig, SIG_DFL);  // a shell's background job starts with SIGINT ignored, which stays so
      remove_temporaries_on_signal();
      register_temporary(fs_);
      register_temporary(ds, /*folder=*/true);
      ::raise(sig);
      ::_exit(0);  // not reached
    }
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "status " << st;
    EXPECT_FALSE(fs::exists(file));
    EXPECT_FALSE(fs::exists(folder));
  }
  // Unregistered (committed) paths stay.
  const fs::path kept = dir_ / "kept";
  std::ofstream(kept) << "k";
  const std::string ks = kept.string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    remove_temporaries_on_signal();
    unregister_temporary(register_temporary(ks));
    ::raise(SIGTERM);
    ::_exit(0);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(fs::exists(kept));
}

TEST(FiniteRange, RejectsNanInfAndOutOfRangeNamingTheOption) {
  auto parse = [](std::vector<std::string> args) -> std::string {
    CLI::App app;
    double x = 0;
    std::vector<double> v;
    app.add_option("--x", x)->check(FiniteRange(0.0, 1.0));
    app.add_option("--v", v)->check(Finite);
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(parse({"--x", "0.5", "--v", "-3", "1e300"}), "");
  for (const char* bad : {"nan", "NaN", "inf", "-inf", "1.5", "-0.1", "abc"}) {
    const std::string m = parse({"--x", bad});
    EXPECT_NE(m.find("--x"), std::string::npos) << bad << ": " << m;
  }
  EXPECT_NE(parse({"--v", "1", "nan"}).find("--v"), std::string::npos);
}

}  // namespace
}  // namespace wm::cli
