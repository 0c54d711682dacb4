// The causal DiT: config parsing, the block-causal mask, chunk vs sequence agreement (outputs
// and refill K/V), teacher-forcing masks, safetensors round trip and errors, the
// matrix-game-2 size with 2 layers.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>
#include <nlohmann/json.hpp>

#include "dit/config.h"
#include "dit/model.h"
#include "dit/weights.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/rope.h"
#include "runtime/safetensors.h"
#include "runtime/window.h"
#include "tests/temp_dir.h"

namespace wm::dit {
namespace {

// A very small model: 2 layers, dim 64, 2 heads of 32 (RoPE 12/10/10), 6 tokens per frame.
DitConfig small_config() {
  nlohmann::json j = {{"name", "small"},       {"dim", 64},
                      {"n_layers", 2},         {"n_heads", 2},
                      {"ffn_dim", 128},        {"latent_channels", 12},
                      {"latent_size", {4, 6}}, {"frames_per_chunk", 3},
                      {"codec", {{"kind", "pixel_patch"}, {"stride", 2}}},
                      {"conditioning", {{"action_dim", 5}, {"pos_bands", 2}, {"yaw_harmonics", 2}}}};
  return config_from_json(j, "small_config");
}

// The same with the yaw rotary: RoPE 12/6/6 leaves 8 channels for 4 yaw pairs.
DitConfig small_yaw_config() {
  nlohmann::json j = config_to_json(small_config());
  j["rope"]["split"] = {12, 6, 6};
  j["conditioning"]["yaw_rope_pairs"] = 4;
  j["name"] = "small_yaw";
  return config_from_json(j, "small_yaw_config");
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

struct Data {
  at::Tensor x, t;
  FrameCond cond;
};

Data random_data(const DitConfig& c, int64_t T, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  Data d;
  d.x = at::randn({T, c.latent_channels, c.latent_height, c.latent_width}, g);
  d.t = at::rand({T}, g);
  d.cond.pose = at::randn({T, 3}, g) * 4;
  d.cond.action = at::rand({T, c.cond.action_dim}, g);
  return d;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

TEST(DitConfig, ParsesShippedConfigs) {
  DitConfig mg = load_config(std::string(WM_SOURCE_DIR) + "/configs/matrix-game-2.json");
  EXPECT_EQ(mg.dim, 1536);
  EXPECT_EQ(mg.n_layers, 30);
  EXPECT_EQ(mg.head_dim, 128);
  EXPECT_EQ(mg.tokens_per_frame(), 880);
  EXPECT_EQ(mg.rope.axes[0].channels, 44);
  EXPECT_EQ(mg.rope.axes[1].channels, 42);
  EXPECT_EQ(mg.rope.axes[2].channels, 42);
  // The default split is Wan's.
  EXPECT_EQ(RopeSpec::video3d(128).axes[0].channels, 44);

  DitConfig tiny = load_config(std::string(WM_SOURCE_DIR) + "/configs/tiny.json");
  EXPECT_EQ(tiny.tokens_per_frame(), 64);
  EXPECT_EQ(tiny.latent_channels, 48);
  // Round trip through JSON.
  DitConfig back = config_from_json(config_to_json(tiny), "round trip");
  EXPECT_EQ(config_to_json(back), config_to_json(tiny));
  // The head's prediction: tiny.json's "x0", tiny-v.json's "v", written back as given.
  EXPECT_EQ(tiny.prediction, Prediction::X0);
  EXPECT_EQ(back.prediction, Prediction::X0);
  EXPECT_EQ(config_to_json(tiny)["prediction"], "x0");
  EXPECT_EQ(load_config(std::string(WM_SOURCE_DIR) + "/configs/tiny-v.json").prediction, Prediction::V);
}

TEST(DitConfig, ErrorsNameFileAndField) {
  nlohmann::json j = config_to_json(small_config());
  j["dim"] = "wide";
  std::string m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("bad.json"), std::string::npos) << m;
  EXPECT_NE(m.find("'dim'"), std::string::npos) << m;

  j = config_to_json(small_config());
  j["n_heads"] = 3;  // 64 % 3 != 0
  m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("n_heads"), std::string::npos) << m;

  j = config_to_json(small_config());
  j["conditioning"]["colour"] = 1;
  m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("colour"), std::string::npos) << m;

  j = config_to_json(small_config());
  j.erase("ffn_dim");
  m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("ffn_dim"), std::string::npos) << m;

