#pragma once
// What a KV cache holds: layers, kv heads, head dim, dtype, device, and how positions rotate
// keys (RoPE over one or more axes). Keys are stored already rotated.
#include <ATen/ATen.h>

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace wm {

// How a RoPE axis pairs its channels. Interleaved: (2i, 2i+1), as Wan, Self-Forcing and
// Matrix-Game do. Half: (i, i + c/2) inside the axis' channels, as Hugging Face Llama/Qwen2 do.
enum class RopeStyle { Interleaved, Half };

// One position axis: it rotates `channels` consecutive head-dim channels (even), starting
// where the previous axis ended; pair j turns by position * theta^(-2j/channels).
struct RopeAxis {
  std::string name;
  int channels = 0;
  double theta = 10000.0;
};

struct RopeSpec {
  std::vector<RopeAxis> axes;
  RopeStyle style = RopeStyle::Interleaved;

  int n_axes() const { return static_cast<int>(axes.size()); }
  // Channels rotated by all axes together; the rest of the head dim passes through unchanged.
  int rotated_channels() const;
  // Index of the axis called name; throws wm::Error if there is none.
  int axis_index(const std::string& name) const;
  // Throws wm::Error unless every axis has a positive even channel count and all fit head_dim.
  void validate(int head_dim) const;

  // Video: (t, h, w) over head_dim split as Wan does: d - 4*(d/6), 2*(d/6), 2*(d/6).
  static RopeSpec video3d(int head_dim, double theta = 10000.0);
  // Text: one axis t over all of head_dim.
  static RopeSpec text1d(int head_dim, double theta = 10000.0, RopeStyle style = RopeStyle::Half);
};

struct KvSpec {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  RopeSpec rope;

  // Bytes of K and V for one token in one layer.
  size_t bytes_per_token_layer() const;
  // Throws wm::Error naming the field on a non-positive size or a RoPE that does not fit.
  void validate() const;
  at::TensorOptions options() const { return at::TensorOptions().dtype(dtype).device(device); }
};

void to_json(nlohmann::json& j, const RopeSpec& r);
void from_json(const nlohmann::json& j, RopeSpec& r);

}  // namespace wm
