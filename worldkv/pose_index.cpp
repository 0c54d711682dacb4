#include "worldkv/pose_index.h"

#include <algorithm>
#include <numeric>

namespace wm::worldkv {

void PoseIndex::add(const std::string& id, const Pose& pose) {
  auto it = std::find(ids_.begin(), ids_.end(), id);
  if (it != ids_.end()) {
    poses_[it - ids_.begin()] = pose;
    return;
  }
  ids_.push_back(id);
  poses_.push_back(pose);
}

bool PoseIndex::remove(const std::string& id) {
  auto it = std::find(ids_.begin(), ids_.end(), id);
  if (it == ids_.end()) return false;
  poses_.erase(poses_.begin() + (it - ids_.begin()));
  ids_.erase(it);
  return true;
}

std::vector<Scored> PoseIndex::nearest(const Pose& q, size_t k, const std::unordered_set<std::string>& exclude) const {
  std::vector<size_t> cand;
  for (size_t i = 0; i < ids_.size(); ++i)
    if (!exclude.count(ids_[i])) cand.push_back(i);
  std::vector<double> dt(cand.size()), dr(cand.size());
  double mt = 0, mr = 0;
  const Rotation rq = rotation_of(q);
  for (size_t j = 0; j < cand.size(); ++j) {
    const Pose& p = poses_[cand[j]];
    dt[j] = (p.x - q.x) * (p.x - q.x) + (p.y - q.y) * (p.y - q.y) + (p.z - q.z) * (p.z - q.z);
    dr[j] = geodesic_angle(rq, rotation_of(p));
    mt = std::max(mt, dt[j]);
    mr = std::max(mr, dr[j]);
  }
  std::vector<Scored> out;
  for (size_t j = 0; j < cand.size(); ++j)
    out.push_back({ids_[cand[j]], 0.5 * (mt > 0 ? dt[j] / mt : 0.0) + 0.5 * (mr > 0 ? dr[j] / mr : 0.0)});
  std::stable_sort(out.begin(), out.end(), [](const Scored& a, const Scored& b) { return a.distance < b.distance; });
  if (out.size() > k) out.resize(k);
  return out;
}

}  // namespace wm::worldkv
