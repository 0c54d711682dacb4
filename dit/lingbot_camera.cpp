#include "dit/lingbot_camera.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "runtime/error.h"

namespace wm::dit {
namespace {

using Quat = std::array<double, 4>;  // x, y, z, w (scipy's scalar-last order)

// scipy Rotation.from_matrix (Markley's method: the largest of the trace and the diagonal).
Quat quat_from_matrix(const double m[3][3]) {
  const double dec[4] = {m[0][0], m[1][1], m[2][2], m[0][0] + m[1][1] + m[2][2]};
  int choice = 0;
  for (int i = 1; i < 4; ++i)
    if (dec[i] > dec[choice]) choice = i;
  Quat q;
  if (choice != 3) {
    const int i = choice, j = (i + 1) % 3, k = (j + 1) % 3;
    q[i] = 1 - dec[3] + 2 * m[i][i];
    q[j] = m[j][i] + m[i][j];
    q[k] = m[k][i] + m[i][k];
    q[3] = m[k][j] - m[j][k];
  } else {
    q = {m[2][1] - m[1][2], m[0][2] - m[2][0], m[1][0] - m[0][1], 1 + dec[3]};
  }
  const double nrm = std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]);
  for (double& v : q) v /= nrm;
  return q;
}

Quat quat_mul(const Quat& p, const Quat& q) {
  return {p[3] * q[0] + q[3] * p[0] + p[1] * q[2] - p[2] * q[1], p[3] * q[1] + q[3] * p[1] + p[2] * q[0] - p[0] * q[2],
          p[3] * q[2] + q[3] * p[2] + p[0] * q[1] - p[1] * q[0], p[3] * q[3] - p[0] * q[0] - p[1] * q[1] - p[2] * q[2]};
}

Quat quat_inv(const Quat& q) { return {-q[0], -q[1], -q[2], q[3]}; }

// scipy as_rotvec / from_rotvec (their small-angle series included).
std::array<double, 3> quat_to_rotvec(Quat q) {
  if (q[3] < 0)
    for (double& v : q) v = -v;
  const double nv = std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2]);
  const double angle = 2 * std::atan2(nv, q[3]);
  const double a2 = angle * angle;
  const double scale = angle <= 1e-3 ? 2 + a2 / 12 + 7 * a2 * a2 / 2880 : angle / std::sin(angle / 2);
  return {scale * q[0], scale * q[1], scale * q[2]};
}

Quat quat_from_rotvec(const std::array<double, 3>& r) {
  const double angle = std::sqrt(r[0] * r[0] + r[1] * r[1] + r[2] * r[2]);
  const double a2 = angle * angle;
  const double scale = angle <= 1e-3 ? 0.5 - a2 / 48 + a2 * a2 / 3840 : std::sin(angle / 2) / angle;
  return {scale * r[0], scale * r[1], scale * r[2], std::cos(angle / 2)};
}

void quat_to_matrix(const Quat& q, double* out /* row-major 3x3 */) {
  const double x = q[0], y = q[1], z = q[2], w = q[3];
  const double x2 = x * x, y2 = y * y, z2 = z * z, w2 = w * w;
  const double xy = x * y, zw = z * w, xz = x * z, yw = y * w, yz = y * z, xw = x * w;
  const double m[9] = {x2 - y2 - z2 + w2, 2 * (xy - zw),      2 * (xz + yw),
                       2 * (xy + zw),     -x2 + y2 - z2 + w2, 2 * (yz - xw),
                       2 * (xz - yw),     2 * (yz + xw),      -x2 - y2 + z2 + w2};
  for (int i = 0; i < 9; ++i) out[i] = m[i];
}

// numpy.linspace(0, stop, n): i * step (the last exactly stop).
std::vector<double> linspace0(double stop, int64_t n) {
  std::vector<double> v(n);
  if (n == 1) {
    v[0] = 0;
    return v;
  }
  const double step = stop / double(n - 1);
  for (int64_t i = 0; i < n; ++i) v[i] = double(i) * step;
  v[n - 1] = stop;
  return v;
}

