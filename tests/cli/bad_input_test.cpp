// Every program on broken inputs (truncated and garbage files, wrong types, values out of range,
// NaN, infinity, negative and huge numbers, unwritable outputs such as /proc/x): each run must
// end with a non-zero exit status, a line on stderr that names the bad option or file, no stack
// trace, and nothing under an output's final name (nor a temporary .part file). A run killed by
// SIGTERM mid-render leaves nothing; one killed by SIGKILL leaves nothing under the final name.
// A program that is not built is skipped, with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/build_paths.h"
#include "tests/cli/program_runner.h"
#include "tests/temp_dir.h"
#include "tools/media/png.h"

namespace wm::testing {
namespace {

const char* const kTraceMarks[] = {"Exception raised from", "terminate called", "frame #", "what():",
                                   "Segmentation fault", "Aborted", "core dumped"};

struct Case {
  std::vector<std::string> args;  // after the program's path; "{dir}" is the case's folder
  std::string names;              // text that a line of stderr must hold: the option or the file
  std::vector<std::string> outputs = {};  // must not exist afterwards ("{dir}/...")
};

// A folder of its own per test, with the broken inputs in it.
class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = make_temp_dir(std::string("wm_bad_input_") + info->name() + "_");
    src_ = fs::path(WM_SOURCE_DIR);
    write(dir_ / "garbage.safetensors", "this is not a safetensors file at all");
    write(dir_ / "garbage.json", "{ \"not\": json ]");
    write(dir_ / "garbage.mp4", "this is not a video file");
    write(dir_ / "garbage.png", "\x89PNG but not really");
    truncated(src_ / "assets/models/tiny/model.safetensors", dir_ / "trunc.safetensors", 200);
    truncated(src_ / "assets/suites/revisit60.json", dir_ / "trunc.json", 300);
    truncated(src_ / "assets/images/viewer.png", dir_ / "trunc.png", 100);
    for (const auto& e : fs::directory_iterator(dir_)) inputs_.push_back(e.path());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }
  static void truncated(const fs::path& from, const fs::path& to, size_t n) {
    std::string s = read_text(from);
    write(to, s.substr(0, std::min(n, s.size())));
  }
  std::string expand(const std::string& s) const {
    std::string r = s;
    for (size_t p; (p = r.find("{dir}")) != std::string::npos;) r.replace(p, 5, dir_.string());
    for (size_t p; (p = r.find("{src}")) != std::string::npos;) r.replace(p, 5, src_.string());
    return r;
  }

  // Runs every case of one program and checks the rules above. Returns false (after a skip)
  // when the program is not built.
  void check_cases(const std::string& program, const std::vector<Case>& cases) {
    const std::string exe = program_path(program);
    if (exe.empty()) GTEST_SKIP() << program << " is not built (looked in " << build_dir() << ")";
    for (const Case& c : cases) {
      std::vector<std::string> argv = {exe};
      std::string shown = program;
      for (const auto& a : c.args) {
        argv.push_back(expand(a));
        shown += " " + a;
      }
      SCOPED_TRACE(shown);
      const auto t0 = std::chrono::steady_clock::now();
      const RunResult r = run_program(argv, dir_, src_, 60, Launch::Forked);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_FALSE(r.timed_out);
      EXPECT_TRUE(r.exited) << "ended by signal " << r.signal << "\n" << r.err;
      EXPECT_NE(r.code, 0) << r.err;
      const std::string names = expand(c.names);
      bool named = false;
      std::istringstream lines(r.err);
      for (std::string line; std::getline(lines, line);) named = named || line.find(names) != std::string::npos;
      EXPECT_TRUE(named) << "no line of stderr names '" << names << "':\n" << r.err;
      for (const char* mark : kTraceMarks) EXPECT_EQ(r.err.find(mark), std::string::npos) << mark << " in:\n" << r.err;
      for (const auto& o : c.outputs) EXPECT_FALSE(fs::exists(expand(o))) << expand(o) << " was left behind";
      for (const auto& e : fs::directory_iterator(dir_)) {
        const std::string n = e.path().filename().string();
        EXPECT_EQ(n.find(".part"), std::string::npos) << "temporary " << n << " was left behind";
      }
      EXPECT_LT(secs, 30) << "slow run";
      // What a failing case left is not blamed on the next one.
      std::vector<fs::path> left;
      for (const auto& e : fs::directory_iterator(dir_))
        if (std::find(inputs_.begin(), inputs_.end(), e.path()) == inputs_.end()) left.push_back(e.path());
      for (const auto& p : left) fs::remove_all(p);
    }
  }