  j = config_to_json(small_config());
  j["prediction"] = "eps";
  m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("bad.json: DitConfig '"), std::string::npos) << m;
  EXPECT_NE(m.find("field 'prediction': must be \"v\" or \"x0\", got \"eps\""), std::string::npos) << m;

  // Integers are range-checked, never truncated: 2^32 + 64 is not read as 64.
  j = config_to_json(small_config());
  j["dim"] = (int64_t{1} << 32) + 64;
  m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("'dim'"), std::string::npos) << m;
  EXPECT_NE(m.find("out of range"), std::string::npos) << m;
  j = config_to_json(small_config());
  j["n_layers"] = 2.7;  // not 2
  m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("'n_layers'"), std::string::npos) << m;
  j = config_to_json(small_config());
  j["latent_size"] = nlohmann::json::array({8, -(int64_t{1} << 40)});
  m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("'latent_size'"), std::string::npos) << m;
  j = config_to_json(small_config());
  j["ffn_dim"] = 1 << 30;  // fits an int, far past any real model: rejected before allocation
  m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("'ffn_dim'"), std::string::npos) << m;
  j = config_to_json(small_config());
  j["eps"] = "tiny";
  m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("'eps'"), std::string::npos) << m;
  j = config_to_json(small_config());
  j["qk_norm"] = 1;
  m = message_of([&] { config_from_json(j, "bad.json"); });
  EXPECT_NE(m.find("'qk_norm'"), std::string::npos) << m;

  m = message_of([&] { load_config("/nonexistent/x.json"); });
  EXPECT_NE(m.find("/nonexistent/x.json"), std::string::npos) << m;
}

// An x0 head returns the velocity that takes x_t to its output: with the same weights, the x0
// model's velocity is (x_t - the v model's raw output) / t, per frame, in the chunk and the
// sequence paths alike.
TEST(DitModel, X0HeadReturnsTheVelocityOfItsOutput) {
  at::NoGradGuard ng;
  DitConfig cv = small_config(), cx = small_config();
  cx.prediction = Prediction::X0;
  CausalDit mv(cv), mx(cx);
  mv->init_weights(21);
  mx->init_weights(21);
  Data d = random_data(cv, 2 * cv.frames_per_chunk, 22);
  d.t = d.t * 0.9 + 0.1;
  const int64_t F = cv.frames_per_chunk;
  at::Tensor x = d.x.narrow(0, 0, F), t = d.t.narrow(0, 0, F);
  FrameCond c = d.cond.slice(0, F);
  at::Tensor want = (x - mv->forward_chunk(x, t, c, 4, nullptr)) / t.view({-1, 1, 1, 1});
  EXPECT_LT(max_abs_diff(mx->forward_chunk(x, t, c, 4, nullptr), want), 1e-4);
  at::Tensor want_seq = (d.x - mv->forward_sequence(d.x, d.t, d.cond)) / d.t.view({-1, 1, 1, 1});
  EXPECT_LT(max_abs_diff(mx->forward_sequence(d.x, d.t, d.cond), want_seq), 1e-4);
  // So an Euler step to t = 0 lands on the head's output exactly.
  at::Tensor x0 = x - t.view({-1, 1, 1, 1}) * mx->forward_chunk(x, t, c, 4, nullptr);
  EXPECT_LT(max_abs_diff(x0, mv->forward_chunk(x, t, c, 4, nullptr)), 1e-4);
  // At t = 0 (clean context, refill) the division is bounded: finite velocities.
  EXPECT_TRUE(mx->forward_chunk(x, at::scalar_tensor(0.0), c, 4, nullptr).isfinite().all().item<bool>());
}

TEST(DitModel, ParameterNamesMirrorWan) {
  CausalDit m(small_config());
  auto p = m->named_parameters(true);
  for (const char* n : {"patch_embedding.weight", "time_embedding.0.weight", "time_embedding.2.weight",
                        "time_projection.1.weight", "blocks.1.self_attn.q.weight", "blocks.1.self_attn.norm_k.weight",
                        "blocks.0.ffn.0.weight", "blocks.0.ffn.2.bias", "blocks.0.modulation", "head.head.weight",
                        "head.modulation", "pose_embedding.2.weight", "action_embedding.0.weight",
                        "ray_embedding.0.weight"})
    EXPECT_TRUE(p.contains(n)) << n;
  EXPECT_EQ(p["patch_embedding.weight"].sizes(), at::IntArrayRef({64, 12, 1, 2, 2}));
  EXPECT_EQ(p["blocks.0.modulation"].sizes(), at::IntArrayRef({1, 6, 64}));
}