// numpy.searchsorted(xs, x, side='left').
int64_t search_left(const std::vector<double>& xs, double x) {
  int64_t i = 0;
  while (i < int64_t(xs.size()) && xs[i] < x) ++i;
  return i;
}

// SE3_inverse of poses [n, 4, 4] (float32 ops as upstream).
at::Tensor se3_inverse(const at::Tensor& T) {
  at::Tensor R = T.narrow(1, 0, 3).narrow(2, 0, 3);
  at::Tensor t = T.narrow(1, 0, 3).narrow(2, 3, 1);
  at::Tensor Rinv = R.transpose(-1, -2);
  at::Tensor tinv = -at::bmm(Rinv, t);
  at::Tensor out = at::eye(4, T.options()).unsqueeze(0).repeat({T.size(0), 1, 1});
  out.narrow(1, 0, 3).narrow(2, 0, 3).copy_(Rinv);
  out.narrow(1, 0, 3).narrow(2, 3, 1).copy_(tinv);
  return out;
}

void check_poses(const at::Tensor& p, const char* what) {
  WM_CHECK(p.dim() == 3 && p.size(1) == 4 && p.size(2) == 4 && p.size(0) >= 1, what, " must be [n, 4, 4], got ",
           p.sizes());
}

}  // namespace

int64_t lingbot_latent_frames(int64_t n_video_frames, int64_t frames_per_chunk) {
  WM_CHECK(n_video_frames >= 1 && frames_per_chunk >= 1, "need >= 1 video frame and chunk size, got ",
           n_video_frames, " and ", frames_per_chunk);
  const int64_t n = (n_video_frames - 1) / 4 + 1;
  return n - n % frames_per_chunk;
}

at::Tensor lingbot_interpolate_poses(const at::Tensor& c2ws, int64_t n_out) {
  check_poses(c2ws, "poses");
  WM_CHECK(n_out >= 1, "need >= 1 output pose, got ", n_out);
  const int64_t N = c2ws.size(0);
  at::Tensor src = c2ws.to(at::kDouble).contiguous().cpu();
  auto a = src.accessor<double, 3>();
  std::vector<Quat> quats(N);
  for (int64_t i = 0; i < N; ++i) {
    double m[3][3];
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) m[r][c] = a[i][r][c];
    quats[i] = quat_from_matrix(m);
    if (i > 0) {  // upstream keeps neighbouring quaternions in one hemisphere
      double dot = 0;
      for (int k = 0; k < 4; ++k) dot += quats[i][k] * quats[i - 1][k];
      if (dot < 0)
        for (double& v : quats[i]) v = -v;
    }
  }
  const std::vector<double> xs = linspace0(double(N - 1), N), xt = linspace0(double(N - 1), n_out);
  at::Tensor out = at::zeros({n_out, 4, 4}, at::TensorOptions().dtype(at::kDouble));
  auto o = out.accessor<double, 3>();
  for (int64_t j = 0; j < n_out; ++j) {
    const double x = xt[j];
    // interp1d(kind='linear'): the segment searchsorted picks, clipped to [1, N - 1].
    int64_t hi = N == 1 ? 0 : std::min<int64_t>(std::max<int64_t>(search_left(xs, x), 1), N - 1);
    int64_t lo = N == 1 ? 0 : hi - 1;
    for (int r = 0; r < 3; ++r) {
      const double ylo = a[lo][r][3], yhi = a[hi][r][3];
      o[j][r][3] = N == 1 ? ylo : (yhi - ylo) / (xs[hi] - xs[lo]) * (x - xs[lo]) + ylo;
    }
    // Slerp: r[idx] * exp(alpha * log(inv(r[idx]) r[idx + 1])), idx = searchsorted - 1 (>= 0).
    Quat q = quats[0];
    if (N > 1) {
      const int64_t idx = std::max<int64_t>(search_left(xs, x) - 1, 0);
      const double alpha = (x - xs[idx]) / (xs[idx + 1] - xs[idx]);
      std::array<double, 3> rv = quat_to_rotvec(quat_mul(quat_inv(quats[idx]), quats[idx + 1]));
      for (double& v : rv) v *= alpha;
      q = quat_mul(quats[idx], quat_from_rotvec(rv));
    }
    double m[9];
    quat_to_matrix(q, m);
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) o[j][r][c] = m[3 * r + c];
    o[j][3][3] = 1.0;
  }
  return out.to(at::kFloat);
}