  fs::path dir_, src_;
  std::vector<fs::path> inputs_;
};

// A forked run (program_runner.h, Launch::Forked, as every case above runs) is the executed run:
// the same exit status, stderr and stdout, for a refused option, a model file that does not parse
// (read after libtorch's operators ran), a help text and a run that fails at its output. Under
// ctest this suite is a process of its own, on one thread, with OpenMP's variables set as the
// executed runs get them, so the forked runs do fork.
TEST_F(BadInput, ForkedRunIsTheExecutedRun) {
  if (const std::string why = forked_runs_refused(); !why.empty()) GTEST_SKIP() << "no run forks: " << why;
  const std::vector<std::vector<std::string>> runs = {
      {"wm_render", "--max-seconds", "-1", "-o", "{dir}/out.mp4"},
      {"wm_render", "--model", "{dir}/garbage.safetensors", "--threads", "1", "-o", "{dir}/out.mp4"},
      {"wm_pth_convert", "--help"},
      {"wm_llm", "--top-p", "nan", "-p", "hi"},
      {"wm_llm", "-m", "{dir}/missing", "-p", "hi", "--stats-json", "/proc/x/s.json"}};
  int compared = 0;
  for (const auto& run : runs) {
    std::vector<std::string> argv = {program_path(run[0])};
    if (argv[0].empty()) continue;
    for (size_t i = 1; i < run.size(); ++i) argv.push_back(expand(run[i]));
    SCOPED_TRACE(run[0] + " " + run[1]);
    Started exec(argv, dir_, src_, {}, Launch::Exec);
    const RunResult a = exec.wait(60);
    Started fork(argv, dir_, src_, {}, Launch::Forked);
    EXPECT_TRUE(fork.forked());
    const RunResult b = fork.wait(60);
    EXPECT_FALSE(exec.forked());
    EXPECT_EQ(a.exited, b.exited);
    EXPECT_EQ(a.code, b.code);
    EXPECT_EQ(a.signal, b.signal);
    EXPECT_EQ(a.err, b.err);
    EXPECT_EQ(a.out, b.out);
    ++compared;
  }
  EXPECT_GT(compared, 0);
  // Where a fork would not be the same start, none is made: a file that is not one of wm_tools'
  // programs, a variable that the libraries read when they load.
  const std::string render = program_path("wm_render");
  if (!render.empty()) {
    EXPECT_TRUE(can_fork_program({render}, {{"TMPDIR", "/tmp"}}));
    EXPECT_FALSE(can_fork_program({render}, {{"OMP_NUM_THREADS", "2"}}));
    EXPECT_FALSE(can_fork_program({render}, {{"OPENBLAS_CORETYPE", "Haswell"}}));
    EXPECT_FALSE(can_fork_program({render}, {{"WM_SENTENCEPIECE_MODULE", "/x.so"}}));  // read once, cached
  }
  EXPECT_FALSE(can_fork_program({"/bin/true"}, {}));
  fs::create_symlink("/bin/true", dir_ / "wm_render");  // named as a program, not wm_tools
  EXPECT_FALSE(can_fork_program({(dir_ / "wm_render").string()}, {}));
  fs::remove(dir_ / "wm_render");
}

