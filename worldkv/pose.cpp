#include "worldkv/pose.h"

#include <Eigen/Dense>
#include <cmath>

#include "runtime/error.h"

namespace wm::worldkv {
namespace {

Eigen::Matrix3d to_eigen(const Rotation& r) {
  Eigen::Matrix3d m;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) m(i, j) = r[3 * i + j];
  return m;
}

}  // namespace

Rotation rotation_of(const Pose& p) {
  const double cy = std::cos(p.yaw), sy = std::sin(p.yaw), cp = std::cos(p.pitch), sp = std::sin(p.pitch);
  // Rz(yaw) * Ry(pitch)
  Eigen::Matrix3d rz, ry;
  rz << cy, -sy, 0, sy, cy, 0, 0, 0, 1;
  ry << cp, 0, sp, 0, 1, 0, -sp, 0, cp;
  Eigen::Matrix3d m = rz * ry;
  Rotation r;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) r[3 * i + j] = m(i, j);
  return r;
}

double geodesic_angle(const Rotation& a, const Rotation& b) {
  const Eigen::Matrix3d rel = to_eigen(a).transpose() * to_eigen(b);
  const double c = std::clamp((rel.trace() - 1.0) / 2.0, -1.0, 1.0);
  return std::acos(c);
}

double geodesic_angle(const Pose& a, const Pose& b) { return geodesic_angle(rotation_of(a), rotation_of(b)); }

Pose mean_pose(const std::vector<Pose>& frames) {
  WM_CHECK(!frames.empty(), "the mean of no poses is undefined");
  Pose m;
  Eigen::Matrix3d sum = Eigen::Matrix3d::Zero();
  for (auto& f : frames) {
    m.x += f.x;
    m.y += f.y;
    m.z += f.z;
    sum += to_eigen(rotation_of(f));
  }
  const double n = static_cast<double>(frames.size());
  m.x /= n;
  m.y /= n;
  m.z /= n;
  // Project the mean matrix onto SO(3): U V^T with the sign fixed.
  Eigen::JacobiSVD<Eigen::Matrix3d> svd(sum / n, Eigen::ComputeFullU | Eigen::ComputeFullV);
  Eigen::Matrix3d d = Eigen::Matrix3d::Identity();
  d(2, 2) = (svd.matrixU() * svd.matrixV().transpose()).determinant() < 0 ? -1.0 : 1.0;
  Eigen::Matrix3d r = svd.matrixU() * d * svd.matrixV().transpose();
  // Back to yaw and pitch: r = Rz(yaw) Ry(pitch) => r(2,0) = -sin(pitch), r(1,0)/r(0,0) = tan(yaw).
  m.pitch = std::asin(std::clamp(-r(2, 0), -1.0, 1.0));
  m.yaw = std::atan2(r(1, 0), r(0, 0));
  return m;
}

Matrix4 opencv_camera_to_world(const Pose& p) {
  const double cy = std::cos(p.yaw), sy = std::sin(p.yaw), cp = std::cos(p.pitch), sp = std::sin(p.pitch);
  // Columns in W = (y, -z, x): right, down = forward x right, forward; then the position.
  const Eigen::Vector3d right(cy, 0.0, -sy), fwd(sy * cp, -sp, cy * cp);
  const Eigen::Vector3d down = fwd.cross(right);
  const Eigen::Vector3d t(p.y, -p.z, p.x);
  Matrix4 m{};
  for (int r = 0; r < 3; ++r) {
    m[4 * r + 0] = right(r);
    m[4 * r + 1] = down(r);
    m[4 * r + 2] = fwd(r);
    m[4 * r + 3] = t(r);
  }
  m[15] = 1.0;
  return m;
}

Pose pose_from_opencv(const Matrix4& m) {
  for (double v : m) WM_CHECK(std::isfinite(v), "a camera-to-world matrix with a non-finite entry");
  const double fx = m[2], fy = m[6], fz = m[10];  // the forward column in W
  Pose p;
  p.x = m[11];
  p.y = m[3];
  p.z = -m[7];
  p.yaw = std::atan2(fx, fz);
  p.pitch = std::atan2(-fy, std::hypot(fx, fz));
  return p;
}

std::vector<double> to_vector(const Pose& p) { return {p.x, p.y, p.z, p.yaw, p.pitch}; }

Pose from_vector(const std::vector<double>& v) {
  WM_CHECK(v.size() == 5, "a pose vector has 5 entries (x, y, z, yaw, pitch), got ", v.size());
  return Pose{v[0], v[1], v[2], v[3], v[4]};
}

}  // namespace wm::worldkv