at::Tensor lingbot_relative_poses(const at::Tensor& c2ws_in) {
  check_poses(c2ws_in, "poses");
  at::Tensor c2ws = c2ws_in.to(at::kFloat).cpu();
  at::Tensor rel = at::matmul(se3_inverse(c2ws.narrow(0, 0, 1)), c2ws);
  rel[0].copy_(at::eye(4, rel.options()));
  const int64_t n = rel.size(0);
  if (n > 1) {
    at::Tensor fw = at::bmm(se3_inverse(rel.narrow(0, 0, n - 1)), rel.narrow(0, 1, n - 1));
    rel.narrow(0, 1, n - 1).copy_(fw);
  }
  return rel;
}

double lingbot_max_translation(const at::Tensor& rel) {
  check_poses(rel, "relative poses");
  return rel.to(at::kFloat).narrow(1, 0, 3).select(2, 3).norm(2, -1).max().item<double>();
}

at::Tensor lingbot_normalize_translation(const at::Tensor& rel, double scale) {
  check_poses(rel, "relative poses");
  at::Tensor out = rel.to(at::kFloat).clone();
  if (scale > 0) {
    at::Tensor t = out.narrow(1, 0, 3).select(2, 3);
    // As upstream: the float32 max divides the translations.
    t.copy_(t / at::scalar_tensor(float(scale), t.options()));
  }
  return out;
}

at::Tensor lingbot_scale_intrinsics(const at::Tensor& K, int64_t org_h, int64_t org_w, int64_t h, int64_t w) {
  WM_CHECK(K.size(-1) == 4 && K.dim() <= 2, "intrinsics must be [4] or [n, 4] (fx, fy, cx, cy), got ", K.sizes());
  WM_CHECK(org_h > 0 && org_w > 0 && h > 0 && w > 0, "bad image sizes");
  const double sx = double(w) / double(org_w), sy = double(h) / double(org_h);
  at::Tensor k = K.to(at::kFloat);
  at::Tensor fx = k.narrow(-1, 0, 1) * sx, fy = k.narrow(-1, 1, 1) * sy;
  at::Tensor cx = k.narrow(-1, 2, 1) * sx - 0.0, cy = k.narrow(-1, 3, 1) * sy - 0.0;
  return at::cat({fx, fy, cx, cy}, -1);
}

at::Tensor lingbot_camera_rays(const at::Tensor& rel_in, const at::Tensor& K_in, int64_t h, int64_t w) {
  check_poses(rel_in, "relative poses");
  WM_CHECK(K_in.numel() == 4, "intrinsics must hold 4 values (fx, fy, cx, cy), got ", K_in.sizes());
  WM_CHECK(h > 0 && w > 0, "bad image size ", h, " x ", w);
  const at::Tensor rel = rel_in.to(at::kFloat).cpu();
  const at::Tensor K = K_in.to(at::kFloat).cpu().reshape({4});
  const int64_t n = rel.size(0);
  auto fo = at::TensorOptions().dtype(at::kFloat);
  at::Tensor xr = at::arange(w, fo), yr = at::arange(h, fo);
  auto grid = at::meshgrid({yr, xr}, "ij");
  at::Tensor i = (grid[1].reshape({1, -1}) + 0.5).expand({n, h * w});
  at::Tensor j = (grid[0].reshape({1, -1}) + 0.5).expand({n, h * w});
  at::Tensor xs = (i - K[2]) / K[0] * at::ones_like(i);
  at::Tensor ys = (j - K[3]) / K[1] * at::ones_like(j);
  at::Tensor dirs = at::stack({xs, ys, at::ones_like(i)}, -1);  // [n, hw, 3]
  dirs = dirs / dirs.norm(2, -1, true);
  at::Tensor R = rel.narrow(1, 0, 3).narrow(2, 0, 3);
  at::Tensor rays_d = at::matmul(dirs, R.transpose(-1, -2));
  at::Tensor rays_o = rel.narrow(1, 0, 3).select(2, 3).unsqueeze(1).expand_as(rays_d);
  return at::cat({rays_o, rays_d}, -1).view({n, h, w, 6});
}