TEST_F(BadInput, Render) {
  const std::string out = "{dir}/out.mp4";
  check_cases("wm_render",
              {{{"--max-seconds", "-1", "-o", out}, "--max-seconds", {out}},
               {{"--max-seconds", "134217728", "-o", out}, "--max-seconds", {out}},
               {{"--policy", "worldkv_c", "--keep-ratio", "nan", "--max-seconds", "1", "--threads", "1", "-o", out},
                "--keep-ratio",
                {out}},
               {{"--keep-ratio", "inf", "-o", out}, "--keep-ratio", {out}},
               {{"--context-t", "nan", "-o", out}, "--context-t", {out}},
               {{"--context-t", "abc", "-o", out}, "--context-t", {out}},
               {{"--upscale", "0", "-o", out}, "--upscale", {out}},
               {{"--shift", "0", "-o", out}, "--shift", {out}},
               {{"--shift", "nan", "-o", out}, "--shift", {out}},
               {{"--threads", "-1", "-o", out}, "--threads", {out}},
               {{"--seed", "-5", "-o", out}, "--seed", {out}},
               {{"--index", "x", "-o", out}, "--index", {out}},
               {{"--png-dir", "/proc/x", "--max-seconds", "1", "--threads", "1", "-o", out}, "/proc/x", {out}},
               {{"--tile", "/proc/x/t.png", "--max-seconds", "1", "--threads", "1", "-o", out}, "/proc/x/t.png", {out}},
               {{"--tile-every", "0", "-o", out}, "--tile-every", {out}},
               {{"-o", "/proc/x/out.mp4", "--max-seconds", "1", "--threads", "1"}, "/proc/x/out.mp4"},
               {{"--model", "{dir}/trunc.safetensors", "--threads", "1", "-o", out}, "trunc.safetensors", {out}},
               {{"--model", "{dir}/garbage.safetensors", "--threads", "1", "-o", out}, "garbage.safetensors", {out}},
               {{"--suite", "{dir}/trunc.json", "--threads", "1", "-o", out}, "trunc.json", {out}},
               {{"--index", "9999", "--threads", "1", "-o", out}, "--index", {out}},
               {{"--policy", "bogus", "--threads", "1", "-o", out}, "bogus", {out}}});
}

// The contact sheet: every 4th frame of a 1-second rollout beside its ground truth, two to a
// row, 2-pixel black gaps.
TEST_F(BadInput, RenderTileHasItsCells) {
  const std::string exe = program_path("wm_render");
  if (exe.empty()) GTEST_SKIP() << "wm_render is not built (looked in " << build_dir() << ")";
  const RunResult r = run_program({exe, "--seed", "1", "--max-seconds", "1", "--upscale", "1", "--side-by-side",
                                   "--tile", (dir_ / "t.png").string(), "--tile-every", "4", "--tile-columns", "2",
                                   "--threads", "1", "-o", (dir_ / "o.mp4").string()},
                                  dir_, src_, 120);
  ASSERT_TRUE(r.exited && r.code == 0) << r.err;
  const Image t = media::read_image((dir_ / "t.png").string());
  // 15 frames (5 chunks of 3): cells at frames 0, 4, 8, 12; each 128 x 64 (model | truth)
  ASSERT_EQ(t.width, 2 * 128 + 2);
  ASSERT_EQ(t.height, 2 * 64 + 2);
  for (int y = 0; y < t.height; ++y)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(t.pixel(128, y)[c], 0) << "gap column at row " << y;
  int lit = 0;
  for (int x = 64; x < 128; ++x) lit += t.pixel(x, 70)[0] + t.pixel(x, 70)[1] + t.pixel(x, 70)[2] > 0;
  EXPECT_GT(lit, 32) << "the truth half of cell 3 is black";
}

TEST_F(BadInput, RenderWorld) {
  const std::string out = "{dir}/out.mp4";
  check_cases("wm_render_world",
              {{{"--seed", "1", "-o", out, "--pairs-dir", "/proc/x"}, "/proc/x", {out}},
               {{"--seed", "1", "-o", out, "--png-dir", "/proc/x"}, "/proc/x", {out}},
               {{"--seed", "1", "-o", "/proc/x/out.mp4"}, "/proc/x/out.mp4"},
               {{"--seed", "1", "-o", "{dir}"}, "{dir}"},
               {{"--seed", "1", "--fov", "nan", "-o", out}, "--fov", {out}},
               {{"--seed", "1", "--width", "-5", "-o", out}, "--width", {out}},
               {{"--seed", "1", "--supersample", "99", "-o", out}, "--supersample", {out}},
               {{"--seed", "1", "--upscale", "1e9", "-o", out}, "--upscale", {out}},
               {{"--seed", "-3", "-o", out}, "--seed", {out}},
               {{"--suite", "{dir}/trunc.json", "-o", out}, "trunc.json", {out}},
               {{"--suite", "{dir}/garbage.json", "-o", out}, "garbage.json", {out}},
               {{"--suite", "assets/suites/revisit60.json", "--index", "-1", "-o", out}, "--index", {out}}});
}

