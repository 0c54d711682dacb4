// LingBot-World-Fast sessions (the session over LingbotAdapter, the reduced random model of the
// DiT conformance fixtures, tests/dit/fixtures/lingbot): the adapter computes what a hand-written
// loop of upstream's chunk generation computes (the DiT, sampler and camera preprocessing are
// held to upstream by tests/dit/test_lingbot_dit.cpp), the world memory's window gives what
// upstream's rolling cache with its sink gives when it holds the same frames, the live camera
// path equals the known-trajectory path when it divides by the same scale, and every video
// policy runs on the model.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "dit/lingbot_weights.h"
#include "dit/sampler.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tests/dit/mg2_fixture.h"
#include "tests/runtime/test_util.h"
#include "worldkv/lingbot_adapter.h"
#include "worldkv/policy.h"
#include "worldkv/session.h"

namespace wm::worldkv {
namespace lingbot_session_test {

using test::fixture_uniform;

constexpr int64_t kLatH = 6, kLatW = 8;

dit::LingbotDit fixture_model() {
  return dit::load_lingbot_dit(std::string(WM_SOURCE_DIR) + "/tests/dit/fixtures/lingbot", at::kCPU);
}
at::Tensor image_latents() { return fixture_uniform(2, {4, 16, kLatH, kLatW}); }
at::Tensor text_context() { return fixture_uniform(3, {10, 32}); }

// A walk of n video frames: forward at a varying speed, turning right for 40 frames, then back
// left (so that late chunks face where early ones did), bobbing in height and pitch.
std::vector<Pose> walk(int n) {
  std::vector<Pose> v;
  Pose p;
  for (int i = 0; i < n; ++i) {
    if (i > 0) {
      p.yaw += i < 40 ? 0.08 : -0.08;
      const double step = 0.05 * (1.0 + 0.5 * std::sin(0.3 * i));
      p.x += step * std::cos(p.yaw);
      p.y += step * std::sin(p.yaw);
    }
    p.z = 0.02 * std::sin(0.5 * i);
    p.pitch = 0.05 * std::sin(0.2 * i);
    v.push_back(p);
  }
  return v;
}

std::vector<FrameControl> controls(const std::vector<Pose>& poses, size_t first, size_t n) {
  std::vector<FrameControl> out(n);
  for (size_t i = 0; i < n; ++i) out[i].pose = poses.at(first + i);
  return out;
}

std::unique_ptr<WorldSession> session(const std::string& policy, SessionConfig cfg, LingbotOptions opt = {}) {
  cfg.set_policy(policy);
  return std::make_unique<WorldSession>(
      std::make_unique<LingbotAdapter>(fixture_model(), nullptr, text_context(), image_latents(), std::move(opt),
                                       at::kCPU),
      cfg);
}

std::vector<ChunkOutput> roll(WorldSession& s, const std::vector<Pose>& poses, int chunks) {
  std::vector<ChunkOutput> out;
  size_t done = 0;
  for (int c = 0; c < chunks; ++c) {
    const size_t n = size_t(s.controls_for_next_chunk());
    out.push_back(s.next(controls(poses, done, n)));
    done += n;
  }
  return out;
}

int video_frames(int chunks) { return 9 + 12 * (chunks - 1); }

TEST(LingbotSession, NativeSessionEqualsUpstreamsChunkLoop) {
  // The loop of WanI2VFast.generate written out with the library's pieces: the mask and image
  // latents, the whole trajectory's camera input, the text K/V, the noise drawn in the session's
  // order (the chunk's, then one draw per re-noising), the rolling cache with its sink.
  const int chunks = 5;
  const std::vector<Pose> poses = walk(video_frames(chunks));
  SessionConfig cfg;
  cfg.seed = 7;
  LingbotOptions opt;
  opt.trajectory = lingbot_c2ws(poses);
  auto s = session("native", cfg, opt);
  const auto got = roll(*s, poses, chunks);

  at::NoGradGuard ng;
  dit::LingbotDit m = fixture_model();
  const auto& c = m->config();
  const dit::LingbotText text = m->encode_text(text_context());
  const at::Tensor K = at::tensor(std::vector<float>{503, 503, 416, 240});
  const at::Tensor cam = dit::lingbot_camera_input(lingbot_c2ws(poses), K, 8 * kLatH, 8 * kLatW);
  ASSERT_EQ(cam.size(0), 3 * chunks);
  at::Tensor cond = at::cat({at::zeros({3 * chunks, 4, kLatH, kLatW}), image_latents().index_select(
                                 0, at::arange(3 * chunks).clamp_max(3))}, 1);
  cond[0].narrow(0, 0, 4).fill_(1.0);
  dit::LingbotNativeCache cache(c.local_attn_size, c.sink_size, 3, kLatH * kLatW / 4);
  at::Generator gen = at::detail::createCPUGenerator(7);
  const dit::LingbotSchedule sched = dit::lingbot_schedule();
  for (int k = 0; k < chunks; ++k) {
    at::Tensor noise = dit::seeded_noise({3, 16, kLatH, kLatW}, gen, at::kCPU);
    dit::LingbotNoise renoise = [&](int, at::IntArrayRef shape) { return dit::seeded_noise(shape, gen, at::kCPU); };
    auto r = dit::lingbot_generate_chunk(*m, noise, cond.narrow(0, 3 * k, 3), cam.narrow(0, 3 * k, 3), text, 3 * k,
                                         cache.context(), sched, renoise);
    cache.commit(r.kv);
    EXPECT_LT(test::rel_max_diff(got[size_t(k)].latents, r.latents), 1e-6) << "chunk " << k;
    EXPECT_EQ(got[size_t(k)].window_bytes > 0, true);
  }
  // The retrieval poses are the controls' own.
  EXPECT_EQ(s->poses().size(), poses.size());
  EXPECT_DOUBLE_EQ(s->poses().back().yaw, poses.back().yaw);
}

TEST(LingbotSession, WorldMemoryWindowEqualsUpstreamsRollingCacheWithSink) {
  // The fixture model's cache: local_attn_size 9 with a sink of 3, so from chunk 3 on a chunk sees
  // chunk 0 and the previous chunk: the window of sink_recent with 3 sink and 3 recent frames.
  const int chunks = 5;
  const std::vector<Pose> poses = walk(video_frames(chunks));
  SessionConfig cfg;
  cfg.seed = 3;
  cfg.memory.sink_frames = 3;
  cfg.memory.retrieved_frames = 0;
  cfg.memory.recent_frames = 3;
  auto native = session("native", cfg), memory = session("sink_recent", cfg);
  const auto a = roll(*native, poses, chunks), b = roll(*memory, poses, chunks);
  for (int k = 0; k < chunks; ++k) EXPECT_LT(test::rel_max_diff(b[size_t(k)].latents, a[size_t(k)].latents), 1e-5) << k;
  // Without the sink the window differs from chunk 3 on: the comparison can fail.
  SessionConfig sliding = cfg;
  sliding.memory.sink_frames = 0;
  sliding.memory.recent_frames = 6;
  auto d = session("sliding_window", sliding);
  const auto r = roll(*d, poses, 4);
  EXPECT_LT(test::rel_max_diff(r[2].latents, a[2].latents), 1e-5);
  EXPECT_GT(test::rel_max_diff(r[3].latents, a[3].latents), 1e-3);
}

TEST(LingbotSession, LiveCameraWithTheTrajectorysScaleEqualsTheKnownTrajectory) {
  const int chunks = 3;
  const std::vector<Pose> poses = walk(video_frames(chunks));
  const at::Tensor c2ws = lingbot_c2ws(poses);
  std::vector<int64_t> every4;
  for (int64_t i = 0; i < c2ws.size(0); i += 4) every4.push_back(i);
  const at::Tensor rel = dit::lingbot_relative_poses(c2ws.index_select(0, at::tensor(every4)));
  SessionConfig cfg;
  cfg.seed = 11;
  LingbotOptions known;
  known.trajectory = c2ws;
  LingbotOptions fixed;
  fixed.translation_scale = dit::lingbot_max_translation(rel);
  const auto a = roll(*session("worldkv", cfg, known), poses, chunks);
  const auto b = roll(*session("worldkv", cfg, fixed), poses, chunks);
  // Upstream's interpolation lands on frames 4j up to its quaternion round trip.
  for (int k = 0; k < chunks; ++k) EXPECT_LT(test::rel_max_diff(b[size_t(k)].latents, a[size_t(k)].latents), 1e-4) << k;
  // The running maximum differs until the longest step has been seen (walk() speeds up later).
  const auto live = roll(*session("worldkv", cfg), poses, chunks);
  EXPECT_GT(test::rel_max_diff(live[0].latents, a[0].latents), 1e-4);
}

TEST(LingbotSession, EveryVideoPolicyRunsAndWorldKvRetrievesOnReturn) {
  const int chunks = 7;
  const std::vector<Pose> poses = walk(video_frames(chunks));
  for (const std::string& policy : policy_names()) {
    SCOPED_TRACE(policy);
    SessionConfig cfg;
    cfg.memory.sink_frames = 3;
    cfg.memory.retrieved_frames = 3;
    cfg.memory.recent_frames = 3;
    cfg.seed = 1;
    auto s = session(policy, cfg);
    const auto out = roll(*s, poses, chunks);
    bool retrieved = false;
    for (const auto& o : out) {
      EXPECT_EQ(o.latents.sizes(), (at::IntArrayRef{3, 16, kLatH, kLatW}));
      EXPECT_TRUE(at::isfinite(o.latents).all().item<bool>());
      EXPECT_EQ(o.state_bytes, 0u);
      retrieved = retrieved || !o.retrieved.empty();
    }
    if (policy.rfind("worldkv", 0) == 0) {
      EXPECT_TRUE(retrieved) << "a banked chunk comes back";
      EXPECT_GT(out.back().bank_bytes[0] + out.back().bank_bytes[1] + out.back().bank_bytes[2], 0u);
    }
  }
}

// WorldKV's window kept in files (MemoryConfig::kv_files_dir, the K/V mapped from unnamed files
// in the folder) gives the latents the window in memory gives, bit for bit, over chunks that
// evict, bank and retrieve; while the session lives its window's bytes are mapped from there.
TEST(LingbotSession, WorldKvWindowInFilesGivesTheSameLatents) {
  const int chunks = 7;
  const std::vector<Pose> poses = walk(video_frames(chunks));
  SessionConfig cfg;
  cfg.memory.sink_frames = 3;
  cfg.memory.retrieved_frames = 3;
  cfg.memory.recent_frames = 3;
  cfg.seed = 5;
  const auto in_memory = roll(*session("worldkv", cfg), poses, chunks);
  const test::TempFolder dir("wm_lingbot_kv_files_");
  cfg.memory.kv_files_dir = dir.path.string();
  auto s = session("worldkv", cfg);
  const auto in_files = roll(*s, poses, chunks);
  bool retrieved = false;
  for (int k = 0; k < chunks; ++k) {
    EXPECT_TRUE(in_files[size_t(k)].latents.equal(in_memory[size_t(k)].latents)) << "chunk " << k;
    retrieved = retrieved || !in_files[size_t(k)].retrieved.empty();
  }
  EXPECT_TRUE(retrieved);
  const MappedStorage* files = s->memory()->window().storage().get();
  ASSERT_NE(files, nullptr);
  EXPECT_EQ(files->dir(), dir.path.string());
  EXPECT_GT(files->bytes(), 0u);
  // The model's own window (policy native) is not the memory's: asking for it in files is refused.
  EXPECT_THROW(s->reset(1, "native"), Error);
}

TEST(LingbotSession, ControlsTrajectoryAndNativeWindowChunks) {
  const std::vector<Pose> poses = walk(video_frames(2));
  LingbotOptions opt;
  opt.trajectory = lingbot_c2ws(poses);  // 2 chunks of latent frames
  auto s = session("native", SessionConfig{}, opt);
  EXPECT_EQ(s->info().kind, "lingbot-world-fast");
  EXPECT_EQ(s->info().tokens_per_frame, kLatH * kLatW / 4);
  EXPECT_EQ(s->controls_for_next_chunk(), 9);
  EXPECT_THROW(s->next(controls(poses, 0, 8)), Error);
  std::vector<FrameControl> bad = controls(poses, 0, 9);
  bad[4].pose.yaw = std::nan("");
  EXPECT_THROW(s->next(bad), Error);
  roll(*s, walk(video_frames(3)), 2);
  try {
    s->next(controls(walk(video_frames(3)), 21, 12));
    FAIL() << "a chunk past the known trajectory must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the trajectory covers 6 latent frames"), std::string::npos) << e.what();
  }
  // Upstream's rolling cache: 9 frames counting the chunk, a sink of 3.
  using V = std::vector<std::string>;
  EXPECT_EQ(lingbot_native_window_chunks(0, 9, 3, 3), V{});
  EXPECT_EQ(lingbot_native_window_chunks(2, 9, 3, 3), (V{"chunk:0", "chunk:1"}));
  EXPECT_EQ(lingbot_native_window_chunks(3, 9, 3, 3), (V{"chunk:0", "chunk:2"}));
  EXPECT_EQ(lingbot_native_window_chunks(5, 9, 3, 3), (V{"chunk:0", "chunk:4"}));
  EXPECT_EQ(lingbot_native_window_chunks(4, 12, 0, 3), (V{"chunk:1", "chunk:2", "chunk:3"}));
  EXPECT_EQ(lingbot_native_window_chunks(4, -1, 0, 3), (V{"chunk:0", "chunk:1", "chunk:2", "chunk:3"}));
}

