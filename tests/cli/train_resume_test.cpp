// wm_train in pieces: a run stopped and resumed from its checkpoint ends with the same weights,
// EMA weights and losses as one run straight through, and samples made ahead on worker threads
// (--data-threads) change nothing. A program that is not built is skipped, with the reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/build_paths.h"
#include "runtime/safetensors.h"
#include "tests/cli/program_runner.h"
#include "tests/temp_dir.h"

namespace wm::testing {
namespace {

// The losses of a run's log, in step order, as the log writes them.
std::vector<std::string> losses(const fs::path& log) {
  std::vector<std::string> out;
  std::istringstream in(read_text(log));
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("\"loss\":");
    if (at == std::string::npos) continue;
    out.push_back(line.substr(at, line.find(',', at) - at));
  }
  return out;
}

// The run in dir/pieces (stopped and resumed) ended as dir/straight did: the same bytes in each of
// `files` and the same `steps` losses.
void expect_pieces_equal_straight(const fs::path& dir, std::initializer_list<const char*> files, size_t steps) {
  for (const char* f : files) {
    const std::string want = read_text(dir / "straight" / f);
    ASSERT_FALSE(want.empty()) << f;
    EXPECT_EQ(read_text(dir / "pieces" / f), want) << f << ": resumed differs from straight through";
  }
  const std::vector<std::string> want = losses(dir / "straight" / "log.jsonl");
  ASSERT_EQ(want.size(), steps);
  EXPECT_EQ(losses(dir / "pieces" / "log.jsonl"), want);
}

TEST(TrainResume, StoppedAndResumedEqualsStraightThroughAndDataThreadsChangeNothing) {
  const std::string train = program_path("wm_train");
  if (train.empty()) GTEST_SKIP() << "wm_train is not built (it needs the media libraries)";
  const fs::path dir = make_temp_dir("wm_train_resume_");
  const fs::path src(WM_SOURCE_DIR);
  // Self-generated context on, so that the model's own predictions enter the samples too.
  auto run = [&](const std::string& out, int steps, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {train,        "--config",      "configs/tiny.json", "--out",
                                     (dir / out).string(), "--steps", std::to_string(steps), "--seed",
                                     "9",          "--eval-every",  "0",                 "--eval-samples",
                                     "1",          "--ckpt-every",  "1",                 "--sliding",
                                     "0.5",        "--self-ctx",    "0.5",               "--self-ctx-chunks",
                                     "2",          "--threads",     "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const RunResult r = run_program(argv, dir, src, 300, Launch::Forked);
    EXPECT_TRUE(r.exited && r.code == 0) << out << ": " << r.err;
  };
  // The run in pieces makes its samples ahead on two worker threads, the straight one on the
  // main thread: one run fewer than a third, threaded one (4 steps, 4.5 s of CPU), and the
  // threads are checked across the resume too (samples made ahead and not used when it stopped).
  run("straight", 4, {});
  run("pieces", 2, {"--data-threads", "2"});
  run("pieces", 4, {"--resume", "--data-threads", "2"});
  SCOPED_TRACE("pieces: on --data-threads 2, stopped after step 2 and resumed");
  expect_pieces_equal_straight(dir, {"model.safetensors", "last.safetensors"}, 4);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// A warp_reference model (two parameter groups: the body and reference_embedding, which starts
// at zero from --init and learns at --reference-lr) resumes exactly too, and its reference
// embedding moves.
TEST(TrainResume, WarpReferenceModelFromInitResumesExactly) {
  const std::string train = program_path("wm_train");
  if (train.empty()) GTEST_SKIP() << "wm_train is not built (it needs the media libraries)";
  const fs::path dir = make_temp_dir("wm_train_resume_warp_");
  const fs::path src(WM_SOURCE_DIR);
  auto run = [&](const std::string& out, int steps, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {train, "--config", "configs/tiny-ae-warp.json", "--out", (dir / out).string(),
                                     "--steps", std::to_string(steps), "--seed", "4", "--eval-every", "0",
                                     "--eval-samples", "1", "--ckpt-every", "1", "--threads", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const RunResult r = run_program(argv, dir, src, 300, Launch::Forked);
    EXPECT_TRUE(r.exited && r.code == 0) << out << ": " << r.err;
  };
  const std::string init = "assets/models/tiny-ae/model.safetensors";
  run("straight", 3, {"--init", init});
  run("pieces", 1, {"--init", init});
  run("pieces", 3, {"--resume"});
  expect_pieces_equal_straight(dir, {"model.safetensors", "last.safetensors"}, 3);
  const at::Tensor ref = SafeTensors::open((dir / "straight" / "last.safetensors").string()).get("reference_embedding.weight");
  EXPECT_GT(ref.abs().max().item<float>(), 0.0f);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(TrainResume, CodecStoppedAndResumedEqualsStraightThrough) {
  const std::string train = program_path("wm_train_codec");
  if (train.empty()) GTEST_SKIP() << "wm_train_codec is not built";
  const fs::path dir = make_temp_dir("wm_train_codec_resume_");
  auto run = [&](const std::string& out, int steps, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {train, "--out", (dir / out).string(), "--steps", std::to_string(steps),
                                     "--seed", "4", "--batch", "3", "--frames-per-scene", "2", "--widths", "4",
                                     "8", "--channels", "2", "--image-size", "32", "--eval-every", "0",
                                     "--eval-frames", "2", "--ckpt-every", "1", "--threads", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const RunResult r = run_program(argv, dir, fs::path(WM_SOURCE_DIR), 300, Launch::Forked);
    EXPECT_TRUE(r.exited && r.code == 0) << out << ": " << r.err;
  };
  run("straight", 4, {});
  run("pieces", 2, {});
  run("pieces", 4, {"--resume"});
  expect_pieces_equal_straight(dir, {"codec.safetensors", "last.safetensors"}, 4);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace wm::testing