TEST_F(BadInput, RevisitBench) {
  const std::string res = "{dir}/res";
  check_cases("wm_revisit_bench",
              {{{"--max-seconds", "-1", "--out-dir", res}, "--max-seconds", {res}},
               {{"--max-seconds", "134217728", "--out-dir", res}, "--max-seconds", {res}},
               {{"--keep-ratio", "nan", "--out-dir", res}, "--keep-ratio", {res}},
               {{"--episodes", "-1", "--out-dir", res}, "--episodes", {res}},
               {{"--dump-max", "0", "--out-dir", res}, "--dump-max", {res}},
               {{"--policies", "bogus", "--out-dir", res}, "--policies", {res}},
               {{"--out-dir", "/proc/x", "--threads", "1"}, "/proc/x"},
               {{"--suite", "{dir}/garbage.json", "--threads", "1", "--out-dir", res}, "garbage.json", {res}}});
}

TEST_F(BadInput, Train) {
  const std::string run = "{dir}/run";
  const std::string model = run + "/model.safetensors";
  check_cases("wm_train",
              {{{"--steps", "-1", "--out", run}, "--steps", {run}},
               {{"--steps", "0", "--out", run}, "--steps", {run}},
               {{"--lr", "nan", "--out", run}, "--lr", {run}},
               {{"--lr", "-1", "--out", run}, "--lr", {run}},
               {{"--ema", "5", "--out", run}, "--ema", {run}},
               {{"--eval-samples", "-3", "--out", run}, "--eval-samples", {run}},
               {{"--ckpt-every", "0", "--out", run}, "--ckpt-every", {run}},
               {{"--minutes", "inf", "--out", run}, "--minutes", {run}},
               {{"--noisy", "0", "--out", run}, "--noisy", {run}},
               {{"--timesteps", "1", "nan", "--out", run}, "--timesteps", {run}},
               {{"--ctx-noise", "nan", "--out", run}, "--ctx-noise", {run}},
               {{"--eval-only", "{dir}/trunc.safetensors", "--resume"}, "--resume"},
               {{"--eval-only", "{dir}/trunc.safetensors", "--threads", "1"}, "trunc.safetensors"},
               {{"--out", "/proc/x/run", "--steps", "1", "--threads", "1"}, "/proc/x/run"}});
}

TEST_F(BadInput, TrainCodec) {
  const std::string run = "{dir}/run";
  check_cases("wm_train_codec",
              {{{"--steps", "0", "--out", run}, "--steps", {run}},
               {{"--lr", "nan", "--out", run}, "--lr", {run}},
               {{"--batch", "0", "--out", run}, "--batch", {run}},
               {{"--latent-noise", "-1", "--out", run}, "--latent-noise", {run}},
               {{"--widths", "0", "--out", run}, "--widths", {run}},
               {{"--minutes", "inf", "--out", run}, "--minutes", {run}},
               {{"--image-size", "36", "--widths", "4", "8", "8", "8", "--steps", "1", "--out", run},
                "not divisible", {run}},
               {{"--eval-only", "{dir}/trunc.safetensors", "--resume"}, "--resume"},
               {{"--eval-only", "{dir}/trunc.safetensors", "--threads", "1"}, "trunc.safetensors"},
               {{"--eval-only", "{dir}/garbage.safetensors", "--threads", "1"}, "garbage.safetensors"},
               {{"--out", "/proc/x/run", "--steps", "1", "--threads", "1"}, "/proc/x/run"}});
}

