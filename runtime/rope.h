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

// Rotates the interleaved channel pairs [first, first + 2 * pairs) of x [..., n, d]: pair j,
// channels (first + 2j, first + 2j + 1), turns by the angle whose cosine and sine are
// cos[..., j] and sin[..., j] ([..., n, pairs], broadcast against x's leading dims; any dtype
// and device). The other channels are copied. Computed in float32 (float64 for double x);
// returns a new tensor of x's dtype on x's device. Throws wm::Error if the channels do not fit.
at::Tensor rotate_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t first,
                        int64_t pairs);

// cos and sin [n, rotated/2] (of `dtype`, on `device`) for positions pos [n, n_axes], the
// angles taken in float64 before the cast.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& pos, const RopeSpec& spec,
                                               at::Device device, at::ScalarType dtype = at::kFloat);

}  // namespace wm
