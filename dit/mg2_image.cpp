#include "dit/mg2_image.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/error.h"

namespace wm::dit {

namespace {

// Python's round() of a float to an int: halves go to the even neighbour.
int python_round(double x) {
  const double f = std::floor(x);
  const double d = x - f;
  if (d > 0.5) return static_cast<int>(f) + 1;
  if (d < 0.5) return static_cast<int>(f);
  return std::fmod(f, 2.0) == 0.0 ? static_cast<int>(f) : static_cast<int>(f) + 1;
}

// Pillow's resampling coefficients for one axis (Resample.c precompute_coeffs with the
// bilinear filter, then normalize_coeffs_8bpc): per output pixel the first input pixel, the
// count, and ksize fixed-point weights.
constexpr int kPrecisionBits = 32 - 8 - 2;

struct AxisCoeffs {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out_size * ksize]
};

double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

AxisCoeffs precompute_coeffs(int in_size, int out_size) {
  constexpr double kSupport = 1.0;  // the bilinear (triangle) filter's support
  const double in0 = 0.0, in1 = in_size;
  const double scale = (in1 - in0) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = kSupport * filterscale;
  AxisCoeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);  // truncation toward zero, as C's cast
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = bilinear_filter((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[x] /= ww;
      const double scaled = k[x] * (1 << kPrecisionBits);
      c.weights[static_cast<size_t>(xx) * c.ksize + x] =
          static_cast<int32_t>(k[x] < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;
  return static_cast<uint8_t>(s < 0 ? 0 : (s > 255 ? 255 : s));
}

// One pass along x (horizontal) or y (vertical) of an interleaved RGB image.
wm::Image resample_pass(const wm::Image& in, int out_size, bool horizontal) {
  const AxisCoeffs c = precompute_coeffs(horizontal ? in.width : in.height, out_size);
  wm::Image out(horizontal ? out_size : in.width, horizontal ? in.height : out_size);
  const size_t row = static_cast<size_t>(in.width) * 3;
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      const int o = horizontal ? x : y;
      const int32_t* k = c.weights.data() + static_cast<size_t>(o) * c.ksize;
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      const uint8_t* p = horizontal ? in.pixel(c.first[o], y) : in.pixel(x, c.first[o]);
      const size_t step = horizontal ? 3 : row;
      for (int i = 0; i < c.count[o]; ++i, p += step) {
        s0 += p[0] * k[i];
        s1 += p[1] * k[i];
        s2 += p[2] * k[i];
      }
      uint8_t* q = out.pixel(x, y);
      q[0] = clip8(s0);
      q[1] = clip8(s1);
      q[2] = clip8(s2);
    }
  }
  return out;
}

void check_image(const wm::Image& image, const char* what) {
  WM_CHECK(!image.empty() && image.width > 0 && image.height > 0 &&
               image.rgb.size() == static_cast<size_t>(image.width) * image.height * 3,
           what, ": the image is empty or its pixel buffer does not match ", image.width, "x",
           image.height);
}

}  // namespace

CropBox mg2_crop_box(int width, int height, int th, int tw) {
  WM_CHECK(width > 0 && height > 0 && th > 0 && tw > 0, "sizes must be positive, got image ",
           width, "x", height, ", target ", tw, "x", th);
  int new_w, new_h;
  // inference.py: `if h / w > th / tw`, then int() of `new_w * th / tw` (true division).
  if (static_cast<double>(height) / width > static_cast<double>(th) / tw) {
    new_w = width;
    new_h = static_cast<int>(static_cast<double>(static_cast<int64_t>(new_w) * th) / tw);
  } else {
    new_h = height;
    new_w = static_cast<int>(static_cast<double>(static_cast<int64_t>(new_h) * tw) / th);
  }
  // PIL's crop rounds each corner of the box ((w -/+ new_w) / 2) with Python's round().
  CropBox b;
  b.left = python_round((width - new_w) / 2.0);
  b.top = python_round((height - new_h) / 2.0);
  b.right = python_round((width + new_w) / 2.0);
  b.bottom = python_round((height + new_h) / 2.0);
  return b;
}

