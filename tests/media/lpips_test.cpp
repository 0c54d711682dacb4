// LPIPS with random weights: the properties that hold whatever the weights are, and the
// errors a bad weights file must raise. The real LPIPS weights are not shipped.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <string>
#include <unistd.h>

#include "runtime/safetensors.h"
#include "tests/temp_dir.h"
#include "tools/media/lpips.h"

namespace fs = std::filesystem;

namespace {

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

// Random LPIPS-shaped weights under the LPIPS names, or torchvision names for the backbone.
Tensors random_weights(bool torchvision_names) {
  at::manual_seed(0);
  const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>> convs = {
      {"net.slice1.0", "features.0", {64, 3, 11, 11}}, {"net.slice2.3", "features.3", {192, 64, 5, 5}},
      {"net.slice3.6", "features.6", {384, 192, 3, 3}}, {"net.slice4.8", "features.8", {256, 384, 3, 3}},
      {"net.slice5.10", "features.10", {256, 256, 3, 3}}};
  Tensors t;
  for (auto& [lp, tv, shape] : convs) {
    const std::string base = torchvision_names ? tv : lp;
    const int64_t fan_in = shape[1] * shape[2] * shape[3];
    t.emplace_back(base + ".weight", at::randn(shape) * (1.0 / std::sqrt(double(fan_in))));
    t.emplace_back(base + ".bias", at::randn({shape[0]}) * 0.01);
  }
  const int64_t chans[] = {64, 192, 384, 256, 256};
  for (int k = 0; k < 5; ++k) {
    t.emplace_back("lin" + std::to_string(k) + ".model.1.weight", at::rand({1, chans[k], 1, 1}) * 0.1);
  }
  return t;
}

wm::Image noise_image(int w, int h, int seed) {
  wm::Image img(w, h);
  uint32_t s = static_cast<uint32_t>(seed) * 2654435761u + 1;
  for (auto& v : img.rgb) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<uint8_t>(s >> 24);
  }
  return img;
}

}  // namespace

TEST(Lpips, PropertiesWithRandomWeights) {
  const fs::path dir = wm::testing::make_temp_dir("wm_lpips_");
  const std::string path = (dir / "w.safetensors").string();
  wm::save_safetensors(path, random_weights(false));
  wm::media::Lpips lpips = wm::media::Lpips::load(path);
  wm::Image a = noise_image(64, 64, 1), b = noise_image(64, 64, 2);
  EXPECT_EQ(lpips.distance(a, a), 0.0);  // exactly
  const double ab = lpips.distance(a, b);
  EXPECT_GT(ab, 0.0);
  EXPECT_EQ(ab, lpips.distance(b, a));
  // A small change is nearer than an unrelated image.
  wm::Image a2 = a;
  for (size_t i = 0; i < a2.rgb.size(); i += 97) a2.rgb[i] ^= 8;
  EXPECT_LT(lpips.distance(a, a2), ab);
  // Torchvision backbone names load to the same network.
  const std::string tv = (dir / "tv.safetensors").string();
  wm::save_safetensors(tv, random_weights(true));
  EXPECT_DOUBLE_EQ(wm::media::Lpips::load(tv).distance(a, b), ab);
  // Size errors.
  EXPECT_THROW(lpips.distance(a, noise_image(64, 63, 3)), wm::Error);
  EXPECT_THROW(lpips.distance(noise_image(20, 20, 1), noise_image(20, 20, 2)), wm::Error);
  fs::remove_all(dir);
}

TEST(Lpips, MissingOrMisshapenTensorIsNamed) {
  Tensors t = random_weights(false);
  Tensors missing;
  for (auto& p : t)
    if (p.first != "lin3.model.1.weight") missing.push_back(p);
  const fs::path dir = wm::testing::make_temp_dir("wm_lpips_");
  const std::string path = (dir / "missing.safetensors").string();
  wm::save_safetensors(path, missing);
  try {
    wm::media::Lpips::load(path);
    FAIL() << "no throw";
  } catch (const wm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lin3.model.1.weight"), std::string::npos) << e.what();
  }
  Tensors bad = t;
  for (auto& p : bad)
    if (p.first == "net.slice2.3.weight") p.second = at::zeros({192, 64, 3, 3});
  wm::save_safetensors(path, bad);
  try {
    wm::media::Lpips::load(path);
    FAIL() << "no throw";
  } catch (const wm::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("net.slice2.3.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[192, 64, 5, 5]"), std::string::npos) << m;
  }
  fs::remove_all(dir);
  EXPECT_EQ(wm::media::Lpips::expected_tensor_names().size(), 15u);
}
