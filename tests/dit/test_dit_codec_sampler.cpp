// The pixel-patch codec, the conditioning features and the flow-matching sampler.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "dit/codec.h"
#include "dit/conditioning.h"
#include "dit/sampler.h"
#include "runtime/error.h"
#include "runtime/window.h"

namespace wm::dit {
namespace {

TEST(DitCodec, PixelPatchRoundTripIsExact) {
  PixelPatchCodec codec(4, 64, 64);
  at::Generator g = at::detail::createCPUGenerator(1);
  at::Tensor frames = at::randint(0, 256, {3, 64, 64, 3}, g, at::TensorOptions().dtype(at::kLong)).to(at::kByte);
  frames[0].fill_(0);
  frames[1][5].fill_(255);
  at::Tensor lat = codec.encode(frames, at::kCPU);
  ASSERT_EQ(lat.sizes(), at::IntArrayRef({3, 48, 16, 16}));
  EXPECT_LE(lat.max().item<float>(), 1.0f);
  EXPECT_GE(lat.min().item<float>(), -1.0f);
  EXPECT_TRUE(at::equal(codec.decode(lat), frames));
  // Layout: pixel (y, x, c) -> channel c*16 + (y%4)*4 + x%4 at (y/4, x/4).
  const int y = 9, x = 14, c = 2;
  const float want = frames[1][y][x][c].item<uint8_t>() / 127.5f - 1.0f;
  EXPECT_FLOAT_EQ(lat[1][c * 16 + (y % 4) * 4 + x % 4][y / 4][x / 4].item<float>(), want);

  // wm::Image lists.
  std::vector<Image> ims = tensor_to_images(frames);
  ASSERT_EQ(ims.size(), 3u);
  EXPECT_EQ(ims[1].pixel(x, y)[c], frames[1][y][x][c].item<uint8_t>());
  std::vector<Image> back = codec.decode_images(codec.encode_images(ims, at::kCPU));
  EXPECT_EQ(back[2].rgb, ims[2].rgb);
  EXPECT_THROW(codec.encode(at::zeros({1, 32, 32, 3}, at::kByte), at::kCPU), Error);
}

TEST(DitCodec, FactoryRejectsUnknownKinds) {
  DitConfig c;
  c.codec.kind = "wan_vae";
  EXPECT_THROW(make_codec(c), Error);
}

TEST(DitConditioning, RayYawFollowsTheRaycasterConvention) {
  CondConfig c;
  c.hfov_deg = 90;
  at::Tensor off = column_yaw_offsets_deg(c, 2);
  // Two columns of a 90 degree view: centres at cam_x = -0.5 and 0.5.
  EXPECT_NEAR(off[0].item<double>(), -std::atan(0.5) * 180 / M_PI, 1e-12);
  EXPECT_NEAR(off[1].item<double>(), std::atan(0.5) * 180 / M_PI, 1e-12);
  // A token looking at world yaw Y has the same ray features whatever the camera yaw: the
  // right column of a camera at yaw 0 and the left column of one at yaw 2*atan(0.5).
  c.pos_bands = 0;
  const double cam2 = 2 * std::atan(0.5) * 180 / M_PI;
  at::Tensor pose = at::tensor({0.0, 0.0, 0.0, 0.0, 0.0, cam2}, at::TensorOptions().dtype(at::kDouble)).view({1, 2, 3});
  at::Tensor rf = ray_features(pose, c, 2);  // [1, 2, 2, 8]
  EXPECT_LT((rf[0][0][1] - rf[0][1][0]).abs().max().item<float>(), 1e-6);
  EXPECT_EQ(pose_features(pose, c).sizes(), at::IntArrayRef({1, 2, n_camera_features(c)}));
}

// The yaw rotary makes q . k depend on the difference of the two tokens' world yaws only.
TEST(DitConditioning, YawRopeDependsOnYawDifference) {
  at::Generator g = at::detail::createCPUGenerator(2);
  at::Tensor q = at::randn({1, 1, 1, 16}, g, at::TensorOptions().dtype(at::kDouble));
  at::Tensor k = at::randn({1, 1, 1, 16}, g, at::TensorOptions().dtype(at::kDouble));
  auto dot = [&](double yq, double yk) {
    at::Tensor a = apply_yaw_rope(q, at::full({1, 1}, yq, at::kDouble), 4, 5);
    at::Tensor b = apply_yaw_rope(k, at::full({1, 1}, yk, at::kDouble), 4, 5);
    EXPECT_TRUE(at::equal(a.narrow(-1, 0, 4), q.narrow(-1, 0, 4)));   // channels before: untouched
    EXPECT_TRUE(at::equal(a.narrow(-1, 14, 2), q.narrow(-1, 14, 2))); // and after
    return (a * b).sum().item<double>();
  };
  EXPECT_NEAR(dot(10, 40), dot(100, 130), 1e-9);
  EXPECT_NEAR(dot(-170, 170), dot(0, 340), 1e-9);  // periodic: 340 = -20
  EXPECT_GT(std::abs(dot(10, 40) - dot(10, 50)), 1e-6);
  // Per-token ray yaw: camera yaw plus the column offset, rows alike.
  CondConfig c;
  at::Tensor pose = at::tensor({0.0, 0.0, 30.0}, at::TensorOptions().dtype(at::kDouble)).view({1, 1, 3});
  at::Tensor yaw = token_ray_yaw_deg(pose, c, 2, 2);  // [1, 4]
  at::Tensor off = column_yaw_offsets_deg(c, 2);
  EXPECT_NEAR(yaw[0][3].item<double>(), 30.0 + off[1].item<double>(), 1e-12);
  EXPECT_NEAR(yaw[0][2].item<double>(), 30.0 + off[0].item<double>(), 1e-12);
}

TEST(DitSampler, ScheduleAndShift) {
  SamplerConfig s;
  std::vector<double> t = flow_schedule(s);
  EXPECT_EQ(t, (std::vector<double>{1.0, 0.75, 0.5, 0.25, 0.0}));
  s.shift = 3.0;
  t = flow_schedule(s);
  EXPECT_DOUBLE_EQ(t[0], 1.0);
  EXPECT_DOUBLE_EQ(t[2], 1.5 / 2.0);
  s.timesteps = {0.5, 0.7};
  EXPECT_THROW(flow_schedule(s), Error);
}

// With the exact velocity of the straight path to x0, v(x, t) = (x - x0) / t, every sampler
// lands on x0.
TEST(DitSampler, AnalyticVelocityReachesTarget) {
  at::Generator g = at::detail::createCPUGenerator(3);
  at::Tensor x0 = at::randn({3, 4, 5, 6}, g);
  at::Tensor noise = seeded_noise(x0.sizes(), g, at::kCPU);
  auto v = [&](const at::Tensor& x, double t) { return (x - x0) / t; };
  for (double shift : {1.0, 3.0})
    for (SamplingMethod method : {SamplingMethod::Euler, SamplingMethod::Renoise}) {
      SamplerConfig s;
      s.shift = shift;
      s.method = method;
      at::Tensor out = sample_flow(noise, s, v, &g);
      EXPECT_LT((out - x0).abs().max().item<float>(), 1e-5)
          << "shift " << shift << " renoise " << (method == SamplingMethod::Renoise);
    }
  // The training pair follows the same convention: one Euler step with the target velocity
  // from x_t lands on x0.
  at::Tensor tf = at::rand({3}, g);
  FlowPair fp = make_flow_pair(x0, tf, noise);
  for (int f = 0; f < 3; ++f)
    EXPECT_LT((flow_step(fp.x_t[f], fp.v[f], tf[f].item<double>(), 0.0) - x0[f]).abs().max().item<float>(), 1e-5);
  // One Euler step from t = 1 with a constant velocity is x - v.
  EXPECT_TRUE(at::allclose(flow_step(noise, x0, 1.0, 0.0), noise - x0));
}

// The method decides each step: Euler draws nothing and follows x + (t_next - t) v; Renoise
// predicts x0 = x - t v and re-noises it with the generator's next draw, (1 - t_next) x0 +
// t_next n, and needs a generator.
TEST(DitSampler, MethodPicksTheStep) {
  at::Generator g0 = at::detail::createCPUGenerator(11);
  const at::Tensor x = at::randn({2, 3, 4, 4}, g0);
  auto v = [](const at::Tensor& xt, double t) { return xt * (1.0 + t); };  // not the straight path
  SamplerConfig s;
  s.timesteps = {1.0, 0.5};
  at::Generator g1 = at::detail::createCPUGenerator(5), g2 = at::detail::createCPUGenerator(5);
  const at::Tensor euler = sample_flow(x, s, v, &g1);
  at::Tensor x1 = x + (0.5 - 1.0) * (x * 2.0);
  EXPECT_TRUE(at::allclose(euler, x1 + (0.0 - 0.5) * (x1 * 1.5), 1e-6, 1e-6));
  EXPECT_TRUE(sample_flow(x, s, v, nullptr).equal(euler));  // Euler needs no generator
  s.method = SamplingMethod::Renoise;
  const at::Tensor renoised = sample_flow(x, s, v, &g1);
  const at::Tensor n = seeded_noise(x.sizes(), g2, at::kCPU);  // g1's draw, from the same seed
  x1 = 0.5 * (x - 1.0 * (x * 2.0)) + 0.5 * n;
  EXPECT_TRUE(at::allclose(renoised, x1 - 0.5 * (x1 * 1.5), 1e-6, 1e-6));
  EXPECT_FALSE(at::allclose(renoised, euler, 1e-3, 1e-3));
  EXPECT_THROW(sample_flow(x, s, v, nullptr), Error);
}

// Shape mismatches are wm::Error naming the function and both shapes.
TEST(DitSampler, ShapeMismatchesAreErrors) {
  auto what = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no wm::Error";
  };
  const at::Tensor x0 = at::zeros({3, 4, 5, 6});
  std::string m = what([&] { make_flow_pair(x0, at::zeros({3}), at::zeros({3, 4, 5, 7})); });
  EXPECT_EQ(m, "make_flow_pair: noise [3, 4, 5, 7] differs from x0 [3, 4, 5, 6]");
  m = what([&] { make_flow_pair(x0, at::zeros({2}), at::zeros({3, 4, 5, 6})); });
  EXPECT_EQ(m, "make_flow_pair: t must be a scalar or [..., T] matching x0 [3, 4, 5, 6], got [2]");
  m = what([&] { sample_flow(x0, SamplerConfig{}, [](const at::Tensor&, double) { return at::zeros({1}); }); });
  EXPECT_EQ(m, "sample_flow: velocity [1] differs from x [3, 4, 5, 6]");
}

// A 2-layer model of dim 32 (2 heads, 4 x 4 latent, 12 channels) with seeded weights.
CausalDit small_sampler_model() {
  nlohmann::json j = {{"name", "small"},       {"dim", 32},
                      {"n_layers", 2},         {"n_heads", 2},
                      {"ffn_dim", 64},         {"latent_channels", 12},
                      {"latent_size", {4, 4}}, {"codec", {{"kind", "pixel_patch"}, {"stride", 2}}}};
  CausalDit m(config_from_json(j, "small"));
  m->init_weights(4);
  return m;
}

TEST(DitSampler, GenerateChunkIsSeededAndRefills) {
  at::NoGradGuard ng;
  CausalDit m = small_sampler_model();
  KvWindow win(m->kv_spec(at::kCPU), {"recent"});
  FrameCond cond{at::zeros({3, 3}), at::zeros({3, 5})};
  SamplerConfig s;
  at::Generator g1 = at::detail::createCPUGenerator(7), g2 = at::detail::createCPUGenerator(7);
  ChunkResult a = generate_chunk(m, &win, cond, 0, s, g1);
  ChunkResult b = generate_chunk(m, &win, cond, 0, s, g2);
  EXPECT_TRUE(at::equal(a.latents, b.latents));
  ASSERT_EQ(a.kv.size(), 2u);
  EXPECT_EQ(a.kv[1].k.sizes(), at::IntArrayRef({2, 3 * 4, 16}));
  EXPECT_EQ(win.size(0), 0);  // the window is only staged into
  std::vector<LayerKv> kv;
  m->forward_chunk(a.latents, at::scalar_tensor(0.0), cond, 0, &win, &kv);
  EXPECT_TRUE(at::equal(kv[0].k, a.kv[0].k));
  Block blk;
  blk.id = "chunk:0";
  blk.layers = a.kv;
  win.place("recent", blk);
  ChunkResult next = generate_chunk(m, &win, cond, 3, s, g1);
  EXPECT_EQ(next.kv[0].pos[0][0].item<int64_t>(), 3);
}

// A noisy refill (context_t > 0) leaves the generated chunk as it is and feeds the refill pass
// the chunk re-noised with the generator's next draw, labelled with context_t.
TEST(DitSampler, NoisyRefillKeepsTheChunkAndRenoisesItsContext) {
  at::NoGradGuard ng;
  CausalDit m = small_sampler_model();
  FrameCond cond{at::zeros({3, 3}), at::zeros({3, 5})};
  SamplerConfig clean, noisy;
  noisy.context_t = 0.1;
  at::Generator g1 = at::detail::createCPUGenerator(7), g2 = at::detail::createCPUGenerator(7);
  ChunkResult a = generate_chunk(m, nullptr, cond, 0, clean, g1);
  ChunkResult b = generate_chunk(m, nullptr, cond, 0, noisy, g2);
  EXPECT_TRUE(at::equal(a.latents, b.latents));
  // g1 is now where g2 was when it drew the refill noise.
  at::Tensor ctx = 0.9 * a.latents + 0.1 * seeded_noise(a.latents.sizes(), g1, at::kCPU);
  std::vector<LayerKv> kv;
  m->forward_chunk(ctx, at::scalar_tensor(0.1), cond, 0, nullptr, &kv);
  EXPECT_LT((kv[1].k - b.kv[1].k).abs().max().item<double>(), 1e-6);
  EXPECT_GT((a.kv[1].k - b.kv[1].k).abs().max().item<double>(), 1e-3);
  noisy.context_t = 1.0;
  EXPECT_THROW(generate_chunk(m, nullptr, cond, 0, noisy, g2), wm::Error);
}

}  // namespace
}  // namespace wm::dit
