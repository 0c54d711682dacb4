// The CLIP vision tower (dit/clip_vision.h) and Matrix-Game-2.0's conditioning-image
// preprocessing (dit/mg2_image.h) against fixtures made by the upstream Python code
// (tools/mg2_fixtures/make_clip_fixtures.py): a reduced random-weight tower (dim 64, 4 blocks,
// 4 heads, mlp 256, 224x224 input, patch 14) saved as a whole-CLIP .pth, two synthetic images
// (601x401 and 1000x500) taken through inference.py's crop and resize and the CLIP wrapper's
// encode_video.
#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "dit/clip_vision.h"
#include "dit/mg2_image.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/pth.h"
#include "runtime/safetensors.h"
#include "tests/temp_dir.h"
#include "tools/media/png.h"

namespace wm::dit {
// Named, not anonymous: in the unity build this file may share a unit with test_wan_vae.cpp.
namespace clip_vision_test {

std::string fixture(const std::string& name) {
  return std::string(WM_SOURCE_DIR) + "/tests/dit/fixtures/clip/" + name;
}

ClipVisionConfig tiny_config() {
  ClipVisionConfig c;
  c.dim = 64;
  c.layers = 4;
  c.heads = 4;
  c.mlp_dim = 256;
  return c;
}

const SafeTensors& expected() {
  static const SafeTensors st = SafeTensors::open(fixture("expected.safetensors"));
  return st;
}

// Max |a - b| / max |b|.
double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         b.to(at::kDouble).abs().max().item<double>();
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Mg2ImageTest, CropBoxIsUpstreams) {
  // Values printed by inference.py's _resizecrop arithmetic and PIL's rounding of the box.
  struct Case {
    int w, h, l, t, r, b;
  } cases[] = {{601, 401, 0, 36, 601, 366},   {1000, 500, 46, 0, 954, 500},
               {640, 352, 0, 0, 640, 352},    {1280, 720, 0, 8, 1280, 712},
               {1920, 1080, 0, 12, 1920, 1068}, {352, 640, 0, 224, 352, 416},
               {333, 777, 0, 297, 333, 480},  {1001, 563, 0, 6, 1001, 556},
               {7, 3, 1, 0, 6, 3}};
  for (const Case& c : cases) {
    const CropBox box = mg2_crop_box(c.w, c.h);
    EXPECT_EQ(box.left, c.l) << c.w << "x" << c.h;
    EXPECT_EQ(box.top, c.t) << c.w << "x" << c.h;
    EXPECT_EQ(box.right, c.r) << c.w << "x" << c.h;
    EXPECT_EQ(box.bottom, c.b) << c.w << "x" << c.h;
  }
  EXPECT_THROW(mg2_crop_box(0, 10), Error);
}

// Steps 1-2 (crop, PIL bilinear resize in uint8) reproduce upstream's 8-bit image exactly; for
// image a both axes are enlarged, for image b both are reduced (antialiased, 908 -> 640 and
// 500 -> 352 after a crop whose corners PIL rounds half to even).
TEST(Mg2ImageTest, CropResizeIsUpstreamsExactly) {
  for (const char* kind : {"a", "b"}) {
    const Image src = media::read_image(fixture(std::string("image_") + kind + ".png"));
    const Image want = media::read_image(fixture(std::string("image_") + kind + "_352.png"));
    const Image got = mg2_crop_resize(src);
    ASSERT_EQ(got.width, 640);
    ASSERT_EQ(got.height, 352);
    int differing = 0;
    for (size_t i = 0; i < got.rgb.size(); ++i) differing += got.rgb[i] != want.rgb[i];
    EXPECT_EQ(differing, 0) << "image " << kind;
  }
}

Image image_from(const at::Tensor& hwc) {
  Image img(static_cast<int>(hwc.size(1)), static_cast<int>(hwc.size(0)));
  std::memcpy(img.rgb.data(), hwc.contiguous().data_ptr<uint8_t>(), img.rgb.size());
  return img;
}

// PIL's BILINEAR resize of noise images, every pixel exact, in both of Pillow's pass orders:
// enlargements, reductions by up to 3.6x (support widened), one-axis resizes, and sizes where
// Pillow 13 runs the vertical pass first (cases 1, 4, 6, 7).
TEST(Mg2ImageTest, PilBilinearResizeIsExact) {
  const int sizes[][2] = {{11, 29}, {38, 20}, {25, 14}, {40, 33}, {50, 13}, {20, 30}, {42, 22}, {29, 20}};
  for (int i = 0; i < 8; ++i) {
    const std::string p = "pil_" + std::to_string(i);
    const Image src = image_from(expected().get(p + "_src"));
    for (const PilPassOrder order : {PilPassOrder::Pillow13, PilPassOrder::HorizontalFirst}) {
      const Image want =
          image_from(expected().get(p + (order == PilPassOrder::Pillow13 ? "_dst" : "_dst_hfirst")));
      const Image got = pil_resize_bilinear(src, sizes[i][0], sizes[i][1], order);
      ASSERT_EQ(got.width, want.width) << p;
      ASSERT_EQ(got.height, want.height) << p;
      EXPECT_TRUE(got.rgb == want.rgb) << p << (order == PilPassOrder::Pillow13 ? "" : " horizontal first");
    }
  }
  // The vertical-first cases do differ between the orders (else the test above proves nothing).
  const Image src = image_from(expected().get("pil_1_src"));
  EXPECT_FALSE(pil_resize_bilinear(src, 38, 20, PilPassOrder::Pillow13).rgb ==
               pil_resize_bilinear(src, 38, 20, PilPassOrder::HorizontalFirst).rgb);
  EXPECT_THROW(pil_resize_bilinear(src, 0, 5), Error);
}

TEST(Mg2ImageTest, NormalizeIsTorchvisionsFloat32Arithmetic) {
  Image img(256, 1);
  for (int x = 0; x < 256; ++x) img.pixel(x, 0)[0] = img.pixel(x, 0)[1] = img.pixel(x, 0)[2] = x;
  const at::Tensor t = mg2_normalize(img);
  ASSERT_EQ(t.sizes(), at::IntArrayRef({3, 1, 256}));
  ASSERT_EQ(t.scalar_type(), at::kFloat);
  for (int x = 0; x < 256; ++x) {
    const float want = (static_cast<float>(x) / 255.0f - 0.5f) / 0.5f;  // IEEE float32 steps
    for (int c = 0; c < 3; ++c) EXPECT_EQ(t[c][0][x].item<float>(), want) << x;
  }
  // Whole pipeline: the normalised tensor of image b is its 8-bit image's.
  const at::Tensor full = mg2_image_tensor(media::read_image(fixture("image_b.png")));
  ASSERT_EQ(full.sizes(), at::IntArrayRef({3, 352, 640}));
  EXPECT_TRUE(at::equal(full, mg2_normalize(media::read_image(fixture("image_b_352.png")))));
}

TEST(Mg2ImageTest, ClipInputMatchesUpstream) {
  for (const char* kind : {"a", "b"}) {
    const at::Tensor x = mg2_clip_input(mg2_image_tensor(media::read_image(fixture(std::string("image_") + kind + ".png"))));
    ASSERT_EQ(x.sizes(), at::IntArrayRef({1, 3, 224, 224}));
    const at::Tensor want = expected().get(std::string("clip_in_") + kind + "_sub");
    const at::Tensor got = x.slice(2, 0, 224, 7).slice(3, 0, 224, 7);
    ASSERT_EQ(got.sizes(), want.sizes());
    // float32 rounding alone: libtorch 1.13 and torch 2.15 sum the bicubic taps in different
    // orders (both within 7e-5 of the float64 result, where the two agree exactly); measured
    // 2.6e-5 at most here, on values up to 2.2.
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-4) << "image " << kind;
  }
  EXPECT_THROW(mg2_clip_input(at::zeros({4, 10, 10})), Error);
}