// Changing a later chunk never changes an earlier chunk's output (exactly), batch 2.
TEST(DitModel, SequenceIsBlockCausal) {
  at::NoGradGuard ng;
  const DitConfig c = small_config();
  CausalDit m(c);
  m->init_weights(1);
  const int64_t F = c.frames_per_chunk, N = 3;
  Data a = random_data(c, N * F, 2);
  at::Tensor x = at::stack({a.x, a.x * 0.5});  // [2, T, C, h, w]
  at::Tensor t = at::stack({a.t, a.t.flip(0)});
  FrameCond cond{at::stack({a.cond.pose, a.cond.pose}), at::stack({a.cond.action, a.cond.action})};
  at::Tensor out = m->forward_sequence(x, t, cond);
  ASSERT_EQ(out.sizes(), x.sizes());

  at::Tensor x2 = x.clone(), t2 = t.clone();
  x2.narrow(1, 2 * F, F).normal_();
  t2.narrow(1, 2 * F, F).fill_(0.9);
  FrameCond cond2{cond.pose.clone(), cond.action.clone()};
  cond2.pose.narrow(1, 2 * F, F).add_(3.0);
  at::Tensor out2 = m->forward_sequence(x2, t2, cond2);
  EXPECT_TRUE(at::equal(out.narrow(1, 0, 2 * F), out2.narrow(1, 0, 2 * F)));
  EXPECT_FALSE(at::equal(out.narrow(1, 2 * F, F), out2.narrow(1, 2 * F, F)));

  x2.narrow(1, F, F).normal_();
  at::Tensor out3 = m->forward_sequence(x2, t2, cond2);
  EXPECT_TRUE(at::equal(out.narrow(1, 0, F), out3.narrow(1, 0, F)));
  EXPECT_FALSE(at::equal(out.narrow(1, F, F), out3.narrow(1, F, F)));

  // The unbatched form is the same computation.
  at::Tensor o1 = m->forward_sequence(a.x, a.t, a.cond);
  EXPECT_LT(max_abs_diff(o1, out[0]), 1e-5);
}

