#include "runtime/rope.h"

#include <cmath>
#include <vector>

#include "runtime/error.h"

namespace wm {
namespace {

// Channel index of the first and the second element of every rotated pair, in pair order.
std::pair<std::vector<int64_t>, std::vector<int64_t>> pair_channels(const RopeSpec& spec) {
  std::vector<int64_t> a, b;
  int off = 0;
  for (auto& ax : spec.axes) {
    const int half = ax.channels / 2;
    for (int j = 0; j < half; ++j) {
      if (spec.style == RopeStyle::Interleaved) {
        a.push_back(off + 2 * j);
        b.push_back(off + 2 * j + 1);
      } else {
        a.push_back(off + j);
        b.push_back(off + half + j);
      }
    }
    off += ax.channels;
  }
  return {a, b};
}

at::ScalarType compute_dtype(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

// Rotates pairs of x by the angles' cos/sin [n or 1, P] (broadcast over leading dims).
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const RopeSpec& spec) {
  const int64_t d = x.size(-1);
  spec.validate(static_cast<int>(d));
  const int rot = spec.rotated_channels();
  if (spec.style == RopeStyle::Interleaved) return rotate_pairs(x, cos, sin, 0, rot / 2);
  const auto ct = compute_dtype(x.scalar_type());
  at::Tensor xf = x.to(ct);
  at::Tensor c = cos.to(xf.device(), ct), s = sin.to(xf.device(), ct);
  auto [ia, ib] = pair_channels(spec);
  auto opt = at::TensorOptions().dtype(at::kLong).device(xf.device());
  at::Tensor ta = at::tensor(ia, opt), tb = at::tensor(ib, opt);
  at::Tensor x0 = xf.index_select(-1, ta), x1 = xf.index_select(-1, tb);
  at::Tensor out = xf.clone();
  out.index_copy_(-1, ta, x0 * c - x1 * s);
  out.index_copy_(-1, tb, x0 * s + x1 * c);
  return out.to(x.scalar_type());
}

}  // namespace

at::Tensor rotate_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t first,
                        int64_t pairs) {
  WM_CHECK(x.dim() >= 1 && first >= 0 && pairs >= 0 && first + 2 * pairs <= x.size(-1), "channel pairs [", first,
           ", ", first + 2 * pairs, ") do not fit x ", x.sizes());
  const int64_t d = x.size(-1);
  const auto ct = compute_dtype(x.scalar_type());
  at::Tensor xf = x.to(ct);
  if (pairs == 0) return xf.to(x.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  at::Tensor c = cos.to(xf.device(), ct), s = sin.to(xf.device(), ct);
  // Pairs are adjacent: a view does the split.
  auto shape = xf.sizes().vec();
  shape.back() = pairs;
  shape.push_back(2);
  at::Tensor pr = xf.narrow(-1, first, 2 * pairs).reshape(shape);
  at::Tensor x0 = pr.select(-1, 0), x1 = pr.select(-1, 1);
  at::Tensor r = at::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1).flatten(-2);
  std::vector<at::Tensor> parts;
  if (first > 0) parts.push_back(xf.narrow(-1, 0, first));
  parts.push_back(r);
  if (first + 2 * pairs < d) parts.push_back(xf.narrow(-1, first + 2 * pairs, d - first - 2 * pairs));
  return (parts.size() == 1 ? r : at::cat(parts, -1)).to(x.scalar_type());
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& pos, const RopeSpec& spec, at::Device device,
                                               at::ScalarType dtype) {
  WM_CHECK(pos.dim() == 2 && pos.size(1) == spec.n_axes(), "positions must be [n, ", spec.n_axes(),
           "], got ", pos.sizes());
  // Per pair: which axis it reads and its frequency, in float64.
  std::vector<double> freq;
  std::vector<int64_t> axis_of;
  for (int a = 0; a < spec.n_axes(); ++a) {
    const auto& ax = spec.axes[a];
    for (int j = 0; j < ax.channels / 2; ++j) {
      freq.push_back(std::pow(ax.theta, -2.0 * j / ax.channels));
      axis_of.push_back(a);
    }
  }
  auto dopt = at::TensorOptions().dtype(at::kDouble).device(pos.device());
  at::Tensor f = at::tensor(freq, dopt);
  at::Tensor which = at::tensor(axis_of, at::TensorOptions().dtype(at::kLong).device(pos.device()));
  at::Tensor ang = pos.to(at::kDouble).index_select(1, which) * f;  // [n, P], exact in float64
  return {ang.cos().to(device, dtype), ang.sin().to(device, dtype)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& pos, const RopeSpec& spec) {
  WM_CHECK(x.dim() >= 2, "x must be [..., n, head_dim], got ", x.sizes());
  WM_CHECK(pos.dim() == 2 && (pos.size(0) == x.size(-2) || pos.size(0) == 1),
           "positions must be [n=", x.size(-2), " or 1, n_axes], got ", pos.sizes());
  auto [c, s] = rope_cos_sin(pos, spec, x.device(), compute_dtype(x.scalar_type()));
  return rotate(x, c, s, spec);
}

at::Tensor reanchor(const at::Tensor& x, const RopeSpec& spec, int axis, int64_t delta) {
  WM_CHECK(axis >= 0 && axis < spec.n_axes(), "axis ", axis, " out of range for ", spec.n_axes(), " axes");
  at::Tensor pos = at::zeros({1, spec.n_axes()}, at::kLong);
  pos[0][axis] = delta;
  return apply_rope(x, pos, spec);
}

}  // namespace wm
