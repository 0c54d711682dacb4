#pragma once
// The CLIP ViT-H/14 vision tower that Matrix-Game-2.0 conditions on (open-clip XLM-RoBERTa
// large ViT-huge-14, Wan's `XLMRobertaCLIP.visual`), called as upstream calls it:
// `visual(x, use_31_block=True)`, i.e. the tokens after the second-to-last block, without the
// post-norm and head.
//
//   x [B, 3, S, S] (S = image_size, CLIP-normalised pixels; see mg2_image.h)
//   patches = Conv2d(3, dim, patch, stride patch, no bias)       -> [B, g*g, dim], row-major grid
//   x = pre_norm(cat(cls_embedding, patches) + pos_embedding)    -> [B, 1 + g*g, dim]
//   blocks 0 .. layers-2 (the last block is skipped), each pre-norm:
//     x += proj(attention(to_qkv(norm1(x)) viewed as [B, L, 3, heads, head_dim]))
//     x += mlp.2(GELU_erf(mlp.0(norm2(x))))
// LayerNorms (eps norm_eps) run in float32 and return the tower's dtype, as upstream's
// LayerNorm subclass does; attention scores, softmax and the weighted sum run in float32 with
// scale 1/sqrt(head_dim) (upstream uses flash attention, which accumulates in float32); every
// linear, the GELU and the residual sums run in the tower's dtype (float32 or bfloat16).
//
// Checkpoint keys (the whole-CLIP state dict of
// `models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth`, prefix "visual."):
//   visual.patch_embedding.weight [dim, 3, patch, patch]   visual.cls_embedding [1, 1, dim]
//   visual.pos_embedding [1, 1 + g*g, dim]                 visual.pre_norm.{weight,bias} [dim]
//   visual.transformer.N.norm1.{weight,bias} [dim]         visual.transformer.N.norm2.{...} [dim]
//   visual.transformer.N.attn.to_qkv.{weight [3*dim, dim], bias [3*dim]}
//   visual.transformer.N.attn.proj.{weight [dim, dim], bias [dim]}
//   visual.transformer.N.mlp.0.{weight [mlp, dim], bias [mlp]}
//   visual.transformer.N.mlp.2.{weight [dim, mlp], bias [dim]}      for N in 0 .. layers-2
// Everything else in the file (textual.*, log_scale, visual.post_norm, visual.head, the last
// block visual.transformer.{layers-1}.*) is ignored.
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace wm::dit {

struct ClipVisionConfig {
  int64_t image_size = 224;
  int64_t patch_size = 14;
  int64_t dim = 1280;
  int64_t layers = 32;  // blocks in the checkpoint; the tower runs the first layers - 1
  int64_t heads = 16;
  int64_t mlp_dim = 5120;
  double norm_eps = 1e-5;

  // Matrix-Game-2.0's (and Wan2.1 i2v's) ViT-H/14: the defaults above.
  static ClipVisionConfig vit_h_14() { return {}; }

  int64_t grid() const { return image_size / patch_size; }
  int64_t tokens() const { return 1 + grid() * grid(); }  // 257 for ViT-H/14 at 224
  int64_t head_dim() const { return dim / heads; }
  int64_t blocks_run() const { return layers - 1; }
  // Throws wm::Error unless every size is positive, patch divides image and heads divide dim,
  // and layers >= 2.
  void validate() const;
};

struct ClipVisionOptions {
  at::Device device = at::kCPU;
  // The tower's dtype: float32 or bfloat16. Unset: the stored dtype of the patch embedding when
  // it is float32 or bfloat16, float32 otherwise (a float16 file runs in float32, as upstream
  // loads it into a float32 model).
  std::optional<at::ScalarType> dtype;
  std::string prefix = "visual.";  // key prefix of the tower in the state dict
};

class ClipVision {
 public:
  // The key names and shapes the tower needs, in load order (prefix as given).
  static std::vector<std::pair<std::string, std::vector<int64_t>>> expected_keys(
      const ClipVisionConfig& cfg, const std::string& prefix = "visual.");

  // Builds the tower from a state dict (any device and floating dtype; the tensors are copied
  // and converted). Keys it does not use are ignored. Throws wm::Error naming the key (and
  // `source`, the file, when given) for a missing key or one of the wrong shape (expected and
  // got), or for a non-floating tensor; wm::Error if the config or dtype is invalid.
  static ClipVision from_state_dict(const std::map<std::string, at::Tensor>& state_dict,
                                    const ClipVisionConfig& cfg, const ClipVisionOptions& opt = {},
                                    const std::string& source = "");

  // Reads only the tower's tensors of a checkpoint file: a torch.save'd .pth (zip) state dict,
  // as the upstream file is, or safetensors, told apart by content. Throws as from_state_dict,
  // naming the file, and wm::Error / wm::CorruptData for an unreadable or malformed file.
  static ClipVision load(const std::string& path, const ClipVisionConfig& cfg,
                         const ClipVisionOptions& opt = {});

  // A tower with random weights of sensible scale (benchmarks, tests), deterministic in seed.
  static ClipVision random(const ClipVisionConfig& cfg, uint64_t seed,
                           const ClipVisionOptions& opt = {});

  // pixels [B, 3, image_size, image_size], any floating dtype, on the tower's device (converted
  // to its dtype) -> tokens [B, tokens(), dim] in the tower's dtype. Throws wm::Error on another
  // shape or device.
  at::Tensor forward(const at::Tensor& pixels) const;

  const ClipVisionConfig& config() const { return cfg_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }

 private:
  struct Block {
    at::Tensor norm1_w, norm1_b, qkv_w, qkv_b, proj_w, proj_b;
    at::Tensor norm2_w, norm2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  ClipVision(ClipVisionConfig cfg, at::ScalarType dtype, at::Device device)
      : cfg_(cfg), dtype_(dtype), device_(device) {}
  // Fills the weights from tensors in expected_keys() order.
  void assign(const std::vector<at::Tensor>& tensors);
  at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  at::Tensor attention(const at::Tensor& x, const Block& blk) const;

  ClipVisionConfig cfg_;
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor patch_w_;  // [dim, 3 * patch * patch], the conv weight flattened (c, ky, kx)
  at::Tensor cls_, pos_, pre_w_, pre_b_;  // pre-norm weights kept in float32
  std::vector<Block> blocks_;             // norm weights in float32, the rest in dtype_
};

}  // namespace wm::dit
