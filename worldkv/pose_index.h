#pragma once
// Retrieval of banked chunks by camera pose. Distance to the query pose:
//   0.5 * d_t / max_c d_t  +  0.5 * d_r / max_c d_r
// with d_t the squared translation distance, d_r the geodesic rotation angle, both normalised
// by their maximum over the candidates (a term whose maximum is 0 contributes 0).
#include <string>
#include <unordered_set>
#include <vector>

#include "worldkv/pose.h"

namespace wm::worldkv {

struct Scored {
  std::string id;
  double distance;
};

class PoseIndex {
 public:
  // Adds or replaces a chunk's pose.
  void add(const std::string& id, const Pose& pose);
  bool remove(const std::string& id);
  size_t size() const { return ids_.size(); }
  // The k nearest candidates (all indexed chunks not in `exclude`), nearest first; ties go to
  // the older chunk (earlier insertion).
  std::vector<Scored> nearest(const Pose& query, size_t k, const std::unordered_set<std::string>& exclude = {}) const;

 private:
  std::vector<std::string> ids_;
  std::vector<Pose> poses_;
};

}  // namespace wm::worldkv
