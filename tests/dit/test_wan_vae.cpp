// The Wan2.1 VAE (dit/wan_vae.h) and its codec (WanVaeCodec, dit/codec.h) against fixtures that
// Matrix-Game-2.0's upstream code produced (tools/mg2_fixtures/make_vae_fixtures.py): a reduced
// VAE (base dim 4, everything else as Wan2.1) with random weights, 24x40 frames.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "dit/codec.h"
#include "dit/config.h"
#include "dit/wan_vae.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/pth.h"
#include "runtime/safetensors.h"

namespace wm::dit {
// Named, not anonymous: in the unity build this file may share a unit with test_clip_vision.cpp,
// whose helpers have the same names (fixture, expected, rel_err).
namespace wan_vae_test {

std::string fixture(const std::string& name) {
  return std::string(WM_SOURCE_DIR) + "/tests/dit/fixtures/wan_vae/" + name;
}

const std::map<std::string, at::Tensor>& state_dict() {
  static const std::map<std::string, at::Tensor> sd = load_state_dict(fixture("wan_vae_tiny.pth"));
  return sd;
}

const SafeTensors& expected() {
  static const SafeTensors st = SafeTensors::open(fixture("expected.safetensors"));
  return st;
}

// max |got - want| / max |want|
double rel_err(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  EXPECT_EQ(g.sizes(), w.sizes());
  if (g.sizes() != w.sizes()) return 1e9;
  return (g - w).abs().max().item<double>() / std::max(w.abs().max().item<double>(), 1e-30);
}

// uint8 frames equal except, at most one level off, where the float frame sits within 1e-4 of a
// truncation edge ((v + 1) * 127.5 close to an integer).
void expect_u8_match(const at::Tensor& got, const at::Tensor& want, const at::Tensor& float_thwc) {
  ASSERT_EQ(got.sizes(), want.sizes());
  at::Tensor diff = (got.to(at::kInt) - want.to(at::kInt)).abs();
  EXPECT_LE(diff.max().item<int>(), 1);
  at::Tensor scaled = (float_thwc.to(at::kDouble) + 1.0) * 127.5;
  at::Tensor edge = (scaled - scaled.round()).abs() <= 1e-4 * 127.5;
  EXPECT_EQ((diff.gt(0) & edge.logical_not()).sum().item<int64_t>(), 0) << "off-by-one away from a rounding edge";
}

TEST(WanVaeModule, KeysAreUpstreamsNamesAndShapes) {
  WanVae vae(WanVaeConfig::from_state_dict(state_dict()));
  EXPECT_EQ(vae->config().dim, 4);
  EXPECT_EQ(vae->config().z_dim, 16);
  std::map<std::string, std::vector<int64_t>> want;
  for (const auto& kv : state_dict()) want[kv.first] = kv.second.sizes().vec();
  EXPECT_EQ(want.size(), 194u);
  EXPECT_EQ(vae->expected_keys(), want);

  // The full-size model: names as in Wan2.1_VAE.pth, the decoder-only part as inference.py loads it.
  WanVae full(WanVaeConfig{}, WanVaeParts::Full);
  auto keys = full->expected_keys();
  EXPECT_EQ(keys.size(), 194u);
  EXPECT_EQ(keys.at("decoder.upsamples.3.resample.1.weight"), (std::vector<int64_t>{192, 384, 3, 3}));
  EXPECT_EQ(keys.at("decoder.upsamples.3.time_conv.weight"), (std::vector<int64_t>{768, 384, 3, 1, 1}));
  EXPECT_EQ(keys.at("decoder.middle.1.to_qkv.weight"), (std::vector<int64_t>{1152, 384, 1, 1}));
  EXPECT_EQ(keys.at("decoder.middle.1.norm.gamma"), (std::vector<int64_t>{384, 1, 1}));
  EXPECT_EQ(keys.at("encoder.downsamples.5.time_conv.weight"), (std::vector<int64_t>{192, 192, 3, 1, 1}));
  EXPECT_EQ(keys.at("encoder.downsamples.0.residual.0.gamma"), (std::vector<int64_t>{96, 1, 1, 1}));
  EXPECT_EQ(keys.at("encoder.downsamples.3.shortcut.weight"), (std::vector<int64_t>{192, 96, 1, 1, 1}));
  EXPECT_EQ(keys.at("decoder.upsamples.4.shortcut.weight"), (std::vector<int64_t>{384, 192, 1, 1, 1}));
  EXPECT_EQ(keys.at("encoder.head.2.weight"), (std::vector<int64_t>{32, 384, 3, 3, 3}));
  EXPECT_EQ(keys.at("decoder.head.2.weight"), (std::vector<int64_t>{3, 96, 3, 3, 3}));
  EXPECT_EQ(keys.at("conv1.weight"), (std::vector<int64_t>{32, 32, 1, 1, 1}));
  EXPECT_EQ(keys.at("conv2.weight"), (std::vector<int64_t>{16, 16, 1, 1, 1}));
  WanVae dec(vae->config(), WanVaeParts::Decoder);
  size_t n_dec = 0;
  for (const auto& kv : want) n_dec += kv.first.rfind("decoder.", 0) == 0 || kv.first.rfind("conv2.", 0) == 0;
  EXPECT_EQ(dec->expected_keys().size(), n_dec);
  for (const auto& kv : dec->expected_keys())
    EXPECT_TRUE(kv.first.rfind("decoder.", 0) == 0 || kv.first.rfind("conv2.", 0) == 0) << kv.first;
}

TEST(WanVaeConformance, EncodeMatchesUpstream) {
  WanVae vae = make_wan_vae(state_dict(), WanVaeParts::Encoder, at::kFloat, at::kCPU, "fixture");
  at::Tensor video = expected().get("enc.video");  // [1, 3, 9, 24, 40]: [image, zeros x 8]
  at::Tensor mu = vae->encode(video);
  EXPECT_LE(rel_err(mu, expected().get("enc.mu")), 1e-4);

  // The codec from the uint8 image: Matrix-Game-2.0's condition for 3 latent frames.
  WanVaeCodecOptions opt;
  opt.encode_dtype = opt.decode_dtype = at::kFloat;
  opt.image_height = 24;
  opt.image_width = 40;
  WanVaeCodec codec(state_dict(), opt, "fixture");
  at::Tensor cond = codec.encode_condition(expected().get("enc.image_u8"), 3, at::kCPU);  // [3, 16, 3, 5]
  EXPECT_LE(rel_err(cond, expected().get("enc.mu")[0].permute({1, 0, 2, 3})), 1e-4);
  EXPECT_EQ(codec.encoded_latents(9), 3);
  EXPECT_EQ(codec.encoded_latents(8), 0);
  EXPECT_THROW(codec.encode(at::zeros({2, 24, 40, 3}, at::kByte), at::kCPU), Error);
}

TEST(WanVaeConformance, StreamingDecodeMatchesUpstream) {
  WanVae vae = make_wan_vae(state_dict(), WanVaeParts::Decoder, at::kFloat, at::kCPU, "fixture");
  at::Tensor latents = expected().get("dec.latents");  // [1, 9, 16, 3, 5]
  WanVaeDecodeState st;
  at::Tensor first;
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(st.frames_for(3), c == 0 ? 9 : 12);
    at::Tensor frames = vae->decode_chunk(latents.narrow(1, 3 * c, 3), st);
    at::Tensor want = expected().get("dec.frames." + std::to_string(c));
    EXPECT_LE(rel_err(frames, want), 1e-4) << "chunk " << c;
    at::Tensor thwc = frames[0].permute({0, 2, 3, 1});
    expect_u8_match(wan_vae_to_uint8(thwc), expected().get("dec.u8." + std::to_string(c)), thwc);
    if (c == 0) {
      first = frames;
      ASSERT_EQ(st.slots().size(), 32u);
      for (int i = 0; i < 32; ++i) {
        const std::string k = "cache." + std::to_string(i);
        const VaeCacheSlot& slot = st.slots()[i];
        ASSERT_TRUE(slot.x.defined() && !slot.rep) << k;
        at::Tensor meta = expected().get(k + ".meta");
        ASSERT_EQ(slot.x.sizes().vec(), std::vector<int64_t>(meta.data_ptr<int64_t>(), meta.data_ptr<int64_t>() + 5))
            << k;
        at::Tensor flat = slot.x.contiguous().reshape({-1});
        at::Tensor sample = flat.slice(0, 0, flat.numel(), meta[5].item<int64_t>());
        EXPECT_LE(rel_err(sample, expected().get(k + ".sample")), 1e-4) << k;
        const double abs_sum = expected().get(k + ".abs_sum").item<double>();
        EXPECT_NEAR(flat.to(at::kDouble).abs().sum().item<double>(), abs_sum, 1e-5 * abs_sum) << k;
      }
    }
  }
  EXPECT_EQ(st.latents_decoded(), 9);
  // A reset starts a new rollout: the first chunk's frames again.
  st.reset();
  EXPECT_EQ(st.slots().size(), 0u);
  EXPECT_TRUE(at::equal(vae->decode_chunk(latents.narrow(1, 0, 3), st), first));
}

TEST(WanVaeCodecTest, DecodesChunksAsUint8AndResets) {
  WanVaeCodecOptions opt;
  opt.encode_dtype = opt.decode_dtype = at::kFloat;
  opt.image_height = 24;
  opt.image_width = 40;
  WanVaeCodec codec(state_dict(), opt, "fixture");
  at::Tensor latents = expected().get("dec.latents")[0];  // [9, 16, 3, 5]
  EXPECT_EQ(codec.decoded_frames(3), 9);
  at::Tensor f0 = codec.decode(latents.narrow(0, 0, 3));
  ASSERT_EQ(f0.sizes(), at::IntArrayRef({9, 24, 40, 3}));
  EXPECT_EQ(f0.scalar_type(), at::kByte);
  at::Tensor want0 = expected().get("dec.frames.0")[0].permute({0, 2, 3, 1});
  expect_u8_match(f0, expected().get("dec.u8.0"), want0);
  EXPECT_EQ(codec.decoded_frames(3), 12);
  at::Tensor f1 = codec.decode(latents.narrow(0, 3, 3).to(at::kHalf));  // any float dtype in
  ASSERT_EQ(f1.size(0), 12);
  codec.reset();
  EXPECT_EQ(codec.decoded_frames(3), 9);
  EXPECT_TRUE(at::equal(codec.decode(latents.narrow(0, 0, 3)), f0));
  EXPECT_THROW(codec.decode(at::zeros({1, 16, 4, 5})), Error);
}

TEST(WanVaeConformance, ReducedPrecisionStaysClose) {
  // bfloat16 (native) and float16 (float32 compute rounded per op on the CPU) against the float32
  // fixture: the first chunk, where every path of the decoder and the 'Rep' rule run. The RMS
  // error relative to the frames' RMS scales with the format's precision: seen 2.7% (bfloat16,
  // 8 significant bits) and 0.27% (float16, 11 bits).
  at::Tensor latents = expected().get("dec.latents").narrow(1, 0, 3);
  at::Tensor want = expected().get("dec.frames.0").to(at::kDouble);
  auto rms_rel = [](const at::Tensor& got, const at::Tensor& ref) {
    return (got.to(at::kDouble) - ref).pow(2).mean().sqrt().item<double>() / ref.pow(2).mean().sqrt().item<double>();
  };
  double err[2];
  int i = 0;
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    WanVae vae = make_wan_vae(state_dict(), WanVaeParts::Decoder, dt, at::kCPU, "fixture");
    EXPECT_EQ(vae->dtype(), dt);
    WanVaeDecodeState st;
    at::Tensor frames = vae->decode_chunk(latents, st);
    EXPECT_EQ(frames.scalar_type(), at::kFloat);
    err[i] = rms_rel(frames, want);
    EXPECT_LE(err[i], dt == at::kHalf ? 6e-3 : 6e-2) << dt;
    EXPECT_GT(err[i], 0.0) << dt << ": not computed in reduced precision";
    WanVae enc = make_wan_vae(state_dict(), WanVaeParts::Encoder, dt, at::kCPU, "fixture");
    at::Tensor mu = enc->encode(expected().get("enc.video"));
    EXPECT_EQ(mu.scalar_type(), dt);
    EXPECT_LE(rms_rel(mu, expected().get("enc.mu").to(at::kDouble)), dt == at::kHalf ? 6e-3 : 6e-2) << dt;
    ++i;
  }
  EXPECT_LT(err[1], err[0] / 4) << "float16 should be about 8x closer than bfloat16";
}

