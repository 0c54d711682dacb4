#pragma once
// Matrix-Game-2.0's preprocessing of the conditioning (first) image, as its inference.py and
// Wan's CLIP wrapper do it, bit for bit where the upstream works on 8-bit images:
//
//   1. center crop to the aspect 352:640 (inference.py `_resizecrop`): sizes truncated with
//      int(), the box (w -/+ new_w) / 2 rounded by PIL's crop (Python round, halves to even);
//   2. resize to 640x352 as torchvision's v2.Resize((352, 640), antialias=True) does on a PIL
//      image: PIL's BILINEAR resampling of the 8-bit image (separable, horizontal pass first,
//      the triangle filter's support widened by the down-scale factor, 22-bit fixed-point
//      coefficients, each pass rounded and clamped to uint8);
//   3. ToTensor and Normalize(0.5, 0.5): x = (u8 / 255 - 0.5) / 0.5, float32 in [-1, 1];
//   4. for CLIP (XLMRobertaCLIP wrapper's encode_video): bicubic interpolation to 224x224
//      (align_corners=False, no antialias, aspect squashed), x * 0.5 + 0.5, then
//      (x - mean) / std with CLIP's mean and std.
//
// inference.py casts the step-3 tensor to bfloat16 before the VAE and CLIP see it; these
// functions stay in float32 (cast the result where the bfloat16 rounding is wanted).
#include <ATen/ATen.h>

#include "dit/image.h"

namespace wm::dit {

constexpr int kMg2ImageHeight = 352;
constexpr int kMg2ImageWidth = 640;

// A crop rectangle in pixels: columns [left, right), rows [top, bottom).
struct CropBox {
  int left = 0, top = 0, right = 0, bottom = 0;
  int width() const { return right - left; }
  int height() const { return bottom - top; }
};

// The box inference.py's _resizecrop(image, th, tw) cuts from a width x height image, after
// PIL's rounding of its fractional corners. Throws wm::Error unless all sizes are positive.
CropBox mg2_crop_box(int width, int height, int th = kMg2ImageHeight, int tw = kMg2ImageWidth);

// The pixels of `box` (which must lie inside the image). Throws wm::Error otherwise.
wm::Image crop_image(const wm::Image& image, const CropBox& box);

// The order of Pillow's two resampling passes, which changes the 8-bit result (each pass
// rounds). Pillow 13 runs the vertical pass first when the height shrinks and the width
// shrinks by less than half as many pixels (2 * (in_w - out_w) < in_h - out_h), the
// horizontal pass first otherwise; Pillow 12 and earlier always run the horizontal pass
// first. For MG2's crop the two differ only at the edge where the crop is narrower than 640
// and taller than 352 (a 639x353 crop, say); the fixtures were made with Pillow 13.0.
enum class PilPassOrder { Pillow13, HorizontalFirst };

// PIL's Image.resize((out_w, out_h), Image.BILINEAR) of an RGB uint8 image (Pillow's
// ImagingResample, 8-bit path). The same image is returned when the size is unchanged.
// Throws wm::Error on an empty image or a non-positive size.
wm::Image pil_resize_bilinear(const wm::Image& image, int out_w, int out_h,
                              PilPassOrder order = PilPassOrder::Pillow13);

// Steps 1-2: the 640x352 uint8 image. Throws wm::Error on an empty image.
wm::Image mg2_crop_resize(const wm::Image& image, PilPassOrder order = PilPassOrder::Pillow13);

// Step 3 of an image already 640x352 (or any size: no resizing here): [3, H, W] float32 in
// [-1, 1] on the CPU.
at::Tensor mg2_normalize(const wm::Image& image);

// Steps 1-3: [3, 352, 640] float32 in [-1, 1] on the CPU. Throws wm::Error on an empty image.
at::Tensor mg2_image_tensor(const wm::Image& image, PilPassOrder order = PilPassOrder::Pillow13);

// Step 4: CLIP's input from the step-3 tensor [3, H, W] or [B, 3, H, W] in [-1, 1] (float32 or
// float64; any device) -> [B, 3, size, size] of that dtype and device. Throws wm::Error on
// another shape or a non-floating dtype.
at::Tensor mg2_clip_input(const at::Tensor& image, int64_t size = 224);

}  // namespace wm::dit