at::Tensor fixture_pixels() {
  return at::cat({mg2_clip_input(mg2_image_tensor(media::read_image(fixture("image_a.png")))),
                  mg2_clip_input(mg2_image_tensor(media::read_image(fixture("image_b.png"))))});
}

// The tower loaded from the whole-CLIP .pth (textual.*, log_scale, visual.post_norm,
// visual.head and the last block present and ignored), fed by our own preprocessing from the
// source PNGs, against upstream's visual(x, use_31_block=True).
TEST(ClipVisionTest, TokensMatchUpstream) {
  at::NoGradGuard no_grad;
  const ClipVision tower = ClipVision::load(fixture("clip_tiny.pth"), tiny_config());
  EXPECT_EQ(tower.dtype(), at::kFloat);  // a float16 file runs in float32
  const at::Tensor tokens = tower.forward(fixture_pixels());
  ASSERT_EQ(tokens.sizes(), at::IntArrayRef({2, 257, 64}));
  const at::Tensor want_a = expected().get("tokens_a"), want_b = expected().get("tokens_b");
  EXPECT_LT(rel_err(tokens.slice(0, 0, 1), want_a), 1e-4);
  EXPECT_LT(rel_err(tokens.slice(0, 1, 2), want_b), 1e-4);
}

// In bfloat16 (weights rounded, linears, GELU and residuals in bfloat16) the tokens stay near
// the float32 reference: a gross error (a norm not in float32, a wrong cast) exceeds this.
TEST(ClipVisionTest, Bfloat16StaysNearFloat32) {
  at::NoGradGuard no_grad;
  ClipVisionOptions opt;
  opt.dtype = at::kBFloat16;
  const ClipVision tower = ClipVision::load(fixture("clip_tiny.pth"), tiny_config(), opt);
  const at::Tensor tokens = tower.forward(fixture_pixels());
  EXPECT_EQ(tokens.scalar_type(), at::kBFloat16);
  const double err = rel_err(tokens.slice(0, 0, 1), expected().get("tokens_a"));
  EXPECT_LT(err, 3e-2);
  EXPECT_GT(err, 0.0);
}