at::Tensor lingbot_fold_rays(const at::Tensor& rays, int64_t bh, int64_t bw) {
  WM_CHECK(rays.dim() == 4 && bh > 0 && bw > 0 && rays.size(1) % bh == 0 && rays.size(2) % bw == 0,
           "rays must be [n, h, w, c] with h, w multiples of ", bh, " x ", bw, ", got ", rays.sizes());
  const int64_t n = rays.size(0), H = rays.size(1) / bh, W = rays.size(2) / bw, c = rays.size(3);
  return rays.reshape({n, H, bh, W, bw, c}).permute({0, 5, 2, 4, 1, 3}).reshape({n, c * bh * bw, H, W}).contiguous();
}

at::Tensor lingbot_camera_input(const at::Tensor& c2ws, const at::Tensor& K, int64_t h, int64_t w,
                                int64_t frames_per_chunk) {
  check_poses(c2ws, "poses");
  WM_CHECK(h % 8 == 0 && w % 8 == 0, "the video size must be multiples of 8, got ", h, " x ", w);
  const int64_t n = lingbot_latent_frames(c2ws.size(0), frames_per_chunk);
  WM_CHECK(n >= 1, c2ws.size(0), " poses give no whole chunk of ", frames_per_chunk, " latent frames");
  at::Tensor rel = lingbot_relative_poses(lingbot_interpolate_poses(c2ws, n));
  rel = lingbot_normalize_translation(rel, lingbot_max_translation(rel));
  const at::Tensor k = lingbot_scale_intrinsics(K.reshape({-1, 4})[0], 480, 832, h, w);
  return lingbot_fold_rays(lingbot_camera_rays(rel, k, h, w), 8, 8);
}

LingbotLiveCamera::LingbotLiveCamera(const at::Tensor& K, int64_t h, int64_t w, double fixed_scale)
    : h_(h), w_(w), fixed_(fixed_scale) {
  WM_CHECK(h % 8 == 0 && w % 8 == 0 && h > 0 && w > 0, "the video size must be multiples of 8, got ", h, " x ", w);
  WM_CHECK(fixed_scale >= 0, "the fixed translation scale must be >= 0, got ", fixed_scale);
  K_ = lingbot_scale_intrinsics(K.reshape({4}), 480, 832, h, w);
}

at::Tensor LingbotLiveCamera::push(const at::Tensor& c2ws) {
  check_poses(c2ws, "poses");
  const int64_t first = frames(), F = c2ws.size(0);
  for (int64_t i = 0; i < F; ++i) poses_.push_back(c2ws[i].to(at::kFloat).cpu());
  const at::Tensor rel = lingbot_relative_poses(at::stack(poses_)).narrow(0, first, F);
  if (fixed_ > 0) {
    scale_ = fixed_;
  } else {
    scale_ = std::max(scale_, lingbot_max_translation(rel));
  }
  const at::Tensor norm = lingbot_normalize_translation(rel, scale_);
  return lingbot_fold_rays(lingbot_camera_rays(norm, K_, h_, w_), 8, 8);
}

}  // namespace wm::dit