// Streaming chunk by chunk (t = 0 refill of each chunk into the window) reproduces the
// sequence pass: the outputs and every layer's K/V, for each chunk.
TEST(DitModel, ChunkRefillMatchesSequence) {
  at::NoGradGuard ng;
  for (const DitConfig& c : {small_config(), small_yaw_config()}) {
  SCOPED_TRACE(c.name);
  CausalDit m(c);
  m->init_weights(3);
  const int64_t F = c.frames_per_chunk, N = 3, P = c.tokens_per_frame();
  Data d = random_data(c, N * F, 4);
  at::Tensor t0 = at::zeros({N * F});
  std::vector<LayerKv> kv_seq;
  SequenceOptions so;
  so.kv_out = &kv_seq;
  at::Tensor seq = m->forward_sequence(d.x, t0, d.cond, so);
  ASSERT_EQ(kv_seq.size(), size_t(c.n_layers));
  ASSERT_EQ(kv_seq[0].k.sizes(), at::IntArrayRef({c.n_heads, N * F * P, c.head_dim}));

  KvWindow win(m->kv_spec(at::kCPU), {"ctx"});
  double worst_out = 0, worst_kv = 0;
  for (int64_t i = 0; i < N; ++i) {
    std::vector<LayerKv> kv;
    at::Tensor out = m->forward_chunk(d.x.narrow(0, i * F, F), at::scalar_tensor(0.0), d.cond.slice(i * F, F), i * F,
                                      &win, &kv);
    worst_out = std::max(worst_out, max_abs_diff(out, seq.narrow(0, i * F, F)));
    ASSERT_EQ(kv.size(), size_t(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l) {
      worst_kv = std::max(worst_kv, max_abs_diff(kv[l].k, kv_seq[l].k.narrow(1, i * F * P, F * P)));
      worst_kv = std::max(worst_kv, max_abs_diff(kv[l].v, kv_seq[l].v.narrow(1, i * F * P, F * P)));
      EXPECT_TRUE(at::equal(kv[l].pos, kv_seq[l].pos.narrow(0, i * F * P, F * P)));
    }
    Block b;
    b.id = "chunk:" + std::to_string(i);
    b.layers = kv;
    win.place("ctx", b);
  }
  EXPECT_LT(worst_out, 1e-5);
  EXPECT_LT(worst_kv, 1e-5);
  std::printf("[ info ] %s: chunk vs sequence: max |out diff| %.2e, max |K/V diff| %.2e\n", c.name.c_str(),
              worst_out, worst_kv);
  // Positions: t = absolute frame, h = row, w = column.
  EXPECT_EQ(kv_seq[0].pos[P + 4][0].item<int64_t>(), 1);
  EXPECT_EQ(kv_seq[0].pos[P + 4][1].item<int64_t>(), 1);
  EXPECT_EQ(kv_seq[0].pos[P + 4][2].item<int64_t>(), 1);
  }
}

// A chunk's refill keys moved in time by re-anchoring equal the keys the model computes at the
// new frame, with the yaw rotary (world-absolute, so left alone by re-anchoring) on the channels
// after the (t, h, w) RoPE. This is what worldkv's re-anchored placement relies on.
TEST(DitModel, ReanchoredRefillKeysEqualKeysAtTheNewFrame) {
  at::NoGradGuard ng;
  const DitConfig c = small_yaw_config();
  CausalDit m(c);
  m->init_weights(5);
  const int64_t F = c.frames_per_chunk;
  Data d = random_data(c, F, 6);
  auto refill = [&](int64_t first_frame) {
    std::vector<LayerKv> kv;
    m->forward_chunk(d.x, at::scalar_tensor(0.0), d.cond, first_frame, nullptr, &kv);
    return kv;
  };
  const std::vector<LayerKv> at_900 = refill(900), at_12 = refill(12);
  double worst = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    at::Tensor moved = reanchor(at_900[l].k, c.rope, /*axis=*/0, 12 - 900);
    worst = std::max(worst, max_abs_diff(moved, at_12[l].k));
    EXPECT_LT(max_abs_diff(at_900[l].v, at_12[l].v), 1e-5);
  }
  EXPECT_LT(worst, 1e-4);
  // The yaw channels carry the pose: the same chunk seen from another yaw has other keys there.
  Data turned = d;
  turned.cond.pose = d.cond.pose.clone();
  turned.cond.pose.select(1, 2).add_(40.0);
  std::vector<LayerKv> kv_turned;
  m->forward_chunk(turned.x, at::scalar_tensor(0.0), turned.cond, 12, nullptr, &kv_turned);
  const int64_t rot = c.rope.rotated_channels();
  EXPECT_GT(max_abs_diff(kv_turned[0].k.narrow(-1, rot, 2 * c.cond.yaw_rope_pairs),
                         at_12[0].k.narrow(-1, rot, 2 * c.cond.yaw_rope_pairs)), 1e-2);
  std::printf("[ info ] re-anchored refill keys (900 -> 12): max |diff| %.2e\n", worst);
}

// Teacher forcing in one pass ([clean ; noisy] with the visibility helper) equals denoising
// each noisy chunk over a window holding the clean earlier chunks.
TEST(DitModel, TeacherForcingMatchesChunkOverCleanWindow) {
  at::NoGradGuard ng;
  const DitConfig c = small_config();
  CausalDit m(c);
  m->init_weights(5);
  const int64_t F = c.frames_per_chunk, N = 3, T = N * F, P = c.tokens_per_frame();
  Data clean = random_data(c, T, 6);
  Data noisy = random_data(c, T, 7);
  SequenceOptions so;
  at::Tensor fi = at::arange(T, at::TensorOptions().dtype(at::kLong));
  so.frame_index = at::cat({fi, fi});
  so.attn_bias = chunk_visibility_bias(teacher_forcing_visibility(N), F * P, at::kCPU);
  FrameCond cond{at::cat({clean.cond.pose, clean.cond.pose}), at::cat({clean.cond.action, clean.cond.action})};
  at::Tensor out = m->forward_sequence(at::cat({clean.x, noisy.x}), at::cat({at::zeros({T}), noisy.t}), cond, so);

  KvWindow win(m->kv_spec(at::kCPU), {"ctx"});
  double worst = 0;
  for (int64_t i = 0; i < N; ++i) {
    at::Tensor v = m->forward_chunk(noisy.x.narrow(0, i * F, F), noisy.t.narrow(0, i * F, F),
                                    clean.cond.slice(i * F, F), i * F, &win);
    worst = std::max(worst, max_abs_diff(v, out.narrow(0, T + i * F, F)));
    std::vector<LayerKv> kv;
    m->forward_chunk(clean.x.narrow(0, i * F, F), at::scalar_tensor(0.0), clean.cond.slice(i * F, F), i * F, &win,
                     &kv);
    Block b;
    b.id = "chunk:" + std::to_string(i);
    b.layers = kv;
    win.place("ctx", b);
  }
  EXPECT_LT(worst, 1e-5);
  std::printf("[ info ] teacher forcing vs chunk over clean window: max |diff| %.2e\n", worst);
}