wm::Image crop_image(const wm::Image& image, const CropBox& box) {
  check_image(image, "crop_image");
  WM_CHECK(box.left >= 0 && box.top >= 0 && box.right <= image.width &&
               box.bottom <= image.height && box.width() > 0 && box.height() > 0,
           "crop box [", box.left, ", ", box.top, ", ", box.right, ", ", box.bottom,
           ") outside the ", image.width, "x", image.height, " image or empty");
  wm::Image out(box.width(), box.height());
  for (int y = 0; y < out.height; ++y) {
    std::memcpy(out.pixel(0, y), image.pixel(box.left, box.top + y),
                static_cast<size_t>(out.width) * 3);
  }
  return out;
}

wm::Image pil_resize_bilinear(const wm::Image& image, int out_w, int out_h, PilPassOrder order) {
  check_image(image, "pil_resize_bilinear");
  WM_CHECK(out_w > 0 && out_h > 0, "output size must be positive, got ", out_w, "x", out_h);
  // Two passes, each into an 8-bit image; a pass is skipped when its size is unchanged.
  const bool vertical_first = order == PilPassOrder::Pillow13 && out_h < image.height &&
                              2 * (static_cast<int64_t>(image.width) - out_w) < image.height - out_h;
  wm::Image out = image;
  if (vertical_first) {
    if (out_h != image.height) out = resample_pass(out, out_h, /*horizontal=*/false);
    if (out_w != image.width) out = resample_pass(out, out_w, /*horizontal=*/true);
  } else {
    if (out_w != image.width) out = resample_pass(out, out_w, /*horizontal=*/true);
    if (out_h != image.height) out = resample_pass(out, out_h, /*horizontal=*/false);
  }
  return out;
}

wm::Image mg2_crop_resize(const wm::Image& image, PilPassOrder order) {
  check_image(image, "mg2_crop_resize");
  const wm::Image cropped = crop_image(image, mg2_crop_box(image.width, image.height));
  return pil_resize_bilinear(cropped, kMg2ImageWidth, kMg2ImageHeight, order);
}

at::Tensor mg2_normalize(const wm::Image& image) {
  check_image(image, "mg2_normalize");
  // torchvision's to_tensor: uint8 -> float32, / 255; Normalize: (x - 0.5) / 0.5.
  const at::Tensor u8 = at::from_blob(const_cast<uint8_t*>(image.rgb.data()),
                                      {image.height, image.width, 3}, at::kByte);
  return u8.permute({2, 0, 1}).contiguous().to(at::kFloat).div(255).sub(0.5).div(0.5);
}

at::Tensor mg2_image_tensor(const wm::Image& image, PilPassOrder order) {
  return mg2_normalize(mg2_crop_resize(image, order));
}

at::Tensor mg2_clip_input(const at::Tensor& image, int64_t size) {
  WM_CHECK((image.dim() == 3 || image.dim() == 4) && image.size(image.dim() - 3) == 3,
           "expected [3, H, W] or [B, 3, H, W], got ", image.sizes());
  WM_CHECK(image.scalar_type() == at::kFloat || image.scalar_type() == at::kDouble,
           "expected float32 or float64, got ", image.scalar_type());
  WM_CHECK(size > 0, "size must be positive, got ", size);
  const at::Tensor x = image.dim() == 3 ? image.unsqueeze(0) : image;
  const auto opts = x.options();
  // CLIP's normalisation constants, as torch.as_tensor makes them from Python floats.
  const at::Tensor mean =
      at::tensor(std::vector<double>{0.48145466, 0.4578275, 0.40821073}, at::kDouble).to(opts).view({3, 1, 1});
  const at::Tensor std =
      at::tensor(std::vector<double>{0.26862954, 0.26130258, 0.27577711}, at::kDouble).to(opts).view({3, 1, 1});
  const at::Tensor resized =
      at::upsample_bicubic2d(x.contiguous(), {size, size}, /*align_corners=*/false, c10::nullopt,
                             c10::nullopt);
  return resized.mul(0.5).add(0.5).sub(mean).div(std);
}

}  // namespace wm::dit