TEST_F(BadInput, BenchCore) {
  check_cases("wm_bench_core",
              {{{"--tokens", "-5"}, "--tokens"},
               {{"--tokens", "20", "1e12"}, "--tokens"},
               {{"--keys", "0"}, "--keys"},
               {{"--reps", "0"}, "--reps"},
               {{"--threads", "-2"}, "--threads"},
               {{"--quick", "--json", "/proc/x/a.json"}, "/proc/x/a.json"}});
}

TEST_F(BadInput, BenchDit) {
  check_cases("wm_bench_dit",
              {{{"--chunks", "0"}, "--chunks"},
               {{"--steps", "-1"}, "--steps"},
               {{"--shift", "nan"}, "--shift"},
               {{"--layers", "-1"}, "--layers"},
               {{"--batch", "2"}, "--batch"},
               {{"--config", "{dir}/missing.json"}, "missing.json"},
               {{"--config", "{dir}/garbage.json", "--threads", "1"}, "garbage.json"},
               {{"--latent-size", "8x8"}, "--latent-size applies to --lingbot"},
               {{"--lingbot-disk", "{dir}", "--threads", "1"}, "{dir}"}});
}

TEST_F(BadInput, BenchLlm) {
  const std::string json = "{dir}/out.json";
  check_cases("wm_bench_llm",
              {{{"--contexts", "0", "--json", json}, "--contexts", {json}},
               {{"--decode-tokens", "-1", "--json", json}, "--decode-tokens", {json}},
               {{"--model", "{dir}/missing", "--json", json}, "missing", {json}},
               {{"--model", "{dir}/garbage.json", "--threads", "1", "--json", json}, "garbage.json", {json}},
               {{"--model", "{dir}/garbage.json", "--json", "/proc/x/a.json"}, "/proc/x/a.json"}});
}

TEST_F(BadInput, Compare) {
  const std::string csv = "{dir}/m.csv";
  if (fs::exists("/dev/full")) {  // a write that fails (no space): an error, not a silent success
    check_cases("wm_compare", {{{"assets/images/viewer.png", "assets/images/viewer.png", "--csv", "/dev/full"}, "/dev/full"}});
  }
  check_cases("wm_compare",
              {{{"{dir}/trunc.png", "assets/images/viewer.png", "--csv", csv}, "trunc.png", {csv}},
               {{"{dir}/garbage.png", "assets/images/viewer.png", "--csv", csv}, "garbage.png", {csv}},
               {{"{dir}/garbage.mp4", "{dir}/garbage.mp4", "--csv", csv}, "garbage.mp4", {csv}},
               {{"{dir}/missing.png", "assets/images/viewer.png"}, "missing.png"},
               {{"assets/images/viewer.png", "assets/images/viewer.png", "--csv", "/proc/x/m.csv"}, "/proc/x/m.csv"},
               {{"{dir}/garbage.mp4", "{dir}/garbage.mp4", "--frames", "0"}, "--frames"}});
}

TEST_F(BadInput, Llm) {
  const std::string stats = "{dir}/stats.json";
  check_cases("wm_llm",
              {{{"--temperature", "nan", "-p", "hi", "--stats-json", stats}, "--temperature", {stats}},
               {{"--top-p", "nan", "-p", "hi"}, "--top-p"},
               {{"--length-penalty", "inf", "-p", "hi"}, "--length-penalty"},
               {{"--max-new-tokens", "-1", "-p", "hi"}, "--max-new-tokens"},
               {{"--stop-token", "-4", "-p", "hi"}, "--stop-token"},
               {{"--beams", "2", "--chat", "-p", "hi", "--stats-json", stats}, "--beams", {stats}},
               {{"-m", "{dir}/missing", "-p", "hi", "--stats-json", stats}, "missing", {stats}},
               {{"-m", "{dir}/missing", "-p", "hi", "--stats-json", "/proc/x/s.json"}, "/proc/x/s.json"},
               {{"-m", "{dir}/missing", "-p", "hi", "--dump-logits", "/proc/x/l.npy"}, "/proc/x/l.npy"}});
}

