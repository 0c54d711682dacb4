#pragma once
// Matrix-Game-2.0's sampler and its native KV window.
//
// Schedule: upstream's FlowMatchScheduler(shift 5, 1000 training steps, extra_one_step) with
// warped steps: sigma_i = 1 - i/1000 (float32 linspace), shifted 5s / (1 + 4s), timestep
// 1000 * sigma; the chunk's steps are the table at indices 1000 - step for step in the list
// ([1000, 666, 333] -> 1000, 908.8427, 713.9794; templerun [1000, 750, 500, 250]).
// Per chunk (x0-prediction with re-noising, Self-Forcing / DMD style):
//   x = noise; for each step i: flow = DiT(x, t_i); x0 = x - sigma_i * flow (float64);
//     if not last: x = (1 - sigma_{i+1}) * x0 + sigma_{i+1} * fresh noise
//   then the refresh pass DiT(x0, t = 0) writes the chunk's K/V (main and action) that stay.
// Native window (upstream's rolling cache): a chunk attends to the last local_attn_size - 3
// latent frames before it (3 for universal and templerun, 1 for gta_drive) and itself; no sink.
#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "dit/mg2_model.h"

namespace wm::dit {

struct Mg2Schedule {
  std::vector<float> timesteps;  // what the DiT sees, descending, 0..1000
  std::vector<float> sigmas;     // the noise level of each (upstream's table value)
};

// The release's step list for a config: templerun {1000, 750, 500, 250}, otherwise {1000, 666, 333}.
std::vector<int> mg2_default_steps(const Mg2Config& c);
// The warped schedule of a step list (each in 1..1000, descending). Throws wm::Error otherwise.
Mg2Schedule mg2_schedule(const std::vector<int>& steps, double shift = 5.0);

// Fresh noise for the re-noising after step i of the current chunk, shaped as the chunk.
using Mg2Noise = std::function<at::Tensor(int step, at::IntArrayRef shape)>;

// A chunk's denoising as the model saw it (conformance checks, debugging).
struct Mg2ChunkTrace {
  std::vector<at::Tensor> x, t, flow;  // per call, the refresh pass last
};

struct Mg2ChunkResult {
  at::Tensor latents;  // [F, 16, 44, 80] clean, in the model's dtype
  Mg2ChunkKv kv;       // what the refresh pass wrote
};

// Called after each DiT call of a chunk (call = step index, the refresh pass last) with the tensor
// that call's work ends in (the next x, the clean latents, the refresh pass's last keys): a
// benchmark synchronises on it and reads its clock.
using Mg2AfterCall = std::function<void(size_t call, const at::Tensor& result)>;

// One chunk: noise [F, 16, 44, 80] (the chunk's share of the rollout's one draw), cond [F, 20, 44,
// 80], first_frame its absolute latent frame, ctx what it attends to besides itself. renoise is
// called after every step but the last.
Mg2ChunkResult mg2_generate_chunk(Mg2DitImpl& model, const at::Tensor& noise, const at::Tensor& cond,
                                  const Mg2Visual& visual, const Mg2Actions& actions, int64_t first_frame,
                                  const Mg2Context& ctx, const Mg2Schedule& schedule, const Mg2Noise& renoise,
                                  Mg2ChunkTrace* trace = nullptr, const Mg2AfterCall& after_call = {});

// Upstream's rolling KV cache: keeps the last keep_frames latent frames of main and action K/V.
class Mg2NativeCache {
 public:
  // keep_frames = local_attn_size - frames_per_chunk; tokens_per_frame = 880.
  Mg2NativeCache(int64_t keep_frames, int64_t tokens_per_frame);
  // The context for the next chunk (valid until the next commit or clear).
  Mg2Context context() const;
  // Appends a chunk's K/V and drops what falls out of the window.
  void commit(const Mg2ChunkKv& kv);
  void clear();
  int64_t frames() const { return frames_; }
  const std::vector<LayerKv>& main() const { return main_; }
  const ActionKv& action() const { return action_; }
  size_t nbytes() const;

 private:
  int64_t keep_, tpf_, frames_ = 0;
  std::vector<LayerKv> main_;
  ActionKv action_;
};

}  // namespace wm::dit
