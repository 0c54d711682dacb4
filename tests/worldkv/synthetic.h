#pragma once
// Helpers shared by the world memory's tests.
#include <ATen/ATen.h>

#include <vector>

#include "runtime/block.h"
#include "runtime/kv_spec.h"
#include "runtime/rope.h"
#include "worldkv/pose.h"

namespace wm::worldkv {

// A synthetic "model": chunk i's K/V are random, rotated at positions (t = frame, h, w).
struct Synthetic {
  KvSpec spec;
  int64_t tpf = 4;  // a 2x2 latent grid
  Synthetic() {
    spec.n_layers = 2;
    spec.n_kv_heads = 2;
    spec.head_dim = 12;
    spec.rope = RopeSpec::video3d(12);
  }
  at::Tensor positions(int64_t chunk, int fpc) const {
    std::vector<int64_t> p;
    for (int f = 0; f < fpc; ++f)
      for (int h = 0; h < 2; ++h)
        for (int w = 0; w < 2; ++w) p.insert(p.end(), {chunk * fpc + f, h, w});
    return at::tensor(p, at::kLong).view({-1, 3});
  }
  std::vector<LayerKv> chunk(int64_t i, int fpc, std::vector<at::Tensor>* raw = nullptr) const {
    std::vector<LayerKv> out;
    at::Tensor pos = positions(i, fpc);
    for (int l = 0; l < spec.n_layers; ++l) {
      at::Tensor r = at::randn({2, fpc * tpf, 12});
      if (raw) raw->push_back(r);
      out.push_back({apply_rope(r, pos, spec.rope), at::randn({2, fpc * tpf, 12}), pos, at::Tensor()});
    }
    return out;
  }
};

// n frames at (x, 0, 0) looking along yaw.
inline std::vector<Pose> poses_at(double x, double yaw, int n = 3) { return std::vector<Pose>(n, Pose{x, 0, 0, yaw, 0}); }

}  // namespace wm::worldkv