TEST(DitModel, BackwardReachesEveryParameter) {
  const DitConfig c = small_config();
  CausalDit m(c);
  m->init_weights(8);
  Data d = random_data(c, 2 * c.frames_per_chunk, 9);
  at::Tensor out = m->forward_sequence(d.x, d.t, d.cond);
  out.pow(2).mean().backward();
  for (const auto& p : m->named_parameters(true)) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
  }
}

// The training pass through the core's attention equals the same pass through a plain dense
// attention written here (float64 softmax of q k^T / sqrt(d) plus the block-causal mask, the
// log-weights or the caller's bias): the outputs and the gradients of a random linear loss (the
// input, every parameter, log-weights that require grad), batch 2, with and without the yaw
// rotary. Both passes share everything else, so the differences are the attention's rounding.
TEST(DitModel, SequenceMatchesPlainReferenceAttention) {
  for (const DitConfig& c : {small_config(), small_yaw_config()}) {
    SCOPED_TRACE(c.name);
    CausalDit m(c);
    m->init_weights(20);
    const int64_t F = c.frames_per_chunk, T = 3 * F, P = c.tokens_per_frame(), n = T * P;
    Data a = random_data(c, T, 21);
    at::Generator g = at::detail::createCPUGenerator(22);
    const at::Tensor x = at::stack({a.x, a.x.flip(0)});
    const at::Tensor t = at::stack({a.t, a.t.flip(0)}) * 0.8 + 0.2;  // away from 0: the x0 head divides by t
    const FrameCond cond{at::stack({a.cond.pose, a.cond.pose.flip(0)}), at::stack({a.cond.action, a.cond.action})};
    const at::Tensor w = at::randn(x.sizes(), g);
    const double inf = std::numeric_limits<double>::infinity();
    // Token j hidden from token i iff j's block of F frames comes after i's.
    at::Tensor blk = at::arange(n, at::TensorOptions().dtype(at::kLong)).div(F * P, "floor");
    const at::Tensor block_causal =
        at::zeros({n, n}, at::kDouble).masked_fill_(blk.unsqueeze(0) > blk.unsqueeze(1), -inf);
    // A visibility of single frames for the first sequence and a random one (each frame sees
    // itself) for the second, with finite random values on top: a bias no mask kind expresses.
    at::Tensor vis = at::rand({T, T}, g).lt(0.5).logical_or(at::eye(T, at::TensorOptions().dtype(at::kBool)));
    const at::Tensor dense = at::stack({chunk_visibility_bias(at::ones({T, T}, at::kBool).tril(), P, at::kCPU),
                                        chunk_visibility_bias(vis, P, at::kCPU) + at::randn({n, n}, g) * 0.5})
                                 .unsqueeze(1);
    const at::Tensor logw = at::rand({n}, g) - 0.5;

    struct Pass {
      at::Tensor out, dx, dlogw;
      std::vector<at::Tensor> dparams;
    };
    // variant 0: block-causal; 1: log-weights that require grad; 2: the dense [B, 1, n, n] bias
    // with log-weights that do not.
    auto pass = [&](int variant, bool reference) {
      m->zero_grad();
      at::Tensor xi = x.clone().requires_grad_();
      at::Tensor lw = logw.clone().requires_grad_(variant == 1);
      SequenceOptions so;
      if (variant >= 1) so.key_logw = lw;
      if (variant == 2) so.attn_bias = dense;
      if (reference) {
        at::Tensor bias = variant == 2 ? dense.to(at::kDouble) : block_causal;
        if (variant >= 1) bias = bias + lw.to(at::kDouble);
        so.attention = [bias](int, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
          at::Tensor s = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-1, -2)) /
                         std::sqrt(static_cast<double>(q.size(-1)));
          return at::matmul(at::softmax(s + bias, -1), v.to(at::kDouble)).to(q.scalar_type());
        };
      }
      Pass r;
      r.out = m->forward_sequence(xi, t, cond, so);
      (r.out * w).sum().backward();
      r.out = r.out.detach();
      r.dx = xi.grad();
      if (variant == 1) r.dlogw = lw.grad();
      for (const auto& p : m->parameters()) r.dparams.push_back(p.grad().clone());
      return r;
    };
    // Largest difference relative to the reference's largest magnitude (at least 1).
    auto rel = [](const at::Tensor& got, const at::Tensor& want) {
      return max_abs_diff(got, want) / std::max(1.0, want.abs().max().item<double>());
    };
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(variant);
      const Pass got = pass(variant, false), want = pass(variant, true);
      double worst_param = 0;
      for (size_t i = 0; i < want.dparams.size(); ++i)
        worst_param = std::max(worst_param, rel(got.dparams[i], want.dparams[i]));
      EXPECT_LT(rel(got.out, want.out), 1e-5);
      EXPECT_LT(rel(got.dx, want.dx), 1e-5);
      EXPECT_LT(worst_param, 1e-5);
      if (variant == 1) {
        ASSERT_TRUE(got.dlogw.defined());
        EXPECT_GT(got.dlogw.abs().sum().item<double>(), 0.0);
        EXPECT_LT(rel(got.dlogw, want.dlogw), 1e-5);
      }
      std::printf("[ info ] %s variant %d vs reference attention: out %.2e, dx %.2e, dparams %.2e (relative)\n",
                  c.name.c_str(), variant, rel(got.out, want.out), rel(got.dx, want.dx), worst_param);
    }
    // The reference is sensitive to the mask: without it the outputs differ.
    SequenceOptions open;
    open.attention = [](int, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      return at::matmul(at::softmax(at::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(q.size(-1))), -1), v);
    };
    at::NoGradGuard ng;
    EXPECT_GT(max_abs_diff(m->forward_sequence(x, t, cond, open), m->forward_sequence(x, t, cond)), 1e-3);
  }
}