TEST(WanVaeLoad, StrictByNameWithTheKeyInTheError) {
  auto expect_error = [](const std::map<std::string, at::Tensor>& sd, WanVaeParts parts,
                         const std::vector<std::string>& needles) {
    try {
      make_wan_vae(sd, parts, at::kFloat, at::kCPU, "some.pth");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  auto sd = state_dict();
  sd.erase("decoder.upsamples.3.time_conv.bias");
  expect_error(sd, WanVaeParts::Full, {"some.pth", "missing", "decoder.upsamples.3.time_conv.bias"});
  expect_error(sd, WanVaeParts::Decoder, {"missing", "decoder.upsamples.3.time_conv.bias"});
  // The encoder half does not need it.
  EXPECT_NO_THROW(make_wan_vae(sd, WanVaeParts::Encoder, at::kFloat, at::kCPU, "some.pth"));

  sd = state_dict();
  sd["encoder.middle.1.norm.gamma"] = at::ones({16, 1, 1, 1});
  expect_error(sd, WanVaeParts::Full, {"some.pth", "encoder.middle.1.norm.gamma", "[16, 1, 1, 1]", "[16, 1, 1]"});

  sd = state_dict();
  sd["decoder.extra.weight"] = at::ones({2});
  expect_error(sd, WanVaeParts::Decoder, {"unexpected", "decoder.extra.weight"});
  sd = state_dict();
  sd["model.conv9.weight"] = at::ones({2});  // not selected for either half, but a full load refuses it
  expect_error(sd, WanVaeParts::Full, {"unexpected", "model.conv9.weight"});

  // From a file: the error names the file and the key.
  sd = state_dict();
  sd["decoder.head.2.bias"] = at::zeros({4});
  std::vector<std::pair<std::string, at::Tensor>> list(sd.begin(), sd.end());
  const std::string path = std::string(WM_BINARY_DIR) + "/wan_vae_bad_shape.safetensors";
  save_safetensors(path, list);
  try {
    load_wan_vae(path, WanVaeParts::Decoder, at::kFloat, at::kCPU);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("decoder.head.2.bias"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(WanVaeCodecTest, FactoryNeedsWeightsAndBuildsFromAFile) {
  DitConfig c;
  c.codec.kind = "wan_vae";
  c.latent_channels = 16;
  c.latent_height = 3;
  c.latent_width = 5;
  c.codec.stride = 8;
  c.codec.image_height = 24;
  c.codec.image_width = 40;
  EXPECT_THROW(make_codec(c), Error);  // no weights
  c.codec.weights = fixture("wan_vae_tiny.pth");
  c.codec.dtype = "float32";
  std::unique_ptr<Codec> codec = make_codec(c);
  EXPECT_EQ(codec->latent_channels(), 16);
  EXPECT_EQ(codec->image_height(), 24);
  EXPECT_EQ(codec->decoded_frames(2), 5);
  at::Tensor f = codec->decode(expected().get("dec.latents")[0].narrow(0, 0, 3));
  expect_u8_match(f, expected().get("dec.u8.0"), expected().get("dec.frames.0")[0].permute({0, 2, 3, 1}));
  auto* vae = dynamic_cast<WanVaeCodec*>(codec.get());
  ASSERT_NE(vae, nullptr);
  EXPECT_EQ(vae->options().encode_dtype, at::kFloat);
  c.codec.dtype = "";  // Matrix-Game-2.0's dtypes
  auto mg2 = make_codec(c);
  EXPECT_EQ(dynamic_cast<WanVaeCodec*>(mg2.get())->encoder_vae()->dtype(), at::kBFloat16);
  EXPECT_EQ(dynamic_cast<WanVaeCodec*>(mg2.get())->decoder_vae()->dtype(), at::kHalf);
  c.latent_channels = 48;
  EXPECT_THROW(make_codec(c), Error);
}

TEST(WanVaeCodecTest, ConfigCarriesWeightsAndDtype) {
  nlohmann::json j = {{"name", "vae"}, {"dim", 64}, {"n_layers", 1}, {"n_heads", 2}, {"ffn_dim", 128},
                      {"latent_channels", 16}, {"latent_size", {4, 6}},
                      {"codec", {{"kind", "wan_vae"}, {"stride", 8}, {"weights", "a/b.pth"}, {"dtype", "bfloat16"}}}};
  DitConfig c = config_from_json(j);
  EXPECT_EQ(c.codec.weights, "a/b.pth");
  EXPECT_EQ(c.codec.dtype, "bfloat16");
  EXPECT_EQ(c.codec.image_height, 32);
  DitConfig back = config_from_json(config_to_json(c));
  EXPECT_EQ(back.codec.weights, "a/b.pth");
  EXPECT_EQ(back.codec.dtype, "bfloat16");
  j["codec"]["dtype"] = "fp8";
  EXPECT_THROW(config_from_json(j), Error);
  j["codec"].erase("dtype");
  j["codec"].erase("weights");
  EXPECT_FALSE(config_to_json(config_from_json(j))["codec"].contains("weights"));
}

}  // namespace wan_vae_test
}  // namespace wm::dit
