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
#include "worldkv/world_memory.h"

namespace wm::train {

namespace {

template <class T>
bool contains(const std::vector<T>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

worldkv::MemoryConfig window_config(const SampleOptions& opt, const dit::DitConfig& cfg, bool sliding) {
  worldkv::MemoryConfig m = opt.memory;
  m.frames_per_chunk = cfg.frames_per_chunk;
  m.denoise_frames = cfg.frames_per_chunk;
  m.tokens_per_frame = cfg.tokens_per_frame();
  if (sliding) m.policy = worldkv::Policy::SlidingWindow;
  return m;
}

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
  const worldkv::MemoryConfig mem = window_config(opt, cfg, false);
  int target = -1;
  if (!ep.revisits.empty() && rng.uniform() < opt.revisit_prob) {
    const auto& pr = ep.revisits[rng.next() % ep.revisits.size()];
    target = pr.revisit / F;
    s.first_visit_chunk = pr.first / F;
    // A revisit asks the memory to bring the first visit back: it must be banked by then.
    const bool retrievable =
        target < n_chunks && contains(worldkv::window_chunks(mem, target).banked, s.first_visit_chunk);
    if (!retrievable) {
      target = -1;
      s.first_visit_chunk = -1;
    } else {
      s.revisit = true;
    }
  }
  if (target < 0) target = static_cast<int>(rng.next() % n_chunks);

  // Mean memory pose per chunk, for retrieval as worldkv does it.
  auto chunk_pose = [&](int64_t c) {
    std::vector<world::Pose> p(ep.poses.begin() + c * F, ep.poses.begin() + (c + 1) * F);
    return worldkv::mean_pose(rollout::model_poses(p));
  };
  const bool sliding = opt.sliding_prob > 0 && rng.uniform() < opt.sliding_prob;
  const worldkv::WindowChunks w = worldkv::window_chunks(sliding ? window_config(opt, cfg, true) : mem, target);
  std::vector<int64_t> picked;
  if (!w.banked.empty() && w.retrieved_slots > 0) {
    if (rng.uniform() < opt.random_ctx_prob) {
      std::vector<int64_t> pool = w.banked;
      for (int k = 0; k < w.retrieved_slots && !pool.empty(); ++k) {
        const size_t j = rng.next() % pool.size();
        picked.push_back(pool[j]);
        pool.erase(pool.begin() + j);
      }
    } else {
      worldkv::PoseIndex index;
      for (int64_t c : w.banked) index.add(std::to_string(c), chunk_pose(c));
      for (auto& sc : index.nearest(chunk_pose(target), w.retrieved_slots)) picked.push_back(std::stoll(sc.id));
    }
    std::sort(picked.begin(), picked.end());
  }
  std::vector<int> chunks(w.sink.begin(), w.sink.end());
  s.retrieved_begin = static_cast<int>(chunks.size());
  chunks.insert(chunks.end(), picked.begin(), picked.end());
  s.retrieved_end = static_cast<int>(chunks.size());
  chunks.insert(chunks.end(), w.recent.begin(), w.recent.end());
  chunks.push_back(target);
  if (s.revisit && !contains(chunks, s.first_visit_chunk)) s.revisit = false;  // the window missed it
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
  s.frames = dit::images_to_tensor(frames);
  s.latents = codec.encode(s.frames, at::kCPU);
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

SamplePrefetcher::SamplePrefetcher(int threads, std::function<uint64_t(int64_t)> seed_of,
                                   const dit::DitConfig& cfg, const dit::Codec& codec, SampleOptions opt)
    : threads_(std::max(0, threads)), seed_of_(std::move(seed_of)), cfg_(cfg), codec_(codec), opt_(std::move(opt)) {}

SamplePrefetcher::~SamplePrefetcher() {
  for (auto& [step, f] : ahead_)
    if (f.valid()) f.wait();  // the workers read cfg_ and codec_: let them finish first
}

Sample SamplePrefetcher::take(int64_t step) {
  // Samples of steps before this one (a resumed or restarted count) are not wanted any more.
  while (!ahead_.empty() && ahead_.begin()->first < step) {
    ahead_.begin()->second.wait();
    ahead_.erase(ahead_.begin());
  }
  for (int64_t k = step + 1; k <= step + threads_; ++k)
    if (!ahead_.count(k)) {
      const uint64_t seed = seed_of_(k);
      ahead_.emplace(k, std::async(std::launch::async, [this, seed] { return make_sample(seed, cfg_, codec_, opt_); }));
    }
  auto it = ahead_.find(step);
  if (it == ahead_.end()) return make_sample(seed_of_(step), cfg_, codec_, opt_);
  Sample s = it->second.get();  // rethrows a worker's exception
  ahead_.erase(it);
  return s;
}

}  // namespace wm::train