// A folder of its own per test (mkdtemp), removed after it.
class DitWeights : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = wm::testing::make_temp_dir("wm_dit_weights_"); }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) { return (dir_ / ("dit_" + name + ".safetensors")).string(); }
  std::filesystem::path dir_;
};

TEST_F(DitWeights, RoundTripGivesIdenticalOutputs) {
  at::NoGradGuard ng;
  const DitConfig c = small_config();
  CausalDit a(c), b(c);
  a->init_weights(10);
  b->init_weights(11);
  const std::string f = path("roundtrip");
  save_weights(*a, f);
  load_weights(*b, f);
  Data d = random_data(c, c.frames_per_chunk, 12);
  EXPECT_TRUE(at::equal(a->forward_chunk(d.x, d.t, d.cond, 5, nullptr), b->forward_chunk(d.x, d.t, d.cond, 5, nullptr)));
  // The config travels in the metadata.
  EXPECT_EQ(config_to_json(config_from_weights(f)), config_to_json(c));
  CausalDit m = load_model(f, at::kCPU);
  EXPECT_TRUE(at::equal(m->forward_chunk(d.x, d.t, d.cond, 5, nullptr), a->forward_chunk(d.x, d.t, d.cond, 5, nullptr)));
  std::remove(f.c_str());
}

