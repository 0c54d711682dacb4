#pragma once
// LPIPS (Zhang et al. 2018, "The Unreasonable Effectiveness of Deep Features as a Perceptual
// Metric"), AlexNet variant v0.1, on libtorch. Weights come from one safetensors file the user
// supplies; nothing is downloaded.
//
// Tensor names expected (float32/16/bf16; the LPIPS module's own state_dict names):
//   net.slice1.0.weight  [64, 3, 11, 11]   net.slice1.0.bias  [64]     (torchvision features.0)
//   net.slice2.3.weight  [192, 64, 5, 5]   net.slice2.3.bias  [192]    (features.3)
//   net.slice3.6.weight  [384, 192, 3, 3]  net.slice3.6.bias  [384]    (features.6)
//   net.slice4.8.weight  [256, 384, 3, 3]  net.slice4.8.bias  [256]    (features.8)
//   net.slice5.10.weight [256, 256, 3, 3]  net.slice5.10.bias [256]    (features.10)
//   lin0.model.1.weight  [1, 64, 1, 1]   ... lin4.model.1.weight [1, 256, 1, 1]
// For each backbone tensor the torchvision name (features.N.weight/bias) is accepted instead,
// and lin{k}.model.0.weight (a model built with use_dropout=False) instead of lin{k}.model.1.weight.
// Any other tensors in the file (scaling_layer.shift/scale, classifier.*) are ignored: the
// ScalingLayer constants are fixed in the code.
// Such a file is made from the `lpips` Python package by, e.g.:
//   m = lpips.LPIPS(net='alex'); safetensors.torch.save_file(
//       {k: v.contiguous() for k, v in m.state_dict().items()}, "lpips_alex.safetensors")
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "dit/image.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace wm::media {

class Lpips {
 public:
  // Loads the 15 tensors above from `safetensors_path` onto `device`. Throws wm::Error naming
  // the file and the missing tensor (with the alternative name tried), or the tensor whose
  // shape is wrong (expected vs got).
  static Lpips load(const std::string& safetensors_path, at::Device device = at::kCPU);
  // Same, from an already opened file.
  explicit Lpips(const wm::SafeTensors& weights, at::Device device = at::kCPU);

  // LPIPS distance between two RGB8 images of the same size (>= 31x31, AlexNet's minimum):
  // inputs scaled to [-1, 1], per-layer unit-normalised features, squared differences weighted
  // by the 1x1 heads, averaged over space, summed over the 5 layers. 0 exactly for identical
  // images; symmetric. Throws wm::Error on a size mismatch or a too-small image.
  double distance(const wm::Image& a, const wm::Image& b) const;

  // The names load() requires (the primary spelling), in order.
  static std::vector<std::string> expected_tensor_names();

 private:
  struct Conv {
    at::Tensor weight, bias;
    int stride, padding;
  };
  // [1, 3, H, W] float in LPIPS's scaled input space.
  at::Tensor to_input(const wm::Image& img) const;
  // The five relu outputs, each unit-normalised over channels: [1, C_k, H_k, W_k].
  std::vector<at::Tensor> features(const at::Tensor& x) const;

  at::Device device_;
  std::vector<Conv> convs_;      // 5 AlexNet convs
  std::vector<at::Tensor> lins_;  // 5 heads [1, C_k, 1, 1]
};

}  // namespace wm::media