TEST(ClipVisionTest, LoadsFromStateDictIgnoringUnusedKeys) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> sd = load_state_dict(fixture("clip_tiny.pth"));
  ASSERT_TRUE(sd.count("textual.token_embedding.weight") && sd.count("log_scale") &&
              sd.count("visual.post_norm.weight") && sd.count("visual.head") &&
              sd.count("visual.transformer.3.mlp.0.weight"));
  // The last block is not run: changing it changes nothing.
  sd["visual.transformer.3.mlp.0.weight"] = at::zeros({256, 64}, at::kHalf);
  sd.erase("visual.transformer.3.attn.proj.weight");
  const ClipVision tower = ClipVision::from_state_dict(sd, tiny_config());
  EXPECT_LT(rel_err(tower.forward(fixture_pixels()).slice(0, 1, 2), expected().get("tokens_b")), 1e-4);
}

TEST(ClipVisionTest, MissingOrMisshapedKeyIsNamed) {
  const std::map<std::string, at::Tensor> full = load_state_dict(fixture("clip_tiny.pth"));
  {
    auto sd = full;
    sd.erase("visual.transformer.2.mlp.0.bias");
    const std::string msg = error_of([&] { ClipVision::from_state_dict(sd, tiny_config(), {}, "clip.pth"); });
    EXPECT_NE(msg.find("visual.transformer.2.mlp.0.bias"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("clip.pth"), std::string::npos) << msg;
  }
  {
    auto sd = full;
    sd["visual.pos_embedding"] = at::zeros({1, 256, 64});
    const std::string msg = error_of([&] { ClipVision::from_state_dict(sd, tiny_config()); });
    EXPECT_NE(msg.find("visual.pos_embedding"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1, 256, 64]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1, 257, 64]"), std::string::npos) << msg;
  }
  {
    // A config that does not fit the file: the first key of another shape is named.
    ClipVisionConfig c = tiny_config();
    c.mlp_dim = 128;
    const std::string msg = error_of([&] { ClipVision::from_state_dict(full, c); });
    EXPECT_NE(msg.find("visual.transformer.0.mlp.0.weight"), std::string::npos) << msg;
  }
  {
    // From a file: the file is named too.
    std::vector<std::pair<std::string, at::Tensor>> kept;
    for (const auto& [k, v] : full)
      if (k != "visual.transformer.1.attn.to_qkv.weight") kept.emplace_back(k, v);
    const std::filesystem::path dir = wm::testing::make_temp_dir("wm_clip_vision_");
    const std::string path = (dir / "clip_missing_key.safetensors").string();
    save_safetensors(path, kept);
    const std::string msg = error_of([&] { ClipVision::load(path, tiny_config()); });
    std::filesystem::remove_all(dir);
    EXPECT_NE(msg.find("visual.transformer.1.attn.to_qkv.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
}

TEST(ClipVisionTest, RejectsBadInput) {
  ClipVisionConfig c = tiny_config();
  c.layers = 2;
  const ClipVision tower = ClipVision::random(c, 7);
  EXPECT_THROW(tower.forward(at::zeros({1, 3, 112, 112})), Error);
  EXPECT_THROW(tower.forward(at::zeros({1, 3, 224, 224}, at::kInt)), Error);
  c.heads = 5;
  EXPECT_THROW(ClipVision::random(c, 7), Error);
}

}  // namespace clip_vision_test
}  // namespace wm::dit
