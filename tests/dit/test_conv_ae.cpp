// The learned codec (dit/conv_ae.h): its file round trip, its checks on bad files and shapes, a
// DiT file that carries it, and the shipped codec's reconstruction of frames it never saw.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "dit/codec.h"
#include "dit/conv_ae.h"
#include "dit/weights.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/temp_dir.h"
#include "tools/media/metrics.h"
#include "tools/world/raycaster.h"
#include "tools/world/rng.h"
#include "tools/world/suite.h"
#include "tools/world/trajectory.h"

namespace wm::dit {
namespace {

namespace fs = std::filesystem;

class ConvAeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = wm::testing::make_temp_dir(std::string("wm_conv_ae_") +
                                      ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static ConvAeConfig small() {
    ConvAeConfig c;
    c.latent_channels = 4;
    c.widths = {4, 8, 8};
    c.image_height = c.image_width = 16;
    return c;
  }
  // A codec file with seeded weights and made-up statistics.
  std::string write_small(const std::string& name, uint64_t seed = 3) {
    ConvAe ae(small());
    ae->init_weights(seed);
    at::NoGradGuard ng;
    ae->latent_mean.copy_(at::tensor({0.1f, -0.2f, 0.3f, 0.0f}));
    ae->latent_std.copy_(at::tensor({0.5f, 2.0f, 1.0f, 0.25f}));
    const std::string p = (dir_ / name).string();
    save_conv_ae(*ae, p);
    return p;
  }
  static at::Tensor frames(int n, int side, uint64_t seed) {
    at::Generator g = at::detail::createCPUGenerator(seed);
    return at::randint(0, 256, {n, side, side, 3}, g, at::TensorOptions().dtype(at::kLong)).to(at::kByte);
  }
  fs::path dir_;
};

TEST_F(ConvAeTest, ShapesAndStandardisation) {
  ConvAe ae(small());
  ae->init_weights(1);
  EXPECT_EQ(ae->config().stride(), 4);
  at::NoGradGuard ng;
  at::Tensor x = at::rand({2, 3, 16, 16}) * 2 - 1;
  at::Tensor z = ae->encode_raw(x);
  ASSERT_EQ(z.sizes(), at::IntArrayRef({2, 4, 4, 4}));
  ASSERT_EQ(ae->decode_raw(z).sizes(), at::IntArrayRef({2, 3, 16, 16}));
  ae->latent_mean.copy_(at::tensor({1.0f, 2.0f, 3.0f, 4.0f}));
  ae->latent_std.copy_(at::tensor({2.0f, 4.0f, 0.5f, 1.0f}));
  at::Tensor s = ae->standardise(z);
  EXPECT_NEAR((s[1][2] - (z[1][2] - 3.0) / 0.5).abs().max().item<float>(), 0.0f, 1e-6);
  EXPECT_TRUE(at::allclose(ae->unstandardise(s), z, 1e-5, 1e-6));
  // A frame's latents do not depend on the other frames of the call (no normalisation layers).
  EXPECT_TRUE(at::allclose(ae->encode_raw(x.narrow(0, 1, 1)), z.narrow(0, 1, 1), 1e-5, 1e-6));
  EXPECT_THROW(ae->encode_raw(at::zeros({1, 3, 8, 16})), Error);
  EXPECT_THROW(ae->decode_raw(at::zeros({1, 3, 4, 4})), Error);
}

TEST_F(ConvAeTest, FileRoundTripGivesTheSameCodec) {
  const std::string p = write_small("a.safetensors");
  ConvAe ae(small());
  ae->init_weights(3);
  at::NoGradGuard ng;
  ae->latent_mean.copy_(at::tensor({0.1f, -0.2f, 0.3f, 0.0f}));
  ae->latent_std.copy_(at::tensor({0.5f, 2.0f, 1.0f, 0.25f}));
  auto codec = ConvAeCodec::from_file(p);
  EXPECT_EQ(codec->latent_channels(), 4);
  EXPECT_EQ(codec->image_height(), 16);
  const at::Tensor f = frames(3, 16, 7);
  const at::Tensor lat = codec->encode(f, at::kCPU);
  ASSERT_EQ(lat.sizes(), at::IntArrayRef({3, 4, 4, 4}));
  EXPECT_TRUE(at::equal(lat, ae->standardise(ae->encode_raw(frames_to_unit(f, at::kCPU)))));
  const at::Tensor back = codec->decode(lat);
  ASSERT_EQ(back.sizes(), at::IntArrayRef({3, 16, 16, 3}));
  EXPECT_EQ(back.scalar_type(), at::kByte);
  EXPECT_TRUE(at::equal(back, unit_to_frames(ae->decode_raw(ae->encode_raw(frames_to_unit(f, at::kCPU))))));
  EXPECT_THROW(codec->encode(frames(1, 8, 1), at::kCPU), Error);
  EXPECT_THROW(codec->decode(at::zeros({1, 5, 4, 4})), Error);
}

TEST_F(ConvAeTest, BadFilesAreRefusedNamingTheTensor) {
  const std::string good = write_small("good.safetensors");
  SafeTensors st = SafeTensors::open(good);
  std::vector<std::pair<std::string, at::Tensor>> all;
  for (const auto& n : st.names()) all.emplace_back(n, st.get(n).clone());
  auto variant = [&](const std::string& name, auto edit, std::map<std::string, std::string> meta) {
    std::vector<std::pair<std::string, at::Tensor>> t;
    for (auto& kv : all) {
      auto e = edit(kv);
      if (e.second.defined()) t.push_back(e);
    }
    const std::string p = (dir_ / name).string();
    save_safetensors(p, t, meta);
    return p;
  };
  const std::map<std::string, std::string> meta = st.metadata();
  auto expect_error = [](const std::string& p, const std::string& want) {
    try {
      load_conv_ae(p);
      ADD_FAILURE() << p << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  using KV = std::pair<std::string, at::Tensor>;
  expect_error(variant("missing.safetensors", [](const KV& kv) {
    return kv.first == "codec.dec_out.weight" ? KV{} : kv;
  }, meta), "codec.dec_out.weight");
  expect_error(variant("shape.safetensors", [](const KV& kv) {
    return kv.first == "codec.enc_in.bias" ? KV{kv.first, at::zeros({5})} : kv;
  }, meta), "codec.enc_in.bias");
  expect_error(variant("nan.safetensors", [](const KV& kv) {
    return kv.first == "codec.dec_in.weight" ? KV{kv.first, kv.second.clone().fill_(NAN)} : kv;
  }, meta), "codec.dec_in.weight");
  expect_error(variant("std.safetensors", [](const KV& kv) {
    return kv.first == "codec.latent_std" ? KV{kv.first, at::zeros_like(kv.second)} : kv;
  }, meta), "latent_std");
  expect_error(variant("nometa.safetensors", [](const KV& kv) { return kv; }, {}), "codec_config");
  auto bad_meta = meta;
  bad_meta["codec_config"] = R"({"latent_channels": 4, "widths": [4, 8, 8], "image_height": 18, "image_width": 16})";
  expect_error(variant("badmeta.safetensors", [](const KV& kv) { return kv; }, bad_meta), "not divisible");
}

TEST_F(ConvAeTest, ADitFileCarriesItsCodec) {
  const std::string codec_file = write_small("codec.safetensors");
  DitConfig c;
  c.dim = 32;
  c.n_heads = 2;
  c.head_dim = 16;
  c.ffn_dim = 64;
  c.n_layers = 1;
  c.latent_channels = 4;
  c.latent_height = c.latent_width = 4;
  c.rope = RopeSpec::video3d(16, 10000);
  c.codec.kind = "conv_ae";
  c.codec.stride = 4;
  c.codec.image_height = c.codec.image_width = 16;
  c.codec.weights = codec_file;
  c.validate();
  CausalDit m(c);
  m->init_weights(2);
  const std::string model_file = (dir_ / "model.safetensors").string();
  save_weights(*m, model_file);
  fs::remove(codec_file);  // the model file alone must do
  const DitConfig back = config_from_weights(model_file);
  EXPECT_EQ(back.codec.kind, "conv_ae");
  EXPECT_EQ(back.codec.weights, model_file);
  CausalDit loaded = load_model(model_file, at::kCPU);  // the codec's tensors are not the DiT's
  auto codec = make_codec(back);
  ConvAe ae(small());
  ae->init_weights(3);
  at::NoGradGuard ng;
  ae->latent_mean.copy_(at::tensor({0.1f, -0.2f, 0.3f, 0.0f}));
  ae->latent_std.copy_(at::tensor({0.5f, 2.0f, 1.0f, 0.25f}));
  const at::Tensor f = frames(2, 16, 9);
  EXPECT_TRUE(at::equal(codec->encode(f, at::kCPU), ae->standardise(ae->encode_raw(frames_to_unit(f, at::kCPU)))));
  // Saved again from the loaded model: still carried, same tensors.
  const std::string again = (dir_ / "again.safetensors").string();
  save_weights(*loaded, again);
  auto codec2 = make_codec(config_from_weights(again));
  EXPECT_TRUE(at::equal(codec2->encode(f, at::kCPU), codec->encode(f, at::kCPU)));
  // A config whose latent channels differ from the codec's is refused.
  DitConfig wrong = back;
  wrong.latent_channels = 8;
  EXPECT_THROW(make_codec(wrong), Error);
  DitConfig none = back;
  none.codec.weights.clear();
  EXPECT_THROW(make_codec(none), Error);
}

// The shipped codec reconstructs frames of scenes it was not trained on (their seeds are
// outside the trainer's) at 30 dB or more, the issue's bar; its card gives the figure on 64.
TEST(ConvAeShipped, ReconstructsUnseenScenesAtThirtyDecibels) {
  const fs::path file = fs::path(WM_SOURCE_DIR) / "assets/models/tiny-ae/codec.safetensors";
  if (!fs::exists(file)) GTEST_SKIP() << file << " is not there";
  auto codec = ConvAeCodec::from_file(file.string());
  world::TrajectoryOptions topt;
  topt.min_seconds = 4;
  topt.max_seconds = 8;
  topt.verify_psnr = false;
  topt.render.width = codec->image_width();
  topt.render.height = codec->image_height();
  std::vector<Image> truth;
  for (uint64_t s = 0; s < 4; ++s) {
    const world::Episode ep = world::generate_episode(world::hash_combine(0xFEEDF00D, s), topt);
    const world::Scene scene = world::scene_of(ep);
    const world::Raycaster ray(scene, topt.render);
    for (int f = 0; f < ep.frames(); f += ep.frames() / 4) truth.push_back(ray.render(ep.poses[f]));
  }
  const std::vector<Image> back = codec->decode_images(codec->encode_images(truth, at::kCPU));
  double mean = 0;
  for (size_t i = 0; i < truth.size(); ++i) mean += media::capped_psnr(back[i], truth[i]) / truth.size();
  EXPECT_GE(mean, 30.0) << truth.size() << " frames";
  std::printf("shipped codec: %.2f dB over %zu unseen frames\n", mean, truth.size());
}

}  // namespace
}  // namespace wm::dit