TEST(LingbotPose, OpenCvCameraToWorldOfPoses) {
  // Pose{} is the identity; the matrix is a proper rotation; the pose comes back.
  const Matrix4 id = opencv_camera_to_world(Pose{});
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(id[size_t(i)], (i % 5 == 0) ? 1.0 : 0.0, 1e-15) << i;
  const Pose p{1.5, -2.0, 0.3, 2.5, -0.4};
  const Matrix4 m = opencv_camera_to_world(p);
  const at::Tensor R = at::tensor(std::vector<double>(m.begin(), m.end())).view({4, 4}).narrow(0, 0, 3).narrow(1, 0, 3);
  EXPECT_NEAR(at::det(R).item<double>(), 1.0, 1e-12);
  EXPECT_TRUE(at::allclose(at::matmul(R, R.t()), at::eye(3, R.options()), 0, 1e-12));
  const Pose q = pose_from_opencv(m);
  EXPECT_NEAR(q.x, p.x, 1e-12);
  EXPECT_NEAR(q.y, p.y, 1e-12);
  EXPECT_NEAR(q.z, p.z, 1e-12);
  EXPECT_NEAR(q.yaw, p.yaw, 1e-12);
  EXPECT_NEAR(q.pitch, p.pitch, 1e-12);
  // Relative to the first frame (what the DiT sees): a step forward is +z of the camera, a step
  // to the right (+y at yaw 0) is +x, up is -y; a turn to the right turns forward towards +x; a
  // look up turns it towards -y.
  auto rel = [](const Pose& b) {
    return dit::lingbot_relative_poses(lingbot_c2ws({Pose{}, b}))[1].to(at::kDouble);
  };
  EXPECT_TRUE(at::allclose(rel(Pose{1, 0, 0, 0, 0}).narrow(0, 0, 3).select(1, 3),
                           at::tensor(std::vector<double>{0, 0, 1}), 0, 1e-6));
  EXPECT_TRUE(at::allclose(rel(Pose{0, 1, 0, 0, 0}).narrow(0, 0, 3).select(1, 3),
                           at::tensor(std::vector<double>{1, 0, 0}), 0, 1e-6));
  EXPECT_TRUE(at::allclose(rel(Pose{0, 0, 1, 0, 0}).narrow(0, 0, 3).select(1, 3),
                           at::tensor(std::vector<double>{0, -1, 0}), 0, 1e-6));
  EXPECT_GT(rel(Pose{0, 0, 0, 0.3, 0})[0][2].item<double>(), 0.25);   // forward gains +x
  EXPECT_LT(rel(Pose{0, 0, 0, 0, 0.3})[1][2].item<double>(), -0.25);  // forward gains -y
}

}  // namespace lingbot_session_test
}  // namespace wm::worldkv
