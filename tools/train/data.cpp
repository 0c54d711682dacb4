#include "tools/train/data.h"

#include <algorithm>
#include <limits>

#include "runtime/error.h"
#include "tools/rollout/world_adapter.h"
#include "tools/world/raycaster.h"
#include "tools/world/rng.h"
#include "tools/world/suite.h"
#include "worldkv/compression.h"
#include "worldkv/conditioning.h"
#include "worldkv/pose_index.h"

namespace wm::train {

Sample make_sample(uint64_t seed, const dit::DitConfig& cfg, const dit::Codec& codec, const SampleOptions& opt) {
  world::Rng rng(seed);
  world::TrajectoryOptions topt;
  topt.min_seconds = opt.min_seconds;
  topt.max_seconds = opt.max_seconds;
  topt.render.width = codec.image_width();
  topt.render.height = codec.image_height();
  topt.render.fov_deg = cfg.cond.hfov_deg;
  world::Episode ep = world::generate_episode(rng.fork(), topt);
  const world::Scene scene = world::scene_of(ep);
  const int F = cfg.frames_per_chunk;
  const int n_chunks = ep.frames() / F;
  WM_CHECK(n_chunks >= 2, "a trajectory of ", ep.frames(), " frames is too short");

  Sample s;
  int target = -1;
  if (!ep.revisits.empty() && rng.uniform() < opt.revisit_prob) {
    const auto& pr = ep.revisits[rng.next() % ep.revisits.size()];
    target = pr.revisit / F;
    s.first_visit_chunk = pr.first / F;
    if (target >= n_chunks || s.first_visit_chunk >= target - 1 || s.first_visit_chunk < 1) {
      target = -1;
      s.first_visit_chunk = -1;
    } else {
      s.revisit = true;
    }
  }
  if (target < 0) target = static_cast<int>(rng.next() % n_chunks);

  // Mean memory pose per chunk, for retrieval as worldkv does it.
  auto chunk_pose = [&](int c) {
    std::vector<world::Pose> p(ep.poses.begin() + c * F, ep.poses.begin() + (c + 1) * F);
    return worldkv::mean_pose(rollout::model_poses(p));
  };
  std::vector<int> chunks;
  const bool sliding = opt.sliding_prob > 0 && rng.uniform() < opt.sliding_prob;
  if (sliding) {
    for (int c = std::max(0, target - opt.sliding_chunks); c < target; ++c) chunks.push_back(c);
    if (s.revisit && std::find(chunks.begin(), chunks.end(), s.first_visit_chunk) == chunks.end()) s.revisit = false;
  } else if (target >= 1) {
    chunks.push_back(0);
  }
  if (!sliding && target >= 3) {
    std::vector<int> picked;
    if (rng.uniform() < opt.random_ctx_prob) {
      std::vector<int> pool;
      for (int c = 1; c <= target - 2; ++c) pool.push_back(c);
      for (int k = 0; k < opt.retrieved && !pool.empty(); ++k) {
        const size_t j = rng.next() % pool.size();
        picked.push_back(pool[j]);
        pool.erase(pool.begin() + j);
      }
      if (s.revisit && std::find(picked.begin(), picked.end(), s.first_visit_chunk) == picked.end()) s.revisit = false;
    } else {
      worldkv::PoseIndex index;
      for (int c = 1; c <= target - 2; ++c) index.add(std::to_string(c), chunk_pose(c));
      for (auto& sc : index.nearest(chunk_pose(target), opt.retrieved)) picked.push_back(std::stoi(sc.id));
      if (s.revisit && std::find(picked.begin(), picked.end(), s.first_visit_chunk) == picked.end()) s.revisit = false;
    }
    std::sort(picked.begin(), picked.end());
    s.retrieved_begin = static_cast<int>(chunks.size());
    chunks.insert(chunks.end(), picked.begin(), picked.end());
    s.retrieved_end = static_cast<int>(chunks.size());
  }
  if (!sliding && target >= 2) chunks.push_back(target - 1);
  chunks.push_back(target);
  if (!s.revisit) s.first_visit_chunk = -1;

  world::RenderSpec rs = topt.render;
  world::Raycaster ray(scene, rs);
  std::vector<Image> frames;
  std::vector<world::Pose> poses;
  std::vector<world::Action> actions;
  std::vector<int64_t> fidx;
  for (int c : chunks)
    for (int f = c * F; f < (c + 1) * F; ++f) {
      frames.push_back(ray.render(ep.poses[f]));
      poses.push_back(ep.poses[f]);
      actions.push_back(ep.actions[f]);
      fidx.push_back(f);
    }
  s.latents = codec.encode_images(frames, at::kCPU);
  s.frame_index = at::tensor(fidx, at::kLong);
  s.pose = worldkv::pose_tensor(rollout::model_poses(poses));
  s.action = worldkv::action_tensor(rollout::model_actions(actions), cfg.cond.action_dim);
  s.chunks = chunks;
  return s;
}

at::Tensor visibility(int S, int K) {
  WM_CHECK(S >= 1 && K >= 1 && K <= S, "bad teacher-forcing layout: ", S, " chunks, ", K, " noisy");
  const int C = S - 1;  // clean context chunks
  at::Tensor v = at::zeros({C + K, C + K}, at::kBool);
  for (int j = 0; j < C; ++j)
    for (int jj = 0; jj <= j; ++jj) v[j][jj] = true;
  for (int k = 0; k < K; ++k) {
    const int c = S - K + k;  // chunk position of this noisy copy
    for (int jj = 0; jj < c; ++jj) v[C + k][jj] = true;
    v[C + k][C + k] = true;
  }
  return v;
}

void hide_compressed_tokens(at::Tensor& bias, const Sample& s, const dit::DitConfig& cfg, double keep) {
  const int64_t F = cfg.frames_per_chunk, P = cfg.tokens_per_frame(), tpc = F * P;
  const int64_t n = bias.size(0);
  WM_CHECK(bias.dim() == 2 && bias.size(1) == n && n >= static_cast<int64_t>(s.chunks.size() - 1) * tpc,
           "attention bias ", bias.sizes(), " does not fit a sample of ", s.chunks.size(), " chunks");
  worldkv::CompressionConfig cc;
  cc.keep_ratio = keep;
  for (int c = s.retrieved_begin; c < s.retrieved_end; ++c) {
    // The chunk's latent patches, one row per token, ranked by worldkv_c's own rule (as one
    // "head" of patch-sized keys).
    at::Tensor x = s.latents.narrow(0, c * F, F);  // [F, C, h, w]
    at::Tensor tok = x.reshape({F, x.size(1), cfg.grid_h(), cfg.patch_h, cfg.grid_w(), cfg.patch_w})
                         .permute({0, 2, 4, 1, 3, 5})
                         .reshape({1, F * P, -1});
    at::Tensor hidden = at::ones({tpc}, at::kBool);
    hidden.index_fill_(0, worldkv::compression_keep_indices(tok, P, cc), false);
    if (!hidden.any().item<bool>()) continue;
    const int64_t r0 = (c + 1) * tpc;  // rows of every later chunk
    bias.narrow(0, r0, n - r0)
        .index_fill_(1, (hidden.nonzero().squeeze(1) + c * tpc).to(bias.device()),
                     -std::numeric_limits<float>::infinity());
  }
}

}  // namespace wm::train
