// The warp reference (CondConfig::warp_reference): the last frame before a chunk, turned by the
// camera's yaw change; a model that reads it; starting such a model from one that does not.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dit/conditioning.h"
#include "dit/config.h"
#include "dit/model.h"
#include "dit/weights.h"
#include "runtime/error.h"

namespace wm::dit {
namespace test_warp_reference {

// A frame whose every channel holds, per column, the world yaw (degrees) of that column's ray
// for a camera at yaw: the quantity a pure turn moves.
at::Tensor ray_yaw_frame(double yaw, const CondConfig& c, int64_t C, int64_t h, int64_t w) {
  at::Tensor off = column_yaw_offsets_deg(c, w).to(at::kFloat) + static_cast<float>(yaw);
  return off.view({1, 1, w}).expand({C, h, w}).contiguous();
}

TEST(WarpReference, NoTurnGivesTheFrameItselfFullyCovered) {
  CondConfig c;
  at::Generator g = at::detail::createCPUGenerator(5);
  at::Tensor src = at::randn({4, 5, 16}, g);
  at::Tensor ref = warp_reference(src, 30.0, at::tensor({30.0, 30.0}, at::kDouble), c);
  ASSERT_EQ(ref.sizes(), at::IntArrayRef({2, 5, 5, 16}));
  for (int f = 0; f < 2; ++f) {
    EXPECT_LT((ref[f].narrow(0, 0, 4) - src).abs().max().item<double>(), 1e-5);
    EXPECT_TRUE(at::equal(ref[f][4], at::ones({5, 16})));
  }
  // 360 degrees on is the same view.
  at::Tensor round = warp_reference(src, 30.0, at::tensor({390.0}, at::kDouble), c);
  EXPECT_LT((round[0].narrow(0, 0, 4) - src).abs().max().item<double>(), 1e-5);
}

TEST(WarpReference, ATurnMovesEachRayToWhereTheNewCameraSeesIt) {
  CondConfig c;  // hfov 90
  const int64_t w = 16;
  const at::Tensor off = column_yaw_offsets_deg(c, w);
  for (double delta : {10.0, -23.5, 44.0}) {
    at::Tensor ref = warp_reference(ray_yaw_frame(5.0, c, 3, 2, w), 5.0, at::tensor({5.0 + delta}, at::kDouble), c)[0];
    int covered = 0;
    for (int64_t j = 0; j < w; ++j) {
      const double want = 5.0 + delta + off[j].item<double>();  // the target column's world yaw
      // The source sees rays within half its field of view of its yaw (to its edge columns' outer edges).
      const bool sees = std::abs(want - 5.0) <= 45.0;
      const float m = ref[3][1][j].item<float>();
      EXPECT_EQ(m, sees ? 1.0f : 0.0f) << "delta " << delta << " column " << j;
      if (!sees) {
        EXPECT_EQ(ref.narrow(0, 0, 3).select(2, j).abs().max().item<float>(), 0.0f);
        continue;
      }
      ++covered;
      // Linear between columns of a smooth function; beyond the outer column centres the edge
      // column's value is held (half a column).
      const double outer = off[w - 1].item<double>();
      const double tol = std::abs(want - 5.0) > outer ? 3.0 : 0.35;
      EXPECT_NEAR(ref[0][0][j].item<float>(), std::clamp(want, 5.0 - outer, 5.0 + outer), tol)
          << "delta " << delta << " column " << j;
    }
    EXPECT_GT(covered, 0);
    EXPECT_LT(covered, w);
  }
  // Turned right, the new view comes in on the right: the left columns are covered.
  at::Tensor right = warp_reference(at::ones({1, 1, w}), 0.0, at::tensor({20.0}, at::kDouble), c)[0][1][0];
  EXPECT_EQ(right[0].item<float>(), 1.0f);
  EXPECT_EQ(right[w - 1].item<float>(), 0.0f);
  // Facing away: nothing is covered.
  at::Tensor away = warp_reference(at::ones({2, 3, w}), 0.0, at::tensor({180.0}, at::kDouble), c);
  EXPECT_EQ(away.abs().max().item<float>(), 0.0f);
}

TEST(WarpReference, BadInputIsAnError) {
  CondConfig c;
  EXPECT_THROW(warp_reference(at::zeros({1, 4, 4, 4}), 0.0, at::zeros({3}, at::kDouble), c), Error);
  EXPECT_THROW(warp_reference(at::zeros({4, 4, 4}), 0.0, at::zeros({3, 1}, at::kDouble), c), Error);
  EXPECT_THROW(warp_reference(at::zeros({4, 4, 4}), NAN, at::zeros({3}, at::kDouble), c), Error);
  c.hfov_deg = 180;
  EXPECT_THROW(warp_reference(at::zeros({4, 4, 4}), 0.0, at::zeros({3}, at::kDouble), c), Error);
}

nlohmann::json small_config(bool warp) {
  return {{"name", "small"},   {"dim", 32}, {"n_layers", 2}, {"n_heads", 2}, {"ffn_dim", 64}, {"latent_channels", 12},
          {"latent_size", {4, 4}}, {"codec", {{"kind", "pixel_patch"}, {"stride", 2}}},
          {"conditioning", {{"warp_reference", warp}}}};
}

// A model with the reference started from one without it computes what that one did, whatever
// the reference holds; once its reference embedding moves, the reference reaches the output.
TEST(WarpReference, ModelStartedFromOneWithoutItKeepsItsOutput) {
  at::NoGradGuard ng;
  CausalDit base(config_from_json(small_config(false), "base"));
  base->init_weights(4);
  CausalDit warp(config_from_json(small_config(true), "warp"));
  warp->init_weights(9, /*zero_head=*/true);  // as wm_train starts: reference_embedding at zero
  ASSERT_EQ(warp->reference_embedding->weight.sizes(), at::IntArrayRef({32, 13 * 4}));
  EXPECT_EQ(warp->reference_embedding->weight.abs().max().item<float>(), 0.0f);
  const InitReport rep = init_from(*base, *warp);
  EXPECT_EQ(rep.fresh, std::vector<std::string>{"reference_embedding.weight"});
  EXPECT_EQ(rep.copied, static_cast<int>(base->parameters().size()));

  at::Generator g = at::detail::createCPUGenerator(2);
  at::Tensor x = at::randn({3, 12, 4, 4}, g);
  FrameCond cond{at::randn({3, 3}, g), at::randn({3, 5}, g), at::randn({3, 13, 4, 4}, g)};
  const at::Tensor t = at::tensor({0.5f, 0.5f, 0.5f});
  const at::Tensor want = base->forward_chunk(x, t, FrameCond{cond.pose, cond.action}, 0, nullptr);
  const at::Tensor with_ref = warp->forward_chunk(x, t, cond, 0, nullptr);
  EXPECT_LT((with_ref - want).abs().max().item<double>(), 1e-5);
  // No reference is a zero one.
  FrameCond none{cond.pose, cond.action};
  FrameCond zeros{cond.pose, cond.action, at::zeros({3, 13, 4, 4})};
  warp->reference_embedding->weight.normal_(0, 0.1, g);
  EXPECT_TRUE(at::allclose(warp->forward_chunk(x, t, none, 0, nullptr), warp->forward_chunk(x, t, zeros, 0, nullptr)));
  EXPECT_GT((warp->forward_chunk(x, t, cond, 0, nullptr) - want).abs().max().item<double>(), 1e-3);
  // A reference of the wrong shape is an error.
  FrameCond bad{cond.pose, cond.action, at::zeros({3, 12, 4, 4})};
  EXPECT_THROW(warp->forward_chunk(x, t, bad, 0, nullptr), Error);
}

// A reference_residual model's x0 is its head's output plus the reference latents: with the head
// at zero (as wm_train starts it) it redraws the turned frame exactly, zero where that is unseen,
// and without a reference its x0 is the head's alone.
TEST(WarpReference, ResidualHeadAtZeroRedrawsTheTurnedFrame) {
  at::NoGradGuard ng;
  nlohmann::json j = small_config(true);
  j["prediction"] = "x0";
  j["conditioning"]["reference_residual"] = true;
  const DitConfig cfg = config_from_json(j, "residual");
  EXPECT_TRUE(config_from_json(config_to_json(cfg), "round trip").cond.reference_residual);
  CausalDit m(cfg);
  m->init_weights(5, /*zero_head=*/true);
  at::Generator g = at::detail::createCPUGenerator(6);
  at::Tensor x = at::randn({3, 12, 4, 4}, g);
  FrameCond cond{at::randn({3, 3}, g), at::randn({3, 5}, g), at::randn({3, 13, 4, 4}, g)};
  cond.reference.narrow(1, 12, 1).fill_(1.0);
  const at::Tensor t = at::tensor({0.25f, 0.5f, 1.0f});
  auto x0_of = [&](const at::Tensor& v) { return x - t.view({3, 1, 1, 1}) * v; };
  at::Tensor x0 = x0_of(m->forward_chunk(x, t, cond, 0, nullptr));
  EXPECT_LT((x0 - cond.reference.narrow(1, 0, 12)).abs().max().item<double>(), 1e-5);
  EXPECT_LT(x0_of(m->forward_chunk(x, t, FrameCond{cond.pose, cond.action}, 0, nullptr)).abs().max().item<double>(),
            1e-5);
  // Once the head moves, x0 is the head's output plus the reference, whatever the reference.
  m->head->head->weight.normal_(0, 0.1, g);
  const at::Tensor head_only = x0_of(m->forward_chunk(x, t, FrameCond{cond.pose, cond.action}, 0, nullptr));
  m->reference_embedding->weight.zero_();  // the head then sees the same tokens with or without it
  x0 = x0_of(m->forward_chunk(x, t, cond, 0, nullptr));
  EXPECT_LT((x0 - head_only - cond.reference.narrow(1, 0, 12)).abs().max().item<double>(), 1e-4);
}

// reference_residual needs the reference and an x0 head.
TEST(WarpReference, ResidualWithoutReferenceOrX0HeadIsAnError) {
  nlohmann::json j = small_config(false);
  j["prediction"] = "x0";
  j["conditioning"]["reference_residual"] = true;
  EXPECT_THROW(config_from_json(j, "no reference"), Error);
  j["conditioning"]["warp_reference"] = true;
  j["prediction"] = "v";
  EXPECT_THROW(config_from_json(j, "v head"), Error);
  j["prediction"] = "x0";
  EXPECT_NO_THROW(config_from_json(j, "fine"));
}

}  // namespace test_warp_reference
}  // namespace wm::dit