TEST_F(BadInput, LlmBench) {
  const std::string json = "{dir}/bench.json";
  check_cases("wm_llm_bench",
              {{{"--samples", "0", "--json", json}, "--samples", {json}},
               {{"--contexts", "10", "--json", json}, "--contexts", {json}},
               {{"--tasks", "bogus", "--json", json}, "--tasks", {json}},
               {{"-m", "{dir}/missing", "--json", "/proc/x/a.json"}, "/proc/x/a.json"},
               {{"-m", "{dir}/missing", "--json", json}, "missing", {json}},
               {{"--budgets", "0%", "--json", json}, "0%", {json}},
               {{"--arrival", "turns", "--json", json}, "--arrival", {json}},
               {{"--bank-host-mib", "8", "--json", json}, "--spill-dir", {json}},
               {{"--relevance", "embedding", "--policies", "evoke", "--json", json}, "--embedder", {json}},
               {{"--embedder", "{dir}/missing", "--json", json}, "--embedder", {json}}});
}

TEST_F(BadInput, PlanBench) {
  const std::string json = "{dir}/plan.json";
  check_cases("wm_plan_bench",
              {{{"--episodes", "0", "--json", json}, "--episodes", {json}},
               {{"--policies", "bogus", "--json", json}, "--policies", {json}},
               {{"--ratio", "nan", "--json", json}, "ratio", {json}},
               {{"--memory-tokens", "8", "--json", json}, "--memory-tokens", {json}},
               {{"--layout", "medium", "--json", json}, "--layout", {json}},
               {{"-m", "{dir}/missing", "--json", json}, "missing", {json}},
               {{"-m", "{dir}/garbage.json", "--json", json}, "garbage.json", {json}},
               {{"--episodes", "1", "--max-steps", "1", "--json", "/proc/x/a.json"}, "/proc/x/a.json"},
               {{"--episodes", "1", "--max-steps", "1", "--plots", "/proc/x/p", "--json", json}, "/proc/x/p", {json}}});
}

TEST_F(BadInput, LlmTrain) {
  const std::string run = "{dir}/run";
  check_cases("wm_llm_train",
              {{{"--lr", "nan", "-o", run}, "--lr", {run}},
               {{"--clip", "inf", "-o", run}, "--clip", {run}},
               {{"--eval-samples", "-3", "-o", run}, "--eval-samples", {run}},
               {{"--save-every", "0", "-o", run}, "--save-every", {run}},
               {{"--curriculum", "garbage", "-o", run}, "--curriculum", {run}},
               {{"--curriculum", "300-64:10", "-o", run}, "--curriculum", {run}},
               {{"--curriculum", "48-64:10", "-o", run}, "--curriculum", {run}},
               {{"--curriculum", "64-9x:10", "-o", run}, "--curriculum", {run}},
               {{"--curriculum", "64:10s", "-o", run}, "--curriculum", {run}},
               {{"--qk-init", "-0.1", "-o", run}, "--qk-init", {run}},
               {{"--init-from", "{dir}/missing", "-o", run}, "--init-from", {run}},
               {{"--init-from", "{dir}", "--resume", "-o", run}, "--resume", {run}},
               {{"--init-from", "{dir}", "--qk-init", "0.05", "-o", run}, "--init-from", {run}},
               {{"--rope-theta", "nan", "-o", run}, "--rope-theta", {run}},
               {{"--rope-theta", "1e5", "--resume", "-o", run}, "--resume", {run}},
               {{"--tasks", "mqar:nan", "-o", run}, "--tasks", {run}},
               {{"--config", "{dir}/missing.json", "-o", run}, "missing.json", {run}},
               {{"-o", "/proc/x/run", "--threads", "1"}, "/proc/x/run"}});
}

TEST_F(BadInput, MakeSuite) {
  const std::string out = "{dir}/suite.json";
  check_cases("wm_make_suite",
              {{{"--fov", "nan", "-o", out}, "--fov", {out}},
               {{"--width", "0", "-o", out}, "--width", {out}},
               {{"--min-psnr", "nan", "-o", out}, "--min-psnr", {out}},
               {{"--count", "0", "-o", out}, "--count", {out}},
               {{"--count", "1", "--min-seconds", "5", "--max-seconds", "2", "-o", out}, "--min-seconds", {out}},
               {{"--count", "1", "--min-seconds", "1", "--max-seconds", "1", "-o", "/proc/x/s.json"}, "/proc/x/s.json"}});
}

