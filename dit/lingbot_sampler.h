#pragma once
// LingBot-World-Fast's sampler (upstream WanI2VFast.generate, wan/image2video_fast.py) and its
// native rolling KV cache.
//
// Schedule: FlowUniPCMultistepScheduler(1000 training steps, shift 1) then set_timesteps(1000,
// shift): sigma_i = linspace(sigma_max, 0, 1001)[i] in float64 with sigma_max = float32(0.999),
// shifted s' = shift s / (1 + (shift - 1) s), timestep_i = int64(1000 s'), sigmas stored as
// float32. The chunk's steps are the table at indices [0, 179, 358, 679]: t = 999, 978, 947, 825
// for shift 10. Timesteps repeat in the table (999 at indices 0..8), and upstream reads the sigma
// of a timestep two ways, both kept here:
//   x0 = x - sigma * flow in float64, sigma at the first index holding t (argmin |table - t|);
//   re-noising to the next step t' uses sigma at the second index holding t' when t' repeats
//   (scheduler.add_noise -> index_for_timestep), computed in float32: (1 - s) x0 + s noise.
// Per chunk: x = noise; 4 steps; then the clean pass DiT(x0, t = 0) writes the chunk's K/V.
// The latents stay float32 whatever the model's dtype (upstream's model returns .float()).
#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "dit/lingbot_model.h"

namespace wm::dit {

// The scheduler's table: timesteps [n] int64 and sigmas [n + 1] float32 (the last 0).
struct LingbotScheduleTable {
  at::Tensor timesteps, sigmas;
};
LingbotScheduleTable lingbot_schedule_table(double shift = 10.0, int num_train_timesteps = 1000);

struct LingbotSchedule {
  std::vector<int64_t> timesteps;  // what the DiT sees, descending
  std::vector<float> x0_sigmas;    // the sigma x0 is taken with at each step
  std::vector<float> noise_sigmas; // the sigma of re-noising to step i (entry 0 unused)
};

// The Fast schedule: the table's entries at `indices` (ascending, within the table). Throws
// wm::Error otherwise.
LingbotSchedule lingbot_schedule(const std::vector<int>& indices = {0, 179, 358, 679}, double shift = 10.0);

// Fresh noise for the re-noising after step i of the current chunk, shaped as the chunk [F, C, h, w].
using LingbotNoise = std::function<at::Tensor(int step, at::IntArrayRef shape)>;

// A chunk's denoising as the model saw it (conformance checks, debugging).
struct LingbotChunkTrace {
  std::vector<at::Tensor> x, t, flow;  // per call, the clean pass last
};

struct LingbotChunkResult {
  at::Tensor latents;  // [F, 16, h, w] clean, float32
  LingbotChunkKv kv;   // what the clean pass wrote
};

// One chunk: noise [F, 16, h, w], cond [F, 20, h, w] (undefined for t2v), cam [F, 384, h, w]
// folded rays (undefined: none), first_frame its absolute latent frame, ctx what it attends to
// besides itself. renoise is called after every step but the last.
LingbotChunkResult lingbot_generate_chunk(LingbotDitImpl& model, const at::Tensor& noise, const at::Tensor& cond,
                                          const at::Tensor& cam, const LingbotText& text, int64_t first_frame,
                                          const WanKvContext& ctx, const LingbotSchedule& schedule,
                                          const LingbotNoise& renoise, LingbotChunkTrace* trace = nullptr);

// Upstream's rolling cache (CausalWanSelfAttention with local_attn_size and sink_size): a chunk
// attends to all earlier frames while they fit in local_attn_size - F frames; beyond that to the
// first sink_frames frames and the most recent local_attn_size - F - sink_frames.
class LingbotNativeCache {
 public:
  // local_frames = local_attn_size (the chunk included; -1: keep everything), sink_frames =
  // sink_size, frames_per_chunk F, tokens_per_frame = h * w / 4.
  LingbotNativeCache(int64_t local_frames, int64_t sink_frames, int64_t frames_per_chunk, int64_t tokens_per_frame);
  // The context for the next chunk (valid until the next commit or clear).
  WanKvContext context() const;
  // Appends a chunk's K/V and drops what the next chunk will not see.
  void commit(const LingbotChunkKv& kv);
  void clear();
  int64_t frames() const { return frames_; }
  const std::vector<LayerKv>& main() const { return main_; }

 private:
  int64_t local_, sink_, chunk_, tpf_, frames_ = 0;
  std::vector<LayerKv> main_;
};

}  // namespace wm::dit
