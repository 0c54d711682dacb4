// LingBot-World-Fast end to end through the programs: wm_bench_dit --lingbot tiny --lingbot-hub
// writes a random model folder as the hub lays it out (config.json, diffusion_pytorch_model
// shards + index) beside a random Wan VAE and a random umT5 encoder, with the tokenizer fixture as
// google/umt5-xxl/, and wm_render runs it from an image, a text context or a prompt, and
// upstream's poses.npy / intrinsics.npy (or a generated trajectory) under WorldKV's memory to a
// valid MP4 and the latents; a missing shard is one line naming it; wm_revisit_bench runs it on an
// episode of the procedural world. A few seconds at this size.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "dit/umt5.h"
#include "dit/umt5_tokenizer.h"
#include "runtime/build_paths.h"
#include "runtime/safetensors.h"
#include "tests/cli/program_runner.h"
#include "tests/temp_dir.h"
#include "tools/cli/npy.h"
#include "tools/media/mp4_reader.h"
#include "tools/media/png.h"

namespace wm::testing {
namespace lingbot_render_test {

class LingbotRender : public ::testing::Test {
 protected:
  void SetUp() override {
    render_ = program_path("wm_render");
    bench_ = program_path("wm_bench_dit");
    if (render_.empty() || bench_.empty()) GTEST_SKIP() << "wm_render or wm_bench_dit is not built";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = make_temp_dir(std::string("wm_lingbot_render_") + info->name() + "_");
    std::vector<std::string> hub{bench_, "--lingbot", "tiny", "--lingbot-hub", (dir_ / "hub").string(),
                                 "--vae-dim", "1", "--shard-mib", "0.1", "--threads", "1"};
    // The umT5 tokenizer --prompt needs: the tokenizer tests' SentencePiece model.
    if (dit::umt5_tokenizer_available())
      hub.insert(hub.end(),
                 {"--umt5-spiece", std::string(WM_SOURCE_DIR) + "/tests/dit/fixtures/lingbot/umt5_spiece.model"});
    const RunResult r = run_program(hub, dir_, dir_, 60, Launch::Forked);
    ASSERT_TRUE(r.exited && r.code == 0) << r.err;
    model_ = (dir_ / "hub" / "lingbot_world_fast").string();
    // A 96 x 64 picture with structure (bands and a gradient).
    Image img(96, 64);
    for (int y = 0; y < 64; ++y)
      for (int x = 0; x < 96; ++x) {
        uint8_t* p = img.pixel(x, y);
        p[0] = uint8_t(x * 2), p[1] = uint8_t((y / 8) % 2 ? 200 : 40), p[2] = uint8_t(255 - y * 3);
      }
    media::write_png((dir_ / "start.png").string(), img);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Upstream's files of a walk of n video frames turning left: poses.npy [n, 4, 4] (OpenCV
  // camera-to-world) and intrinsics.npy [n, 4].
  void write_poses(int n) {
    at::Tensor p = at::eye(4).repeat({n, 1, 1});
    for (int i = 0; i < n; ++i) {
      const double a = 0.05 * i;
      p[i][0][0] = std::cos(a), p[i][0][2] = std::sin(a), p[i][2][0] = -std::sin(a), p[i][2][2] = std::cos(a);
      p[i][2][3] = 0.1 * i;
    }
    cli::save_npy((dir_ / "cam" / "poses.npy").string(), p);
    cli::save_npy((dir_ / "cam" / "intrinsics.npy").string(),
                  at::tensor(std::vector<float>{500, 500, 416, 240}).repeat({n, 1}));
  }

  std::string render_, bench_, model_;
  fs::path dir_;
};

TEST_F(LingbotRender, HubFolderRunsEndToEndUnderWorldKv) {
  fs::create_directories(dir_ / "cam");
  write_poses(45);  // 4 chunks: 9 + 12 + 12 + 12 video frames
  at::Generator g = at::detail::createCPUGenerator(5);
  save_safetensors((dir_ / "ctx.safetensors").string(), {{"context", at::randn({5, 32}, g)}});
  int shards = 0;
  for (const auto& e : fs::directory_iterator(model_)) shards += e.path().extension() == ".safetensors";
  EXPECT_GE(shards, 2) << "the hub folder is sharded";
  EXPECT_TRUE(fs::exists(fs::path(model_) / "diffusion_pytorch_model.safetensors.index.json"));

  const fs::path mp4 = dir_ / "out.mp4", lat = dir_ / "lat.safetensors";
  const RunResult r = run_program({render_, "--model", model_, "--image", (dir_ / "start.png").string(), "--size",
                                   "48*80", "--text-context", (dir_ / "ctx.safetensors").string(), "--poses",
                                   (dir_ / "cam").string(), "--policy", "worldkv", "--sink-frames", "3",
                                   "--retrieved-frames", "3", "--recent-frames", "3", "--threads", "1", "-o",
                                   mp4.string(), "--latents-out", lat.string()},
                                  dir_, dir_, 120, Launch::Forked);
  ASSERT_TRUE(r.exited && r.code == 0) << r.err;
  // Chunk 3 takes chunk 1 back from the bank (sink chunk 0, recent chunk 2).
  EXPECT_NE(r.err.find("chunk 4/4"), std::string::npos) << r.err;
  EXPECT_NE(r.err.substr(r.err.find("chunk 4/4")).find("retrieved"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("LingBot-World-Fast i2v, 4 chunks (45 video frames), policy worldkv"), std::string::npos)
      << r.err;
  // A 96 x 64 image at an area of 48 x 80 pixels: upstream's rounding gives latents 6 x 8, a
  // 64 x 48 video.
  media::VideoReader v(mp4.string());
  const std::vector<Image> frames = v.read_all();
  ASSERT_EQ(frames.size(), 45u);
  EXPECT_EQ(v.width(), 64);
  EXPECT_EQ(v.height(), 48);
  std::set<uint32_t> colors;
  for (int y = 0; y < frames[20].height; ++y)
    for (int x = 0; x < frames[20].width; ++x) {
      const uint8_t* p = frames[20].pixel(x, y);
      colors.insert(uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2]);
    }
  EXPECT_GT(colors.size(), 50u) << "a decoded frame is (nearly) uniform";
  const at::Tensor latents = SafeTensors::open(lat.string()).get("latents");
  EXPECT_EQ(latents.sizes(), (at::IntArrayRef{12, 16, 6, 8}));
  EXPECT_TRUE(at::isfinite(latents).all().item<bool>());

  // The DiT read a block at a time from the shards: the same latents and video, bit for bit.
  const fs::path lat2 = dir_ / "lat_streamed.safetensors";
  const RunResult s = run_program({render_, "--model", model_, "--image", (dir_ / "start.png").string(), "--size",
                                   "48*80", "--text-context", (dir_ / "ctx.safetensors").string(), "--poses",
                                   (dir_ / "cam").string(), "--policy", "worldkv", "--sink-frames", "3",
                                   "--retrieved-frames", "3", "--recent-frames", "3", "--threads", "1",
                                   "--stream-blocks", "--latents-out", lat2.string()},
                                  dir_, dir_, 120, Launch::Forked);
  ASSERT_TRUE(s.exited && s.code == 0) << s.err;
  EXPECT_NE(s.err.find("a block at a time"), std::string::npos) << s.err;
  EXPECT_TRUE(at::equal(SafeTensors::open(lat2.string()).get("latents"), latents));
}

TEST_F(LingbotRender, GeneratedTrajectoryNativeCacheAndBadCheckpoints) {
  const fs::path mp4 = dir_ / "native.mp4";
  const RunResult r = run_program({render_, "--model", model_, "--image", (dir_ / "start.png").string(), "--size",
                                   "32*48", "--trajectory", "revisit", "--chunks", "2", "--threads", "1", "-o",
                                   mp4.string()},
                                  dir_, dir_, 120, Launch::Forked);
  ASSERT_TRUE(r.exited && r.code == 0) << r.err;
  EXPECT_NE(r.err.find("no --prompt or --text-context"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("policy native"), std::string::npos) << r.err;
  EXPECT_EQ(media::VideoReader(mp4.string()).read_all().size(), 21u);
  // A missing shard: one line naming it and a key the index puts there; nothing written.
  fs::path shard;
  for (const auto& e : fs::directory_iterator(model_))
    if (e.path().filename().string().rfind("diffusion_pytorch_model-00002", 0) == 0) shard = e.path();
  ASSERT_FALSE(shard.empty());
  fs::remove(shard);
  const fs::path none = dir_ / "none.mp4";
  const RunResult bad = run_program({render_, "--model", model_, "--image", (dir_ / "start.png").string(), "--size",
                                     "32*48", "--threads", "1", "-o", none.string()},
                                    dir_, dir_, 60, Launch::Forked);
  EXPECT_TRUE(bad.exited && bad.code == 1) << bad.err;
  EXPECT_NE(bad.err.find(shard.filename().string() + ": missing shard"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(none));
}

// --prompt through the folder's umT5 (a random encoder as wide as the DiT's text_dim, 32, and the
// tokenizer fixture, as the hub lays them out: beside lingbot_world_fast/): the latents equal those
// of --text-context holding the prompt's context as the library's tokenizer and encoder give it
// directly (tokenized to the DiT's text_len, the encoder's rows for the real tokens), and differ
// from those of no text. Both options at once, and a folder without the tokenizer, are refused.
TEST_F(LingbotRender, PromptIsTheContextTheLibraryEncodes) {
  if (!dit::umt5_tokenizer_available()) GTEST_SKIP() << "built without libsentencepiece-dev (no umT5 tokenizer)";
  const std::string prompt = "A stone corridor lit by torches, the camera walking forward.";
  const fs::path hub = dir_ / "hub";
  {
    const int threads = at::get_num_threads();
    at::set_num_threads(1);  // as the program runs (--threads 1): the same sums in the same order
    const dit::Umt5Tokenizer tok((hub / "google" / "umt5-xxl" / "spiece.model").string());
    dit::Umt5Encoder enc =
        dit::load_umt5_encoder((hub / "models_t5_umt5-xxl-enc-bf16.safetensors").string(), at::kCPU, at::kFloat);
    const dit::Umt5Tokenizer::Batch b = tok({prompt}, 16);  // the tiny DiT's text_len
    at::NoGradGuard ng;
    const at::Tensor ctx = dit::umt5_context(*enc, b.ids, b.mask)[0].narrow(0, 0, b.mask.sum().item<int64_t>());
    at::set_num_threads(threads);
    save_safetensors((dir_ / "ctx.safetensors").string(), {{"context", ctx.contiguous()}});
  }
  auto render = [&](const std::vector<std::string>& text, const std::string& latents) {
    std::vector<std::string> argv{render_, "--model", model_, "--image", (dir_ / "start.png").string(), "--size",
                                  "32*48", "--trajectory", "forward", "--chunks", "2", "--threads", "1",
                                  "--latents-out", (dir_ / latents).string()};
    argv.insert(argv.end(), text.begin(), text.end());
    return run_program(argv, dir_, dir_, 120, Launch::Forked);
  };
  const RunResult p = render({"--prompt", prompt}, "prompt.safetensors");
  ASSERT_TRUE(p.exited && p.code == 0) << p.err;
  EXPECT_NE(p.err.find("wm_render: prompt: "), std::string::npos) << p.err;
  EXPECT_NE(p.err.find(" umT5 tokens of 16"), std::string::npos) << p.err;
  const RunResult f = render({"--text-context", (dir_ / "ctx.safetensors").string()}, "file.safetensors");
  ASSERT_TRUE(f.exited && f.code == 0) << f.err;
  const RunResult z = render({}, "none.safetensors");
  ASSERT_TRUE(z.exited && z.code == 0) << z.err;
  auto latents = [&](const std::string& name) { return SafeTensors::open((dir_ / name).string()).get("latents"); };
  EXPECT_TRUE(at::equal(latents("prompt.safetensors"), latents("file.safetensors")));
  // The tiny DiT's random weights (N(0, 0.02^2)) make the text's part small, not zero.
  EXPECT_GT((latents("prompt.safetensors") - latents("none.safetensors")).abs().max().item<double>(), 1e-5);

  const RunResult both = render({"--prompt", prompt, "--text-context", (dir_ / "ctx.safetensors").string()}, "x");
  EXPECT_TRUE(both.exited && both.code != 0) << both.err;
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
  fs::remove_all(hub / "google");
  const RunResult no_tok = render({"--prompt", prompt}, "y");
  EXPECT_TRUE(no_tok.exited && no_tok.code == 1) << no_tok.err;
  EXPECT_NE(no_tok.err.find(hub.filename().string() + ": no umT5 tokenizer (google/umt5-xxl/spiece.model), which "
                            "--prompt needs"),
            std::string::npos)
      << no_tok.err;
}

// wm_revisit_bench on the same folder: an episode of a generated suite, its frame 0 as the
// model's first image, its poses as the camera, two policies; the results name both with their
// speed and window.
TEST_F(LingbotRender, RevisitBenchRunsOnTheHubFolder) {
  const std::string bench = program_path("wm_revisit_bench");
  if (bench.empty()) GTEST_SKIP() << "wm_revisit_bench is not built";
  const fs::path out = dir_ / "bench";
  std::vector<std::string> argv{bench, "--model", model_, "--suite", "gen:3:1", "--max-seconds", "4",
                                "--video-size", "32x48", "--policies", "sink_recent", "worldkv", "--threads", "1",
                                "--out-dir", out.string()};
  if (dit::umt5_tokenizer_available()) argv.insert(argv.end(), {"--prompt", "a maze of corridors"});
  const RunResult r = run_program(argv, dir_, dir_, 120, Launch::Forked);
  ASSERT_TRUE(r.exited && r.code == 0) << r.err << r.out;
  if (dit::umt5_tokenizer_available())
    EXPECT_NE(r.err.find("wm_revisit_bench: prompt: "), std::string::npos) << r.err;
  std::ifstream f(out / "results.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j["policies"].size(), 2u);
  for (const auto& p : j["policies"]) {
    EXPECT_GT(p["fps_mean"].get<double>(), 0) << p.dump();
    EXPECT_GT(p["peak_window_bytes"].get<double>(), 0) << p.dump();
    // 4 s at 16 frames/s: 64 frames, of which whole chunks 9 + 4 x 12 = 57.
    EXPECT_EQ(p["episodes"][0]["frames"], 57) << p.dump();
  }
}

}  // namespace lingbot_render_test
}  // namespace wm::testing
