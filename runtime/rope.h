#pragma once
// Rotary position embedding over one or more axes, with no position table: angles are computed
// in float64 from the positions given, so positions of any size (past 100,000) stay exact.
#include <ATen/ATen.h>

#include "runtime/kv_spec.h"

namespace wm {

// Rotates x [..., n, head_dim] by positions pos [n, n_axes] (int64, any device) or [1, n_axes]
// (the same position for every token). Returns a new tensor of x's dtype and device. Since
// rotations compose, rotating already-rotated keys by a delta re-anchors them.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& pos, const RopeSpec& spec);

// Re-anchors stored (already rotated) keys x [..., n, head_dim] by `delta` on one axis: equal
// to RoPE of the raw keys at position + delta on that axis. V is never touched.
at::Tensor reanchor(const at::Tensor& x, const RopeSpec& spec, int axis, int64_t delta);

// cos and sin [n, rotated/2] (of `dtype`, on `device`) for positions pos [n, n_axes], the
// angles taken in float64 before the cast.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& pos, const RopeSpec& spec,
                                               at::Device device, at::ScalarType dtype = at::kFloat);

}  // namespace wm
