// The streaming session in the model's own terms (poses in radians, worldkv::Action) and the
// conversion of those to the DiT's conditioning tensors.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <string>
#include <vector>

#include "dit/config.h"
#include "dit/codec.h"
#include "dit/conditioning.h"
#include "dit/model.h"
#include "dit/sampler.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "worldkv/conditioning.h"
#include "worldkv/session.h"
#include "worldkv/tiny_dit_adapter.h"
#include "worldkv/world_memory.h"

namespace wm::worldkv {
namespace {

constexpr double kPi = 3.14159265358979323846;

// The tiny architecture with random weights: these tests are about the session, not the weights.
dit::CausalDit random_tiny_model() {
  dit::CausalDit m(dit::load_config(std::string(WM_SOURCE_DIR) + "/configs/tiny.json"));
  m->init_weights(3);
  m->eval();
  return m;
}

dit::SamplerConfig one_step() {
  dit::SamplerConfig s;
  s.timesteps = {1.0};
  return s;
}

// A session of the tiny DiT with the one-step sampler.
std::unique_ptr<WorldSession> tiny_session(dit::CausalDit m, SessionConfig sc = {}) {
  return std::make_unique<WorldSession>(std::make_unique<TinyDitAdapter>(m, one_step(), at::kCPU), sc);
}

ChunkOutput next(WorldSession& s, const std::vector<Pose>& poses, const std::vector<Action>& actions) {
  return s.next(pose_controls(poses, actions));
}

ChunkOutput prompt(WorldSession& s, const std::vector<Image>& frames, const std::vector<Pose>& poses,
                   const std::vector<Action>& actions) {
  return s.prompt(frames, pose_controls(poses, actions));
}

// Frames [f0, f0 + n) of a walk along +x that turns by `turn` radians per frame.
std::vector<Pose> walk(int f0, int n, double turn) {
  std::vector<Pose> out;
  for (int f = f0; f < f0 + n; ++f) out.push_back(Pose{2.0 + 0.125 * f, 3.5, 0.0, turn * f, 0.0});
  return out;
}

TEST(WorldKvConditioning, PosesAndActionsReachTheModelInItsDegrees) {
  const at::Tensor p = pose_tensor({Pose{1.5, -2.25, 7.0, kPi / 2, 0.3}, Pose{0, 0, 0, -kPi, 0}});
  ASSERT_EQ(p.sizes(), (at::IntArrayRef{2, 3}));
  EXPECT_EQ(p.scalar_type(), at::kFloat);
  EXPECT_TRUE(p.equal(at::tensor({1.5f, -2.25f, 90.0f, 0.0f, 0.0f, -180.0f}).view({2, 3})));

  const at::Tensor a = action_tensor({Action{1, -1, radians(7.5)}, Action{-1, 1, -radians(2.5)}, Action{}}, 5);
  EXPECT_TRUE(a.equal(at::tensor({1.f, 0.f, 1.f, 0.f, 7.5f,  //
                                  0.f, 1.f, 0.f, 1.f, -2.5f,  //
                                  0.f, 0.f, 0.f, 0.f, 0.f})
                          .view({3, 5})));
  EXPECT_THROW(action_tensor({Action{}}, 4), Error);

  dit::CondConfig c;
  const dit::FrameCond cond = frame_cond(walk(0, 3, 0.1), std::vector<Action>(3), c, at::kCPU);
  EXPECT_EQ(cond.pose.sizes(), (at::IntArrayRef{3, 3}));
  EXPECT_EQ(cond.action.sizes(), (at::IntArrayRef{3, 5}));
  EXPECT_THROW(frame_cond(walk(0, 3, 0.1), std::vector<Action>(2), c, at::kCPU), Error);
}

TEST(WorldKvConditioning, DegreesThroughRadiansGiveTheSameFloat) {
  // A source that speaks degrees (the procedural world turns by multiples of 2^-k degrees)
  // converts to radians at its edge; the DiT's float32 input must be the degrees it started from.
  int64_t checked = 0;
  for (int k = 0; k <= 7; ++k) {
    const double step = std::ldexp(1.0, -k);
    for (double d = -720.0; d <= 720.0; d += step, ++checked)
      ASSERT_EQ(static_cast<float>(degrees(radians(d))), static_cast<float>(d)) << d << " degrees";
  }
  EXPECT_GT(checked, 300000);
}

TEST(WorldSession, RejectsWrongChunkSizesAndALatePrompt) {
  auto owned = tiny_session(random_tiny_model());
  WorldSession& session = *owned;
  ASSERT_EQ(session.frames_per_chunk(), 3);
  EXPECT_THROW(next(session, {Pose{}}, {Action{}}), Error);
  EXPECT_THROW(next(session, walk(0, 3, 0), std::vector<Action>(2)), Error);
  EXPECT_EQ(session.chunks_done(), 0);
  const std::vector<Image> frames(3, Image(64, 64));
  EXPECT_THROW(prompt(session, {Image(64, 64)}, walk(0, 3, 0), std::vector<Action>(3)), Error);
  next(session, walk(0, 3, 0), std::vector<Action>(3));
  EXPECT_THROW(prompt(session, frames, walk(3, 3, 0), std::vector<Action>(3)), Error);
  EXPECT_THROW(session.reset(1, "native"), Error);  // the tiny DiT has no window of its own
  EXPECT_THROW(session.reset(1, "lru"), Error);
  EXPECT_EQ(session.chunks_done(), 1);  // neither reset changed anything
}

TEST(WorldSession, DeterministicInItsSeedAndSteeredByThePose) {
  dit::CausalDit model = random_tiny_model();
  auto roll = [&](WorldSession& s, double turn) {
    std::vector<Image> out;
    const std::vector<Image> prompt(3, Image(64, 64));
    for (int c = 0; c < 5; ++c) {
      std::vector<Action> actions(3, Action{1, 0, turn});
      ChunkOutput o = c == 0 ? wm::worldkv::prompt(s, prompt, walk(0, 3, turn), actions)
                             : next(s, walk(3 * c, 3, turn), actions);
      EXPECT_EQ(o.index, c);
      EXPECT_EQ(o.prompt, c == 0);
      EXPECT_EQ(o.frames.size(), 3u);
      out.insert(out.end(), o.frames.begin(), o.frames.end());
    }
    return out;
  };
  SessionConfig sc;
  sc.seed = 4;
  auto a_owned = tiny_session(model, sc), b_owned = tiny_session(model, sc);
  WorldSession &a = *a_owned, &b = *b_owned;
  const std::vector<Image> first = roll(a, 0.2);
  const std::vector<Image> second = roll(b, 0.2);
  ASSERT_EQ(first.size(), 15u);
  for (size_t f = 0; f < first.size(); ++f) EXPECT_EQ(first[f].rgb, second[f].rgb) << "frame " << f;
  EXPECT_EQ(a.chunks_done(), 5);
  EXPECT_EQ(a.memory()->chunk_poses().size(), 5u);
  EXPECT_NEAR(a.memory()->chunk_poses()[1].yaw, 0.2 * 4, 1e-12);  // mean of frames 3, 4, 5

  a.reset(4);
  EXPECT_EQ(a.chunks_done(), 0);
  const std::vector<Image> again = roll(a, 0.2);
  for (size_t f = 0; f < first.size(); ++f) EXPECT_EQ(again[f].rgb, first[f].rgb) << "frame " << f;

  // Another turn is another conditioning: the generated frames (after the prompt) change.
  b.reset(4);
  const std::vector<Image> turned = roll(b, -0.3);
  int differing = 0;
  for (size_t f = 3; f < first.size(); ++f) differing += turned[f].rgb != first[f].rgb;
  EXPECT_GT(differing, 0);
}

// A warp_reference model's chunk sees the frame made last (here the prompt's last), turned to
// the chunk's yaws: the session's chunk is the one made by hand from the same window and that
// reference, and not the one made without it.
TEST(WorldSession, AWarpReferenceModelSeesTheLastFrameTurned) {
  dit::DitConfig c = dit::load_config(std::string(WM_SOURCE_DIR) + "/configs/tiny.json");
  c.cond.warp_reference = true;
  dit::CausalDit m(c);
  m->init_weights(3);
  m->eval();
  SessionConfig sc;
  sc.seed = 6;
  auto owned = tiny_session(m, sc);
  WorldSession& s = *owned;
  std::vector<Image> prompt(3, Image(64, 64));
  for (int f = 0; f < 3; ++f)
    for (size_t i = 0; i < prompt[f].rgb.size(); ++i) prompt[f].rgb[i] = static_cast<uint8_t>((i * 7 + f * 31) % 251);
  const std::vector<Action> acts(3, Action{1, 0, 0.2});
  const std::vector<Pose> p0 = walk(0, 3, 0.2), p1 = walk(3, 3, 0.2);
  wm::worldkv::prompt(s, prompt, p0, acts);
  const ChunkOutput out = next(s, p1, acts);

  at::NoGradGuard ng;
  WorldMemory mem(m->kv_spec(at::kCPU), s.config().memory);
  auto codec = dit::make_codec(c);
  const at::Tensor lat = codec->encode_images(prompt, at::kCPU);
  mem.prepare(0, p0);
  const dit::FrameCond c0 = frame_cond(p0, acts, c.cond, at::kCPU);
  std::vector<LayerKv> kv;
  m->forward_chunk(lat, at::scalar_tensor(0.0), c0, 0, &mem.window(), &kv);
  mem.commit(0, std::move(kv), p0);
  mem.prepare(1, p1);
  dit::FrameCond c1 = frame_cond(p1, acts, c.cond, at::kCPU);
  c1.reference = dit::warp_reference(lat[2], c0.pose[2][2].item<double>(), c1.pose.select(1, 2), c.cond);
  at::Generator g = at::detail::createCPUGenerator(6);
  const std::vector<Image> by_hand = codec->decode_images(dit::generate_chunk(m, &mem.window(), c1, 3, one_step(), g).latents);
  ASSERT_EQ(out.frames.size(), 3u);
  for (int f = 0; f < 3; ++f) EXPECT_EQ(out.frames[f].rgb, by_hand[f].rgb) << "frame " << f;
  c1.reference = at::Tensor();
  g = at::detail::createCPUGenerator(6);
  const std::vector<Image> without = codec->decode_images(dit::generate_chunk(m, &mem.window(), c1, 3, one_step(), g).latents);
  EXPECT_NE(out.frames[0].rgb, without[0].rgb);
}

}  // namespace
}  // namespace wm::worldkv
