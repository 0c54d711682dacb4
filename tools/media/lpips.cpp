#include "tools/media/lpips.h"

#include <ATen/core/grad_mode.h>

#include <array>

#include "runtime/error.h"

namespace wm::media {

namespace {

struct ConvSpec {
  const char* lpips_name;   // "net.slice1.0"
  const char* tv_name;      // "features.0"
  std::array<int64_t, 4> shape;
  int stride, padding;
};

// torchvision AlexNet `features` convs and the LPIPS slice that holds each.
const std::array<ConvSpec, 5> kConvs = {{
    {"net.slice1.0", "features.0", {64, 3, 11, 11}, 4, 2},
    {"net.slice2.3", "features.3", {192, 64, 5, 5}, 1, 2},
    {"net.slice3.6", "features.6", {384, 192, 3, 3}, 1, 1},
    {"net.slice4.8", "features.8", {256, 384, 3, 3}, 1, 1},
    {"net.slice5.10", "features.10", {256, 256, 3, 3}, 1, 1},
}};

// LPIPS's ScalingLayer: x' = (x - shift) / scale, x in [-1, 1].
constexpr std::array<float, 3> kShift = {-0.030f, -0.088f, -0.188f};
constexpr std::array<float, 3> kScale = {0.458f, 0.448f, 0.450f};
constexpr int kMinSide = 31;  // smallest input for which every AlexNet stage is non-empty

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

at::Tensor fetch(const wm::SafeTensors& st, const std::string& name, const std::string& alt,
                 at::IntArrayRef shape, at::Device device) {
  std::string used = name;
  if (!st.contains(name)) {
    if (!st.contains(alt)) {
      throw wm::Error("Lpips(" + st.path() + "): missing tensor '" + name + "' (also tried '" + alt + "')");
    }
    used = alt;
  }
  at::Tensor t = st.get(used);
  if (t.sizes() != shape) {
    throw wm::Error("Lpips(" + st.path() + "): tensor '" + used + "' has shape " + shape_str(t.sizes()) +
                    ", expected " + shape_str(shape));
  }
  if (!t.is_floating_point()) {
    throw wm::Error("Lpips(" + st.path() + "): tensor '" + used + "' is not floating point");
  }
  return t.to(device, at::kFloat).contiguous();
}

}  // namespace

std::vector<std::string> Lpips::expected_tensor_names() {
  std::vector<std::string> out;
  for (const ConvSpec& c : kConvs) {
    out.push_back(std::string(c.lpips_name) + ".weight");
    out.push_back(std::string(c.lpips_name) + ".bias");
  }
  for (int k = 0; k < 5; ++k) out.push_back("lin" + std::to_string(k) + ".model.1.weight");
  return out;
}

Lpips Lpips::load(const std::string& path, at::Device device) {
  return Lpips(wm::SafeTensors::open(path), device);
}

Lpips::Lpips(const wm::SafeTensors& st, at::Device device) : device_(device) {
  for (const ConvSpec& c : kConvs) {
    Conv conv;
    conv.weight = fetch(st, std::string(c.lpips_name) + ".weight", std::string(c.tv_name) + ".weight",
                        c.shape, device);
    conv.bias = fetch(st, std::string(c.lpips_name) + ".bias", std::string(c.tv_name) + ".bias",
                      {c.shape[0]}, device);
    conv.stride = c.stride;
    conv.padding = c.padding;
    convs_.push_back(std::move(conv));
  }
  for (int k = 0; k < 5; ++k) {
    const std::string base = "lin" + std::to_string(k) + ".model.";
    lins_.push_back(fetch(st, base + "1.weight", base + "0.weight", {1, kConvs[k].shape[0], 1, 1}, device));
  }
}

at::Tensor Lpips::to_input(const wm::Image& img) const {
  // [H, W, 3] uint8 -> [1, 3, H, W] in [-1, 1] (lpips.im2tensor: x / 127.5 - 1) -> ScalingLayer.
  at::Tensor t = at::from_blob(const_cast<uint8_t*>(img.rgb.data()), {img.height, img.width, 3}, at::kByte)
                     .to(at::kFloat)
                     .permute({2, 0, 1})
                     .unsqueeze(0);
  t = t / 127.5 - 1.0;
  at::Tensor shift = at::tensor(at::ArrayRef<float>(kShift.data(), 3)).view({1, 3, 1, 1});
  at::Tensor scale = at::tensor(at::ArrayRef<float>(kScale.data(), 3)).view({1, 3, 1, 1});
  return ((t - shift) / scale).contiguous().to(device_);
}

std::vector<at::Tensor> Lpips::features(const at::Tensor& x) const {
  std::vector<at::Tensor> out;
  at::Tensor h = x;
  for (size_t i = 0; i < convs_.size(); ++i) {
    // slice2 and slice3 open with AlexNet's 3x3 stride-2 max pools (features.2 and .5).
    if (i == 1 || i == 2) h = at::max_pool2d(h, {3, 3}, {2, 2});
    const Conv& c = convs_[i];
    h = at::relu(at::conv2d(h, c.weight, c.bias, {c.stride, c.stride}, {c.padding, c.padding}));
    // lpips.normalize_tensor: x / (||x||_channels + 1e-10)
    at::Tensor norm = at::sqrt((h * h).sum(1, /*keepdim=*/true));
    out.push_back(h / (norm + 1e-10));
  }
  return out;
}

double Lpips::distance(const wm::Image& a, const wm::Image& b) const {
  if (a.width != b.width || a.height != b.height) {
    throw wm::Error("Lpips::distance: image sizes differ: " + std::to_string(a.width) + "x" +
                    std::to_string(a.height) + " vs " + std::to_string(b.width) + "x" + std::to_string(b.height));
  }
  if (a.width < kMinSide || a.height < kMinSide) {
    throw wm::Error("Lpips::distance: image " + std::to_string(a.width) + "x" + std::to_string(a.height) +
                    " is smaller than AlexNet's minimum " + std::to_string(kMinSide) + "x" +
                    std::to_string(kMinSide));
  }
  const size_t n = static_cast<size_t>(a.width) * a.height * 3;
  if (a.rgb.size() != n || b.rgb.size() != n) throw wm::Error("Lpips::distance: pixel buffer size mismatch");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> fa = features(to_input(a));
  std::vector<at::Tensor> fb = features(to_input(b));
  at::Tensor total = at::zeros({}, fa[0].options());
  for (size_t k = 0; k < fa.size(); ++k) {
    at::Tensor diff = (fa[k] - fb[k]).pow(2);
    total = total + at::conv2d(diff, lins_[k]).mean();  // 1x1 head, then spatial average
  }
  return total.item<double>();
}

}  // namespace wm::media