TEST_F(BadInput, Viewer) {
  const std::string summary = "{dir}/summary.json";
  check_cases("wm_viewer",
              {{{"--fps", "nan", "--summary-json", summary}, "--fps", {summary}},
               {{"--timeout", "inf", "--summary-json", summary}, "--timeout", {summary}},
               {{"--record-upscale", "0", "--summary-json", summary}, "--record-upscale", {summary}},
               {{"--threads", "-1", "--summary-json", summary}, "--threads", {summary}},
               {{"--summary-json", "/proc/x/s.json", "--chunks", "1"}, "/proc/x/s.json"}});
}

// --- Killed mid-run -------------------------------------------------------------------------

// Starts wm_render on the suite's first episode (784 frames, many seconds on one thread) writing
// {dir}/out.mp4, waits until its file exists and has grown, and signals it. One sampler step: the
// file first grows past its header when the muxer writes its first 256 KiB (about 2.5 s of video),
// which takes 2.7 s of CPU so against 4.4 s with the default steps.
RunResult render_and_signal(const fs::path& dir, int sig) {
  const std::string exe = program_path("wm_render");
  const fs::path out = dir / "out.mp4";
  Started s({exe, "--threads", "1", "--steps", "1", "-o", out.string()}, dir, WM_SOURCE_DIR);
  const auto t0 = std::chrono::steady_clock::now();
  bool growing = false;
  while (s.running() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60) && !growing) {
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      std::error_code ec;
      if (n.find("out.mp4") != std::string::npos && fs::file_size(e.path(), ec) > 10000) growing = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(growing) << "the MP4 did not grow before the render ended";
  s.signal(sig);
  return s.wait(30);
}

class KilledRender : public BadInput {};

TEST_F(KilledRender, SigtermLeavesNothing) {
  if (program_path("wm_render").empty()) GTEST_SKIP() << "wm_render is not built (looked in " << build_dir() << ")";
  const RunResult r = render_and_signal(dir_, SIGTERM);
  EXPECT_EQ(r.signal, SIGTERM) << "exit code " << r.code << "\n" << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "out.mp4")) << "a file under the final name after SIGTERM";
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find("out.mp4"), std::string::npos) << e.path() << " left behind";
}

TEST_F(KilledRender, SigkillLeavesNoFinalName) {
  if (program_path("wm_render").empty()) GTEST_SKIP() << "wm_render is not built (looked in " << build_dir() << ")";
  const RunResult r = render_and_signal(dir_, SIGKILL);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_FALSE(fs::exists(dir_ / "out.mp4")) << "a file under the final name after SIGKILL";
  // What may remain is the hidden temporary file.
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string n = e.path().filename().string();
    if (n.find("out.mp4") != std::string::npos) EXPECT_TRUE(n[0] == '.' && n.find(".part") != std::string::npos) << n;
  }
}

// wm_bench_core's spill folder (under TMPDIR) goes with the program, also when it is terminated.
TEST_F(KilledRender, BenchCoreSpillFolderGoesOnSigterm) {
  const std::string exe = program_path("wm_bench_core");
  if (exe.empty()) GTEST_SKIP() << "wm_bench_core is not built (looked in " << build_dir() << ")";
  const fs::path tmp = dir_ / "tmp";
  fs::create_directories(tmp);
  auto spill_folders = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(tmp)) n += e.path().filename().string().rfind("wm_bench_core", 0) == 0;
    return n;
  };
  Started s({exe, "--threads", "1", "--reps", "50"}, dir_, WM_SOURCE_DIR, {{"TMPDIR", tmp.string()}});
  const auto t0 = std::chrono::steady_clock::now();
  while (s.running() && spill_folders() == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(spill_folders(), 1) << "no spill folder appeared";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  s.signal(SIGTERM);
  const RunResult r = s.wait(30);
  EXPECT_EQ(r.signal, SIGTERM) << r.err;
  EXPECT_EQ(spill_folders(), 0) << "the spill folder was left behind";
}

}  // namespace
}  // namespace wm::testing
