#include "dit/conditioning.h"

#include <cmath>

#include "runtime/error.h"
#include "runtime/rope.h"

namespace wm::dit {
namespace {

// Fourier features of positions xy [..., 2] (float64) -> [..., 4 * bands].
at::Tensor position_fourier(const at::Tensor& xy, const CondConfig& c) {
  if (c.pos_bands == 0) return at::empty({0}, xy.options());
  std::vector<double> f;
  for (int k = 0; k < c.pos_bands; ++k) f.push_back(std::ldexp(M_PI, k) / c.pos_scale);
  at::Tensor freq = at::tensor(f, xy.options());                     // [K]
  at::Tensor ang = (xy.unsqueeze(-1) * freq).flatten(-2);            // [..., 2K]
  return at::cat({ang.sin(), ang.cos()}, -1);                        // [..., 4K]
}

// Harmonics of a yaw in degrees [...] (float64) -> [..., 2 * M].
at::Tensor yaw_harmonics(const at::Tensor& yaw_deg, const CondConfig& c) {
  if (c.yaw_harmonics == 0) return at::empty({0}, yaw_deg.options());
  at::Tensor m = at::arange(1, c.yaw_harmonics + 1, yaw_deg.options());
  at::Tensor ang = yaw_deg.unsqueeze(-1) * (M_PI / 180.0) * m;
  return at::cat({ang.sin(), ang.cos()}, -1);
}

void check_pose(const at::Tensor& pose) {
  WM_CHECK(pose.defined() && pose.dim() == 3 && pose.size(2) == 3, "pose must be [B, F, 3] (x, y, yaw_deg), got ",
           pose.defined() ? pose.sizes() : at::IntArrayRef{});
}

}  // namespace

FrameCond FrameCond::slice(int64_t begin, int64_t n) const {
  auto sl = [&](const at::Tensor& x) {
    if (!x.defined()) return x;
    return x.narrow(x.dim() - 2, begin, n);
  };
  auto sl_ref = [&](const at::Tensor& x) {
    if (!x.defined()) return x;
    return x.narrow(x.dim() - 4, begin, n);
  };
  return {sl(pose), sl(action), sl_ref(reference)};
}

int64_t n_camera_features(const CondConfig& c) { return 4 * c.pos_bands + 2 * c.yaw_harmonics; }

at::Tensor pose_features(const at::Tensor& pose, const CondConfig& c) {
  check_pose(pose);
  at::Tensor p = pose.to(at::kDouble);
  std::vector<at::Tensor> parts;
  if (c.pos_bands > 0) parts.push_back(position_fourier(p.narrow(-1, 0, 2), c));
  if (c.yaw_harmonics > 0) parts.push_back(yaw_harmonics(p.select(-1, 2), c));
  WM_CHECK(!parts.empty(), "no camera features: pos_bands and yaw_harmonics are both 0");
  return at::cat(parts, -1).to(at::kFloat);
}

at::Tensor column_yaw_offsets_deg(const CondConfig& c, int64_t grid_w) {
  const double half = std::tan(c.hfov_deg * M_PI / 360.0);
  at::Tensor j = at::arange(grid_w, at::TensorOptions().dtype(at::kDouble));
  at::Tensor cam_x = (j + 0.5) * (2.0 / grid_w) - 1.0;
  return at::atan(cam_x * half) * (180.0 / M_PI);
}

at::Tensor token_ray_yaw_deg(const at::Tensor& pose, const CondConfig& c, int64_t grid_h, int64_t grid_w) {
  check_pose(pose);
  at::Tensor p = pose.to(at::kDouble);
  const int64_t B = p.size(0), F = p.size(1);
  at::Tensor off = column_yaw_offsets_deg(c, grid_w).to(p.device());                // [gw]
  at::Tensor ray = p.select(-1, 2).view({B, F, 1, 1}) + off.view({1, 1, 1, grid_w});  // [B, F, 1, gw]
  return ray.expand({B, F, grid_h, grid_w}).reshape({B, F * grid_h * grid_w});
}

at::Tensor apply_yaw_rope(const at::Tensor& x, const at::Tensor& yaw_deg, int64_t first, int64_t pairs) {
  WM_CHECK(x.dim() == 4 && first >= 0 && first + 2 * pairs <= x.size(3), "x must be [B, H, n, d] with channels [",
           first, ", ", first + 2 * pairs, ") inside d, got ", x.sizes());
  WM_CHECK(yaw_deg.dim() == 2 && yaw_deg.size(0) == x.size(0) && yaw_deg.size(1) == x.size(2), "yaw must be [",
           x.size(0), ", ", x.size(2), "], got ", yaw_deg.sizes());
  if (pairs == 0) return x;
  at::Tensor m = at::arange(1, pairs + 1, yaw_deg.options().dtype(at::kDouble));
  at::Tensor ang = (yaw_deg.to(at::kDouble) * (M_PI / 180.0)).unsqueeze(-1) * m;  // [B, n, P] exact in float64
  const auto ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return rotate_pairs(x, ang.cos().to(x.device(), ct).unsqueeze(1), ang.sin().to(x.device(), ct).unsqueeze(1), first,
                      pairs);
}

at::Tensor ray_features(const at::Tensor& pose, const CondConfig& c, int64_t grid_w) {
  check_pose(pose);
  at::Tensor p = pose.to(at::kDouble);
  const int64_t B = p.size(0), F = p.size(1);
  std::vector<at::Tensor> parts;
  if (c.pos_bands > 0)
    parts.push_back(position_fourier(p.narrow(-1, 0, 2), c).unsqueeze(2).expand({B, F, grid_w, 4 * c.pos_bands}));
  if (c.yaw_harmonics > 0) {
    at::Tensor off = column_yaw_offsets_deg(c, grid_w).to(p.device());   // [gw]
    at::Tensor ray = p.select(-1, 2).unsqueeze(-1) + off;                // [B, F, gw]
    parts.push_back(yaw_harmonics(ray, c));
  }
  WM_CHECK(!parts.empty(), "no camera features: pos_bands and yaw_harmonics are both 0");
  return at::cat(parts, -1).to(at::kFloat);
}

at::Tensor warp_reference(const at::Tensor& src, double src_yaw_deg, const at::Tensor& yaw_deg, const CondConfig& c) {
  WM_CHECK(src.defined() && src.dim() == 3, "reference source must be [C, h, w], got ",
           src.defined() ? src.sizes() : at::IntArrayRef{});
  WM_CHECK(yaw_deg.defined() && yaw_deg.dim() == 1, "target yaws must be [F], got ",
           yaw_deg.defined() ? yaw_deg.sizes() : at::IntArrayRef{});
  WM_CHECK(std::isfinite(src_yaw_deg), "reference yaw is not finite");
  WM_CHECK(c.hfov_deg > 0 && c.hfov_deg < 180, "hfov_deg must be in (0, 180), got ", c.hfov_deg);
  const int64_t C = src.size(0), h = src.size(1), w = src.size(2), F = yaw_deg.size(0);
  const double tan_half = std::tan(c.hfov_deg * M_PI / 360.0);
  at::Tensor offsets = column_yaw_offsets_deg(c, w);                                    // [w]
  at::Tensor delta = yaw_deg.to(at::kCPU, at::kDouble) - src_yaw_deg;                   // [F]
  at::Tensor rel = delta.unsqueeze(1) + offsets.unsqueeze(0);                           // [F, w] degrees
  rel = at::remainder(rel + 180.0, 360.0) - 180.0;                                      // (-180, 180]
  at::Tensor u = (at::tan(rel * (M_PI / 180.0)) / tan_half + 1.0) * (w / 2.0) - 0.5;    // source column
  at::Tensor covered = (rel.abs() < 90.0).logical_and(u >= -0.5).logical_and(u <= w - 0.5);
  at::Tensor uc = u.clamp(0.0, static_cast<double>(w - 1));
  at::Tensor lo = uc.floor().clamp_max(static_cast<double>(std::max<int64_t>(w - 2, 0)));
  at::Tensor frac = (uc - lo).to(at::kFloat);
  at::Tensor lo_i = lo.to(at::kLong), hi_i = (lo_i + 1).clamp_max(w - 1);
  const auto dev = src.device();
  at::Tensor s = src.to(at::kFloat);
  at::Tensor mask = covered.to(at::kFloat);                                             // [F, w]
  // [C, h, F, w] gathers of the two source columns per target column.
  at::Tensor a = s.index_select(2, lo_i.flatten().to(dev)).view({C, h, F, w});
  at::Tensor b = s.index_select(2, hi_i.flatten().to(dev)).view({C, h, F, w});
  at::Tensor fr = frac.to(dev).view({1, 1, F, w}), mk = mask.to(dev).view({1, 1, F, w});
  at::Tensor warped = ((a * (1 - fr) + b * fr) * mk).permute({2, 0, 1, 3});            // [F, C, h, w]
  at::Tensor mplane = mk.view({F, 1, 1, w}).expand({F, 1, h, w});
  return at::cat({warped, mplane}, 1).contiguous();
}

}  // namespace wm::dit
