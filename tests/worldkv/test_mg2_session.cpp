// Matrix-Game-2.0 sessions (the session over Mg2Adapter, a small random model of its architecture): the world memory's window
// with the action K/V that follow their chunks gives what upstream's own rolling window gives
// when it holds the same frames (the rolling window itself is held to upstream by
// tests/dit/test_mg2_dit.cpp), and every video policy runs on the model.
#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "runtime/error.h"
#include "tests/dit/mg2_fixture.h"
#include "worldkv/mg2_adapter.h"
#include "worldkv/session.h"

namespace wm::worldkv {
namespace {

using test::fixture_uniform;

// A small random model of MG2's architecture (every module, the action branches of `mode`) on a
// reduced latent grid, so that sessions of several chunks run in a second or two.
dit::Mg2Dit fixture_model(const std::string& mode) {
  dit::Mg2Config c;
  c.dim = 32;
  c.num_heads = 2;
  c.ffn_dim = 64;
  c.num_layers = 2;
  c.latent_height = 8;
  c.latent_width = 16;
  c.local_attn_size = mode == "gta_drive" ? 4 : 6;
  dit::Mg2ActionConfig a;
  a.blocks = {0};
  a.heads_num = 2;
  a.hidden_size = 8;
  a.img_hidden_size = c.dim;
  a.keyboard_dim_in = mode == "universal" ? 4 : mode == "gta_drive" ? 2 : 7;
  a.enable_mouse = mode != "templerun";
  a.keyboard_hidden_dim = 32;
  a.mouse_hidden_dim = 32;
  a.rope_dim_list = {8, 4, 4};
  a.mouse_qk_dim_list = {8, 4, 4};
  c.action = a;
  dit::Mg2Dit m(c);
  at::NoGradGuard ng;
  uint64_t seed = 40;
  for (auto& p : m->named_parameters(true)) {
    at::Tensor& t = p.value();
    const double fan_in = t.dim() >= 2 ? double(t.numel() / t.size(0)) : double(c.dim);
    t.copy_(fixture_uniform(seed++, t.sizes().vec()) / std::sqrt(fan_in));
  }
  m->eval();
  return m;
}

// A walk: W held, the mouse turning right for a while, then back left (so that a later chunk
// faces where an early one did).
std::vector<Mg2Input> inputs(int first, int n, int kd) {
  std::vector<Mg2Input> v;
  for (int i = first; i < first + n; ++i) {
    Mg2Input in;
    in.keyboard.assign(kd, 0.f);
    in.keyboard[0] = (i / 6) % 2 == 0 ? 1.f : 0.f;
    in.yaw = i < 30 ? 0.1f : -0.1f;
    in.pitch = (i % 10 == 0) ? 0.1f : 0.f;
    v.push_back(in);
  }
  return v;
}

// A session of `model` (no codec: latents only), conditioned on the fixture's image latents and
// CLIP tokens, under `policy` ("native" or a video policy).
std::unique_ptr<WorldSession> mg2_session(dit::Mg2Dit model, SessionConfig cfg, const std::string& policy) {
  cfg.set_policy(policy);
  return std::make_unique<WorldSession>(
      std::make_unique<Mg2Adapter>(model, nullptr, fixture_uniform(2, {4, 16, 8, 16}),
                                   fixture_uniform(3, {257, 1280}), Mg2Options{}, at::kCPU),
      cfg);
}

std::vector<ChunkOutput> roll(WorldSession& s, int chunks, int kd) {
  std::vector<ChunkOutput> out;
  int done = 0;
  for (int c = 0; c < chunks; ++c) {
    const int n = s.controls_for_next_chunk();
    out.push_back(s.next(mg2_controls(inputs(done, n, kd))));
    done += n;
  }
  return out;
}

TEST(Mg2Session, WorldMemoryWindowEqualsUpstreamsRollingWindow) {
  // universal: local_attn_size 6, so the rolling window holds the previous chunk, which is what
  // sliding_window with recent = 3 frames holds; the action K/V come from the chunk store.
  SessionConfig native;
  native.seed = 5;
  SessionConfig sliding = native;
  sliding.memory.sink_frames = 0;
  sliding.memory.retrieved_frames = 0;
  sliding.memory.recent_frames = 3;
  auto a = mg2_session(fixture_model("universal"), native, "native");
  auto b = mg2_session(fixture_model("universal"), sliding, "sliding_window");
  auto ra = roll(*a, 3, 4), rb = roll(*b, 3, 4);
  for (int c = 0; c < 3; ++c) {
    const double d = test::rel_max_diff(rb[c].latents, ra[c].latents);
    EXPECT_LT(d, 1e-5) << "chunk " << c;
  }
  // A wrong action context (none) changes the result: the comparison can fail.
  SessionConfig other = native;
  other.seed = 6;
  auto d = mg2_session(fixture_model("universal"), other, "native");
  EXPECT_GT(test::rel_max_diff(roll(*d, 2, 4)[1].latents, ra[1].latents), 1e-2);
}

TEST(Mg2Session, EveryVideoPolicyRunsAndKeepsActionKvOfWhatItHolds) {
  for (const char* policy : {"full_kv", "sliding_window", "sink_recent", "worldkv", "worldkv_c"}) {
    SCOPED_TRACE(policy);
    SessionConfig cfg;
    cfg.memory.sink_frames = 3;
    cfg.memory.retrieved_frames = 3;
    cfg.memory.recent_frames = 3;
    cfg.seed = 1;
    auto s = mg2_session(fixture_model("gta_drive"), cfg, policy);
    const bool banks = std::string(policy).rfind("worldkv", 0) == 0;
    const int n = banks ? 4 : 3;  // chunk 3 is the first that can retrieve (sink 0, recent 1, banked 2)
    auto out = roll(*s, n, 2);
    ASSERT_EQ(int(out.size()), n);
    for (const auto& o : out) {
      EXPECT_EQ(o.latents.sizes(), (at::IntArrayRef{3, 16, 8, 16}));
      EXPECT_TRUE(at::isfinite(o.latents).all().item<bool>());
      EXPECT_GT(o.state_bytes, 0u);
    }
    if (banks) {
      EXPECT_FALSE(out[3].retrieved.empty()) << "a banked chunk comes back";
      EXPECT_GT(out[3].bank_bytes[0] + out[3].bank_bytes[1] + out[3].bank_bytes[2], 0u);
    }
  }
}

TEST(Mg2Session, ReanchoredPlacementRunsWithActionKeysMoved) {
  SessionConfig cfg;
  cfg.memory.sink_frames = 0;
  cfg.memory.retrieved_frames = 3;
  cfg.memory.recent_frames = 3;
  cfg.memory.placement = Placement::Reanchored;
  auto s = mg2_session(fixture_model("templerun"), cfg, "worldkv");
  auto out = roll(*s, 4, 7);
  EXPECT_FALSE(out[3].retrieved.empty());
  EXPECT_TRUE(at::isfinite(out[3].latents).all().item<bool>());
}

TEST(Mg2Session, ControlsAreCheckedFirstAndResetSwitchesTheWindow) {
  auto s = mg2_session(fixture_model("universal"), SessionConfig{}, "native");
  EXPECT_EQ(s->controls_for_next_chunk(), 9);
  EXPECT_THROW(s->next(mg2_controls(inputs(0, 8, 4))), Error);  // the first chunk takes 9 frames
  EXPECT_THROW(s->next(mg2_controls(inputs(0, 9, 2))), Error);  // universal's keyboard is 4 wide
  EXPECT_TRUE(s->poses().empty());
  const auto a = roll(*s, 2, 4);
  EXPECT_EQ(s->controls_for_next_chunk(), 12);
  EXPECT_EQ(s->memory(), nullptr);
  EXPECT_GT(a[1].window_bytes, 0u);  // upstream's rolling cache and its action K/V
  EXPECT_GT(a[1].state_bytes, 0u);
  EXPECT_EQ(s->poses().size(), 21u);
  EXPECT_EQ(s->model().native_window_chunks(2), std::vector<std::string>{"chunk:1"});
  s->reset(0, "worldkv");
  ASSERT_NE(s->memory(), nullptr);
  EXPECT_TRUE(s->poses().empty());
  EXPECT_EQ(s->config().policy_name(), "worldkv");
  s->reset(0, "native");  // the same rollout again
  const auto b = roll(*s, 2, 4);
  EXPECT_TRUE(at::equal(a[1].latents, b[1].latents));
}

TEST(Mg2ActionKv, ReanchoringEqualsRopeAtTheShiftedFrame) {
  dit::Mg2ActionConfig a;
  a.heads_num = 2;
  a.keyboard_hidden_dim = 32;
  a.mouse_hidden_dim = 32;
  a.rope_dim_list = {8, 4, 4};
  a.mouse_qk_dim_list = {8, 4, 4};
  at::Tensor raw_k = fixture_uniform(11, {3, 2, 16}), raw_m = fixture_uniform(12, {5, 3, 2, 16});
  dit::ActionKv kv;
  kv.kb_k = {dit::mg2_action_rope(raw_k, 4, 8, a.rope_theta)};
  kv.kb_v = {raw_k};
  kv.ms_k = {dit::mg2_action_rope(raw_m, 4, 8, a.rope_theta)};
  kv.ms_v = {raw_m};
  dit::ActionKv moved = kv.reanchored(7, a);
  EXPECT_TRUE(at::allclose(moved.kb_k[0], dit::mg2_action_rope(raw_k, 11, 8, a.rope_theta), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(moved.ms_k[0], dit::mg2_action_rope(raw_m, 11, 8, a.rope_theta), 1e-5, 1e-5));
  EXPECT_TRUE(at::equal(moved.kb_v[0], kv.kb_v[0]));
  // Channels past the first 8 never move.
  EXPECT_TRUE(at::equal(moved.kb_k[0].narrow(-1, 8, 8), kv.kb_k[0].narrow(-1, 8, 8)));
}

TEST(Mg2Pose, WasdAndMouseAccumulate) {
  Pose p;
  Mg2Input w;
  w.keyboard = {1, 0, 0, 0};
  p = mg2_integrate_pose(p, w, "universal", 1.0, 1.0);
  EXPECT_DOUBLE_EQ(p.x, 1.0);
  Mg2Input turn;
  turn.keyboard = {0, 0, 0, 1};  // D: strafe right (+y when facing +x)
  turn.yaw = 0.5f;
  p = mg2_integrate_pose(p, turn, "universal", 1.0, 1.0);
  EXPECT_NEAR(p.yaw, 0.5, 1e-7);
  EXPECT_NEAR(p.x, 1.0 - std::sin(0.5), 1e-7);
  EXPECT_NEAR(p.y, std::cos(0.5), 1e-7);
}

}  // namespace
}  // namespace wm::worldkv
