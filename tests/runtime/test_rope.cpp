#include <gtest/gtest.h>

#include <cmath>

#include "runtime/error.h"
#include "runtime/rope.h"

namespace wm {
namespace {

// Plain reference: rotate pair (a, b) of each axis by pos * theta^(-2j/c), in double.
at::Tensor reference_rope(const at::Tensor& x, const at::Tensor& pos, const RopeSpec& spec) {
  at::Tensor xd = x.to(at::kDouble).contiguous();
  at::Tensor out = xd.clone();
  const int64_t n = x.size(-2);
  auto X = xd.reshape({-1, n, x.size(-1)});
  auto O = out.view({-1, n, x.size(-1)});
  auto xa = X.accessor<double, 3>();
  auto oa = O.accessor<double, 3>();
  auto pa = pos.accessor<int64_t, 2>();
  for (int64_t h = 0; h < X.size(0); ++h)
    for (int64_t i = 0; i < n; ++i) {
      int off = 0;
      for (int a = 0; a < spec.n_axes(); ++a) {
        const int c = spec.axes[a].channels;
        for (int j = 0; j < c / 2; ++j) {
          const int i0 = spec.style == RopeStyle::Interleaved ? off + 2 * j : off + j;
          const int i1 = spec.style == RopeStyle::Interleaved ? off + 2 * j + 1 : off + c / 2 + j;
          const double ang = static_cast<double>(pa[pos.size(0) == 1 ? 0 : i][a]) *
                             std::pow(spec.axes[a].theta, -2.0 * j / c);
          const double u = xa[h][i][i0], w = xa[h][i][i1];
          oa[h][i][i0] = u * std::cos(ang) - w * std::sin(ang);
          oa[h][i][i1] = u * std::sin(ang) + w * std::cos(ang);
        }
        off += c;
      }
    }
  return out;
}

TEST(Rope, VideoSplitMatchesWan) {
  RopeSpec s = RopeSpec::video3d(128);
  ASSERT_EQ(s.axes.size(), 3u);
  EXPECT_EQ(s.axes[0].channels, 44);
  EXPECT_EQ(s.axes[1].channels, 42);
  EXPECT_EQ(s.axes[2].channels, 42);
}

TEST(Rope, MatchesPlainReference) {
  at::manual_seed(1);
  for (auto style : {RopeStyle::Interleaved, RopeStyle::Half}) {
    RopeSpec s = RopeSpec::video3d(24);
    s.style = style;
    at::Tensor x = at::randn({2, 5, 24});
    at::Tensor pos = at::randint(0, 50, {5, 3}, at::kLong);
    at::Tensor got = apply_rope(x, pos, s).to(at::kDouble);
    EXPECT_LT((got - reference_rope(x, pos, s)).abs().max().item<double>(), 1e-5);
  }
}

TEST(Rope, PartialRotaryLeavesTheRestAlone) {
  RopeSpec s = RopeSpec::text1d(8);
  at::Tensor x = at::randn({1, 3, 16});
  at::Tensor y = apply_rope(x, at::full({3, 1}, 7, at::kLong), s);
  EXPECT_TRUE(y.narrow(-1, 8, 8).equal(x.narrow(-1, 8, 8)));
  EXPECT_FALSE(y.narrow(-1, 0, 8).equal(x.narrow(-1, 0, 8)));
}

// Re-anchoring a stored key by delta equals RoPE of the raw key at the new position.
void check_reanchor(const RopeSpec& spec, int d, int axis) {
  at::manual_seed(7);
  const int n = 33;
  at::Tensor raw = at::randn({4, n, d});
  at::Tensor pos = at::randint(0, 200000, {n, spec.n_axes()}, at::kLong);
  pos[0].fill_(123456);  // positions past 100,000
  for (int64_t delta : {1LL, -17LL, 4096LL, 150000LL, -99999LL}) {
    at::Tensor stored = apply_rope(raw, pos, spec);
    at::Tensor moved = reanchor(stored, spec, axis, delta);
    at::Tensor newpos = pos.clone();
    newpos.select(1, axis).add_(delta);
    at::Tensor direct = apply_rope(raw, newpos, spec);
    const double err = (moved - direct).abs().max().item<double>();
    EXPECT_LE(err, 1e-5) << "axis " << axis << " delta " << delta;
    // And both agree with the float64 reference at the new position.
    EXPECT_LE((direct.to(at::kDouble) - reference_rope(raw, newpos, spec)).abs().max().item<double>(), 1e-5);
  }
}

TEST(Rope, ReanchorEqualsRopeAtNewPosition3Axis) {
  RopeSpec spec = RopeSpec::video3d(128);
  for (int axis = 0; axis < 3; ++axis) check_reanchor(spec, 128, axis);
}

TEST(Rope, ReanchorEqualsRopeAtNewPosition1Axis) {
  check_reanchor(RopeSpec::text1d(64, 10000.0, RopeStyle::Half), 64, 0);
  check_reanchor(RopeSpec::text1d(64, 1000000.0, RopeStyle::Interleaved), 64, 0);
}

TEST(Rope, HalfPrecisionStaysCloseToFloat) {
  RopeSpec spec = RopeSpec::video3d(48);
  at::Tensor x = at::randn({2, 9, 48});
  at::Tensor pos = at::randint(0, 1000, {9, 3}, at::kLong);
  at::Tensor f = apply_rope(x, pos, spec);
  at::Tensor h = apply_rope(x.to(at::kHalf), pos, spec);
  EXPECT_EQ(h.scalar_type(), at::kHalf);
  EXPECT_LT((h.to(at::kFloat) - f).abs().max().item<float>(), 1e-2);
}

// rotate_pairs turns the interleaved pairs of its channel range by the given angles (float64
// reference), copies the other channels bit for bit, broadcasts cos/sin over leading dims and
// refuses a range that does not fit.
TEST(Rope, RotatePairsTurnsItsChannelsOnly) {
  at::manual_seed(4);
  const int64_t first = 3, pairs = 4, d = 13;
  at::Tensor x = at::randn({2, 3, 5, d});
  at::Tensor ang = at::randn({2, 1, 5, pairs}, at::kDouble) * 3;  // per batch entry and token
  at::Tensor y = rotate_pairs(x, ang.cos(), ang.sin(), first, pairs);
  ASSERT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_TRUE(y.narrow(-1, 0, first).equal(x.narrow(-1, 0, first)));
  const int64_t rest = first + 2 * pairs;
  EXPECT_TRUE(y.narrow(-1, rest, d - rest).equal(x.narrow(-1, rest, d - rest)));
  at::Tensor xd = x.to(at::kDouble);
  for (int64_t j = 0; j < pairs; ++j) {
    at::Tensor u = xd.select(-1, first + 2 * j), w = xd.select(-1, first + 2 * j + 1);
    at::Tensor c = ang.select(-1, j).cos(), s = ang.select(-1, j).sin();
    EXPECT_LT((y.select(-1, first + 2 * j).to(at::kDouble) - (u * c - w * s)).abs().max().item<double>(), 1e-6);
    EXPECT_LT((y.select(-1, first + 2 * j + 1).to(at::kDouble) - (u * s + w * c)).abs().max().item<double>(), 1e-6);
  }
  // Interleaved RoPE is rotate_pairs of channels [0, rotated) by rope_cos_sin's angles.
  RopeSpec spec = RopeSpec::text1d(8, 10000.0, RopeStyle::Interleaved);
  at::Tensor pos = at::randint(0, 1000, {5, 1}, at::kLong);
  auto [c, s] = rope_cos_sin(pos, spec, at::kCPU);
  EXPECT_TRUE(apply_rope(x.narrow(-1, 0, 12), pos, spec).equal(rotate_pairs(x.narrow(-1, 0, 12), c, s, 0, 4)));
  EXPECT_THROW(rotate_pairs(x, ang.cos(), ang.sin(), 6, 4), Error);
  EXPECT_THROW(rotate_pairs(x, ang.cos(), ang.sin(), -1, 2), Error);
}

TEST(Rope, RejectsBadSpec) {
  RopeSpec s;
  s.axes = {{"t", 3, 10000.0}};
  EXPECT_THROW(apply_rope(at::randn({1, 2, 8}), at::zeros({2, 1}, at::kLong), s), std::exception);
  s.axes = {{"t", 16, 10000.0}};
  EXPECT_THROW(apply_rope(at::randn({1, 2, 8}), at::zeros({2, 1}, at::kLong), s), std::exception);
  EXPECT_THROW(apply_rope(at::randn({1, 2, 16}), at::zeros({3, 1}, at::kLong), s), std::exception);
}

}  // namespace
}  // namespace wm
