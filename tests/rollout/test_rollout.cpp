#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "dit/config.h"
#include "dit/model.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tools/rollout/episode_runner.h"
#include "tools/rollout/world_adapter.h"
#include "tools/train/data.h"
#include "tools/world/suite.h"
#include "tools/world/trajectory.h"
#include "worldkv/conditioning.h"
#include "worldkv/session.h"
#include "worldkv/tiny_dit_adapter.h"
#include "worldkv/world_memory.h"

namespace wm::rollout {
namespace {

using worldkv::ChunkOutput;
using worldkv::SessionConfig;
using worldkv::WorldSession;

// The shipped model when present; else the tiny architecture with its own random weights (the
// properties below are about the runtime, not about what the weights draw).
dit::CausalDit tiny_model() {
  const std::string shipped = std::string(WM_SOURCE_DIR) + "/assets/models/tiny/model.safetensors";
  if (std::filesystem::exists(shipped)) return worldkv::load_world_model(shipped, at::kCPU);
  dit::CausalDit m(dit::load_config(std::string(WM_SOURCE_DIR) + "/configs/tiny.json"));
  m->init_weights(3);
  m->eval();
  return m;
}

// The tiny architecture cut to two layers, with random weights: what the 1,500-frame rollout
// checks is the window's bookkeeping over positions past the 1,024-frame table, which every layer
// keeps alike; two layers (not one) still catch a window that keeps one layer and not the others,
// at about half the CPU time of the four (16 s against 27 s).
dit::CausalDit two_layer_model() {
  dit::DitConfig c = dit::load_config(std::string(WM_SOURCE_DIR) + "/configs/tiny.json");
  c.n_layers = 2;
  dit::CausalDit m(c);
  m->init_weights(3);
  m->eval();
  return m;
}

// A session of the tiny model with a sampler of these steps.
std::unique_ptr<WorldSession> tiny_session(dit::CausalDit model, const SessionConfig& sc, std::vector<double> steps) {
  dit::SamplerConfig sampler;
  sampler.timesteps = std::move(steps);
  return std::make_unique<WorldSession>(std::make_unique<worldkv::TinyDitAdapter>(model, sampler, at::kCPU), sc);
}

// Endless walk with turns: poses and actions for n frames, integrated in a real scene.
world::Episode long_walk(int frames) {
  world::Episode ep = world::generate_episode(11);
  const world::Scene scene = world::scene_of(ep);
  ep.actions.resize(frames);
  for (int f = 0; f < frames; ++f) {
    world::Action a;
    a.forward = (f / 40) % 3 != 2;
    a.dyaw_deg = (f / 40) % 3 == 2 ? 7.5 : 0.0;
    ep.actions[f] = a;
  }
  world::derive_poses(ep, scene);
  ep.revisits.clear();
  return ep;
}

TEST(Rollout, FifteenHundredFramesWithConstantWindow) {
  SessionConfig sc;
  sc.memory.policy = worldkv::Policy::WorldKvC;
  // One step: the test is about the runtime over a long rollout.
  auto owned = tiny_session(two_layer_model(), sc, {1.0});
  WorldSession& session = *owned;
  const world::Episode ep = long_walk(1500);
  size_t bytes_after_warmup = 0;
  const auto t0 = std::chrono::steady_clock::now();
  EpisodeRun run = run_episode(session, ep, 5, 0, [&](const ChunkOutput& c, const EpisodeRun&) {
    if (c.index == 10) bytes_after_warmup = session.memory()->window_bytes();
    if (c.index > 10) ASSERT_EQ(session.memory()->window_bytes(), bytes_after_warmup) << "chunk " << c.index;
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(run.frames.size(), 1500u);
  EXPECT_EQ(session.chunks_done(), 500);
  // The newest chunk sits at frames 1497..1499: positions past a 1024-frame table.
  const auto& mem = *session.memory();
  EXPECT_EQ(mem.region_ids("recent").back(), "chunk:499");
  EXPECT_EQ(mem.window().pos(0).select(1, 0).max().item<int64_t>(), 1499);
  EXPECT_EQ(mem.bank().size(), 500u - 2u);
  for (auto& im : {run.frames.front(), run.frames.back()}) {
    ASSERT_EQ(im.width, 64);
    ASSERT_EQ(im.height, 64);
  }
  std::printf("1500-frame rollout (1 sampler step): %.1f s, %.1f frames/s\n", s, 1500 / s);
}

TEST(Rollout, PoliciesShareTheNoiseUntilTheirWindowsDiffer) {
  // Up to the first eviction every policy has the same window, so with the same seed the first
  // chunks must be identical frame for frame; sessions are deterministic in their seed.
  dit::CausalDit model = tiny_model();
  const world::Episode ep = long_walk(30);
  std::vector<EpisodeRun> runs;
  for (auto p : {worldkv::Policy::FullKv, worldkv::Policy::SlidingWindow, worldkv::Policy::WorldKv}) {
    SessionConfig sc;
    sc.memory.policy = p;
    auto session = tiny_session(model, sc, {1.0, 0.5});
    runs.push_back(run_episode(*session, ep, 9, 0));
  }
  for (int f = 0; f < 15; ++f)  // chunks 0..4 fit every window
    for (size_t r = 1; r < runs.size(); ++r) EXPECT_EQ(runs[r].frames[f].rgb, runs[0].frames[f].rgb) << f;
  auto again = tiny_session(model, SessionConfig{}, {1.0, 0.5});
  EpisodeRun rerun = run_episode(*again, ep, 9, 0);
  for (int f = 0; f < 30; ++f) EXPECT_EQ(rerun.frames[f].rgb, runs[2].frames[f].rgb) << f;
}

TEST(Rollout, TheModelSeesTheWorldsPosesAndActionsUnchanged) {
  // The world speaks degrees, the session radians, the DiT's float32 inputs degrees again: the
  // adapter must hand the model exactly the numbers the world integrated, and the memory the
  // same pose in radians.
  const world::Suite suite = world::load_or_generate_suite(std::string(WM_SOURCE_DIR) + "/assets/suites/revisit60.json");
  size_t checked = 0;
  for (size_t e = 0; e < 10 && e < suite.episodes.size(); ++e) {
    const world::Episode& ep = suite.episodes[e];
    const at::Tensor p = worldkv::pose_tensor(model_poses(ep.poses));
    const at::Tensor a = worldkv::action_tensor(model_actions(ep.actions), 5);
    auto pa = p.accessor<float, 2>();
    auto aa = a.accessor<float, 2>();
    for (size_t f = 0; f < ep.poses.size(); ++f, ++checked) {
      const world::Pose& wp = ep.poses[f];
      ASSERT_EQ(pa[f][0], static_cast<float>(wp.x)) << ep.name << " frame " << f;
      ASSERT_EQ(pa[f][1], static_cast<float>(wp.y)) << ep.name << " frame " << f;
      ASSERT_EQ(pa[f][2], static_cast<float>(wp.yaw_deg)) << ep.name << " frame " << f;
      const world::Action& wa = ep.actions[f];
      ASSERT_EQ(aa[f][0], wa.forward > 0 ? 1.f : 0.f);
      ASSERT_EQ(aa[f][1], wa.forward < 0 ? 1.f : 0.f);
      ASSERT_EQ(aa[f][2], wa.strafe < 0 ? 1.f : 0.f);
      ASSERT_EQ(aa[f][3], wa.strafe > 0 ? 1.f : 0.f);
      ASSERT_EQ(aa[f][4], static_cast<float>(wa.dyaw_deg)) << ep.name << " frame " << f;
      const worldkv::Pose mp = model_pose(wp);
      EXPECT_EQ(mp.yaw, wp.yaw_deg * (3.14159265358979323846 / 180.0));
      EXPECT_EQ(mp.pitch, wp.pitch_deg * (3.14159265358979323846 / 180.0));
      EXPECT_EQ(mp.z, 0.0);
    }
  }
  EXPECT_GT(checked, 1000u);
}

TEST(Rollout, EpisodesDriveTheSessionInTheModelsTerms) {
  // run_episode converts the world's poses at the session's edge: the memory's chunk poses are
  // the means of the converted poses.
  auto owned = tiny_session(tiny_model(), SessionConfig{}, {1.0});
  WorldSession& session = *owned;
  const world::Episode ep = long_walk(30);
  int calls = 0;
  const EpisodeRun run = run_episode(session, ep, 1, 0, [&](const ChunkOutput& c, const EpisodeRun& so_far) {
    // Each chunk's output as the session made it, the memory's size right after it.
    EXPECT_EQ(c.index, calls++);
    EXPECT_EQ(c.frames.size(), 3u);
    EXPECT_EQ(so_far.frames.size(), 3u * calls);
    EXPECT_EQ(&so_far.chunks.back(), &c);
    EXPECT_EQ(c.window_bytes, session.memory()->window_bytes());
    for (int t = 0; t < 3; ++t) EXPECT_EQ(c.bank_bytes[t], session.memory()->bank().bytes(static_cast<Tier>(t)));
  });
  ASSERT_EQ(run.chunks.size(), 10u);
  EXPECT_TRUE(run.chunks[0].prompt);
  EXPECT_EQ(run.frames.size(), 30u);
  for (auto& c : run.chunks) EXPECT_TRUE(c.frames.empty());  // moved into run.frames
  const auto& bank = run.chunks.back().bank_bytes;
  EXPECT_GT(bank[0] + bank[1] + bank[2], 0u);  // 8 chunks banked
  const auto& poses = session.memory()->chunk_poses();
  ASSERT_EQ(poses.size(), 10u);
  for (int c = 0; c < 10; ++c) {
    const worldkv::Pose want = worldkv::mean_pose(
        model_poses(std::vector<world::Pose>(ep.poses.begin() + 3 * c, ep.poses.begin() + 3 * c + 3)));
    EXPECT_EQ(poses[c].x, want.x);
    EXPECT_EQ(poses[c].y, want.y);
    EXPECT_EQ(poses[c].yaw, want.yaw);
  }
}

// A training sample's context is the window the memory lays out for its target: the sink, then
// retrieved chunks (as many as the region holds, from the bank), then recent, then the target.
void expect_window_shaped(const train::Sample& a, const worldkv::WindowChunks& w) {
  const int S = static_cast<int>(a.chunks.size()), n_sink = static_cast<int>(w.sink.size()),
            n_recent = static_cast<int>(w.recent.size());
  ASSERT_EQ(S, n_sink + (a.retrieved_end - a.retrieved_begin) + n_recent + 1);
  EXPECT_EQ(std::vector<int64_t>(a.chunks.begin(), a.chunks.begin() + n_sink), w.sink);
  EXPECT_EQ(std::vector<int64_t>(a.chunks.end() - 1 - n_recent, a.chunks.end() - 1), w.recent);
  const int n_retrieved = a.retrieved_end - a.retrieved_begin;
  EXPECT_EQ(n_retrieved, std::min<int>(w.retrieved_slots, static_cast<int>(w.banked.size())));
  if (n_retrieved > 0) EXPECT_EQ(a.retrieved_begin, n_sink);
  for (int i = a.retrieved_begin; i < a.retrieved_end; ++i)
    EXPECT_NE(std::find(w.banked.begin(), w.banked.end(), a.chunks[i]), w.banked.end()) << a.chunks[i];
}

TEST(TrainData, SamplesAreWindowShapedAndDeterministic) {
  dit::DitConfig cfg = dit::load_config(std::string(WM_SOURCE_DIR) + "/configs/tiny.json");
  auto codec = dit::make_codec(cfg);
  train::SampleOptions so;
  so.revisit_prob = 1.0;
  so.random_ctx_prob = 0.0;
  int revisits = 0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    train::Sample a = train::make_sample(seed, cfg, *codec, so), b = train::make_sample(seed, cfg, *codec, so);
    EXPECT_TRUE(a.latents.equal(b.latents));
    EXPECT_EQ(a.chunks, b.chunks);
    ASSERT_GE(a.chunks.size(), 1u);
    EXPECT_LE(a.chunks.size(), 6u);  // sink + 3 retrieved + recent + target
    EXPECT_TRUE(std::is_sorted(a.chunks.begin(), a.chunks.end()));
    EXPECT_EQ(a.latents.size(0), static_cast<int64_t>(a.chunks.size()) * cfg.frames_per_chunk);
    expect_window_shaped(a, worldkv::window_chunks(train::window_config(so, cfg, false), a.chunks.back()));
    if (a.revisit) {
      ++revisits;
      EXPECT_NE(std::find(a.chunks.begin(), a.chunks.end(), a.first_visit_chunk), a.chunks.end());
    }
  }
  EXPECT_GT(revisits, 0);
  // Sliding-window samples: the chunks just before the target, consecutive, no sink past the
  // window's reach (the default sizes: 5 chunks).
  so.sliding_prob = 1.0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    train::Sample a = train::make_sample(seed, cfg, *codec, so);
    const int target = a.chunks.back(), n = static_cast<int>(a.chunks.size());
    EXPECT_EQ(n, std::min(target, 5) + 1);
    for (int i = 0; i < n; ++i) EXPECT_EQ(a.chunks[i], target - (n - 1) + i);
    expect_window_shaped(a, worldkv::window_chunks(train::window_config(so, cfg, true), target));
    if (a.revisit) EXPECT_NE(std::find(a.chunks.begin(), a.chunks.end(), a.first_visit_chunk), a.chunks.end());
  }
  // The window follows the memory's config: two sink chunks and worldkv_c filling its
  // retrieved region by tokens (9 frames of 64 tokens over 64 + ceil(0.25 * 128) = 96 tokens a
  // compressed chunk: 6 retrieved chunks).
  so.sliding_prob = 0.0;
  so.random_ctx_prob = 0.5;
  so.memory.sink_frames = 6;
  so.memory.policy = worldkv::Policy::WorldKvC;
  so.memory.fill_by_tokens = true;
  ASSERT_EQ(worldkv::window_chunks(train::window_config(so, cfg, false), 20).retrieved_slots, 6);
  int full = 0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    train::Sample a = train::make_sample(seed, cfg, *codec, so);
    const worldkv::WindowChunks w = worldkv::window_chunks(train::window_config(so, cfg, false), a.chunks.back());
    expect_window_shaped(a, w);
    if (w.banked.size() >= 6) {
      ++full;
      EXPECT_EQ(a.retrieved_end - a.retrieved_begin, 6);
      EXPECT_EQ(std::vector<int>(a.chunks.begin(), a.chunks.begin() + 2), (std::vector<int>{0, 1}));
    }
  }
  EXPECT_GT(full, 0);
  so = train::SampleOptions{};
  so.revisit_prob = 1.0;
  so.random_ctx_prob = 0.0;
  // Compressed retrieved chunks: later queries see the anchor frame and ceil(0.25 n) of the
  // other tokens, the least similar to the anchor's mean; the chunk itself and earlier ones see
  // everything.
  so.sliding_prob = 0.0;
  bool checked = false;
  for (uint64_t seed = 0; seed < 12 && !checked; ++seed) {
    train::Sample a = train::make_sample(seed, cfg, *codec, so);
    if (a.retrieved_end - a.retrieved_begin < 2) continue;
    checked = true;
    const int S = static_cast<int>(a.chunks.size()), F = cfg.frames_per_chunk, P = cfg.tokens_per_frame(), tpc = F * P;
    at::Tensor bias = dit::chunk_visibility_bias(train::visibility(S, 2), tpc, at::kCPU);
    at::Tensor before = bias.clone();
    train::hide_compressed_tokens(bias, a, cfg, 0.25);
    const int64_t rest = (F - 1) * P, kept = (rest + 3) / 4;
    for (int c = a.retrieved_begin; c < a.retrieved_end; ++c) {
      const int64_t c0 = static_cast<int64_t>(c) * tpc;
      at::Tensor last_row = bias[bias.size(0) - 1].narrow(0, c0, tpc);  // the target's query row
      EXPECT_TRUE(last_row.narrow(0, 0, P).eq(0).all().item<bool>());   // anchor frame whole
      at::Tensor vis = last_row.narrow(0, P, rest).isfinite();
      EXPECT_EQ(vis.sum().item<int64_t>(), kept);
      // The kept ones are the least similar to the anchor frame's mean patch.
      at::Tensor x = a.latents.narrow(0, c * F, F);
      at::Tensor tok = x.reshape({F, x.size(1), cfg.grid_h(), cfg.patch_h, cfg.grid_w(), cfg.patch_w})
                           .permute({0, 2, 4, 1, 3, 5}).reshape({F * P, -1});
      at::Tensor sim = at::cosine_similarity(tok.narrow(0, P, rest), tok.narrow(0, 0, P).mean(0, true), 1);
      EXPECT_LE(sim.masked_select(vis).max().item<float>(), sim.masked_select(vis.logical_not()).min().item<float>());
      // Its own rows and earlier ones see it as before.
      EXPECT_TRUE(bias.narrow(0, 0, c0 + tpc).narrow(1, c0, tpc).equal(before.narrow(0, 0, c0 + tpc).narrow(1, c0, tpc)));
    }
  }
  EXPECT_TRUE(checked);
  // Teacher forcing: noisy copies see the clean chunks before them and themselves only.
  at::Tensor v = train::visibility(4, 2);  // 3 clean + 2 noisy
  EXPECT_TRUE(v[3].equal(at::tensor({1, 1, 0, 1, 0}).to(at::kBool)));  // noisy chunk 2
  EXPECT_TRUE(v[4].equal(at::tensor({1, 1, 1, 0, 1}).to(at::kBool)));  // noisy chunk 3 (target)
  EXPECT_TRUE(v[1].equal(at::tensor({1, 1, 0, 0, 0}).to(at::kBool)));  // clean chunk 1
}

}  // namespace
}  // namespace wm::rollout