TEST_F(DitWeights, ErrorsNameTheTensor) {
  const DitConfig c = small_config();
  CausalDit m(c);
  std::vector<std::pair<std::string, at::Tensor>> ts;
  for (const auto& p : m->named_parameters(true)) ts.emplace_back(p.key(), p.value().detach());

  // Wrong shape.
  auto wrong = ts;
  for (auto& kv : wrong)
    if (kv.first == "blocks.1.ffn.0.weight") kv.second = at::zeros({100, 64});
  const std::string f = path("bad");
  save_safetensors(f, wrong);
  std::string msg = message_of([&] { load_weights(*m, f); });
  EXPECT_NE(msg.find("blocks.1.ffn.0.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[100, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128, 64]"), std::string::npos) << msg;

  // Missing tensor.
  auto missing = ts;
  missing.erase(std::remove_if(missing.begin(), missing.end(), [](auto& kv) { return kv.first == "head.modulation"; }),
                missing.end());
  save_safetensors(f, missing);
  msg = message_of([&] { load_weights(*m, f); });
  EXPECT_NE(msg.find("missing tensor 'head.modulation'"), std::string::npos) << msg;

  // Unexpected tensor (strict), accepted when not strict; a prefix can be stripped.
  auto extra = ts;
  extra.emplace_back("blocks.9.cross_attn.q.weight", at::zeros({2, 2}));
  save_safetensors(f, extra);
  msg = message_of([&] { load_weights(*m, f); });
  EXPECT_NE(msg.find("unexpected tensor 'blocks.9.cross_attn.q.weight'"), std::string::npos) << msg;
  LoadOptions lax;
  lax.strict = false;
  EXPECT_NO_THROW(load_weights(*m, f, lax));

  // Integer weights are rejected by dtype, non-finite ones by value; the model is untouched.
  CausalDit before(c);
  before->init_weights(3);
  at::Tensor probe_before = before->named_parameters(true)["head.modulation"].detach().clone();
  auto ints = ts;
  for (auto& kv : ints)
    if (kv.first == "blocks.0.ffn.0.weight") kv.second = at::zeros(kv.second.sizes(), at::kInt);
  save_safetensors(f, ints);
  msg = message_of([&] { load_weights(*before, f); });
  EXPECT_NE(msg.find("blocks.0.ffn.0.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("floating-point"), std::string::npos) << msg;
  auto nans = ts;
  for (auto& kv : nans)
    if (kv.first == "blocks.1.ffn.0.weight") kv.second = at::full(kv.second.sizes(), NAN);
  save_safetensors(f, nans);
  msg = message_of([&] { load_weights(*before, f); });
  EXPECT_NE(msg.find("blocks.1.ffn.0.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("non-finite"), std::string::npos) << msg;
  auto infs = ts;
  for (auto& kv : infs)
    if (kv.first == "head.modulation") kv.second = kv.second.clone().index_fill_(-1, at::tensor({0L}), INFINITY);
  save_safetensors(f, infs);
  msg = message_of([&] { load_weights(*before, f); });
  EXPECT_NE(msg.find("head.modulation"), std::string::npos) << msg;
  EXPECT_TRUE(at::equal(before->named_parameters(true)["head.modulation"], probe_before));

  auto prefixed = ts;
  for (auto& kv : prefixed) kv.first = "model." + kv.first;
  save_safetensors(f, prefixed);
  LoadOptions strip;
  strip.strip_prefix = "model.";
  EXPECT_NO_THROW(load_weights(*m, f, strip));
  std::remove(f.c_str());
}

// The real Matrix-Game-2.0 layout (dim 1536, 12 heads of 128, 880 tokens per frame), cut to 2
// layers, runs one chunk (3 x 880 tokens) with random weights, then a second over the first. The
// feed-forward's hidden width is cut too (8960 -> 512): it is internal to each token's MLP, shapes
// nothing that is checked here (outputs, K/V, the window), and was three quarters of the linear
// layers' work (17 -> 11 s of CPU; the attention over 2 x 3 x 880 tokens is most of the rest).
TEST(DitModel, MatrixGame2SizeRunsOneChunk) {
  at::NoGradGuard ng;
  DitConfig c = load_config(std::string(WM_SOURCE_DIR) + "/configs/matrix-game-2.json");
  c.n_layers = 2;
  c.ffn_dim = 512;
  CausalDit m(c);
  const int64_t F = c.frames_per_chunk;
  Data d = random_data(c, F, 13);
  KvWindow win(m->kv_spec(at::kCPU), {"recent"});
  auto t0 = std::chrono::steady_clock::now();
  std::vector<LayerKv> kv;
  at::Tensor v = m->forward_chunk(d.x, d.t, d.cond, 0, &win, &kv);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(v.sizes(), d.x.sizes());
  EXPECT_TRUE(v.isfinite().all().item<bool>());
  ASSERT_EQ(kv.size(), 2u);
  EXPECT_EQ(kv[0].k.sizes(), at::IntArrayRef({12, 3 * 880, 128}));
  Block b;
  b.id = "chunk:0";
  b.layers = kv;
  win.place("recent", b);
  at::Tensor v2 = m->forward_chunk(d.x, d.t, d.cond, F, &win);
  EXPECT_TRUE(v2.isfinite().all().item<bool>());
  std::printf("[ info ] matrix-game-2 size, 2 layers, one chunk of 3 x 880 tokens: %.2f s\n", s);
}

}  // namespace
}  // namespace wm::dit
