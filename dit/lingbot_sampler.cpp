#include "dit/lingbot_sampler.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "runtime/error.h"

namespace wm::dit {

LingbotScheduleTable lingbot_schedule_table(double shift, int num_train_timesteps) {
  WM_CHECK(shift > 0, "shift must be > 0, got ", shift);
  WM_CHECK(num_train_timesteps > 1, "num_train_timesteps must be > 1, got ", num_train_timesteps);
  const int64_t n = num_train_timesteps;
  auto d = at::TensorOptions().dtype(at::kDouble);
  // The scheduler's sigma_max: float32(1 - 1/n) (its training sigmas are stored as float32).
  const double smax = double(float(1.0 - 1.0 / double(n)));
  // numpy.linspace(smax, 0, n + 1)[:-1]: i * step + start, one rounding each (separate kernels).
  const double step = (0.0 - smax) / double(n);
  at::Tensor s = at::arange(n, d) * step + smax;
  s = (shift * s) / ((shift - 1.0) * s + 1.0);
  LingbotScheduleTable t;
  t.timesteps = (s * double(n)).to(at::kLong);
  t.sigmas = at::cat({s, at::zeros({1}, d)}).to(at::kFloat);
  return t;
}

LingbotSchedule lingbot_schedule(const std::vector<int>& indices, double shift) {
  WM_CHECK(!indices.empty(), "the step index list is empty");
  const LingbotScheduleTable table = lingbot_schedule_table(shift);
  const int64_t n = table.timesteps.size(0);
  auto ts = table.timesteps.accessor<int64_t, 1>();
  auto sg = table.sigmas.accessor<float, 1>();
  LingbotSchedule out;
  for (size_t i = 0; i < indices.size(); ++i) {
    const int idx = indices[i];
    WM_CHECK(idx >= 0 && idx < n, "step index ", idx, " is outside the table 0..", n - 1);
    WM_CHECK(i == 0 || idx > indices[i - 1], "step indices must ascend, got ", indices[i - 1], " then ", idx);
    const int64_t t = ts[idx];
    std::vector<int64_t> hits;
    for (int64_t j = 0; j < n; ++j)
      if (ts[j] == t) hits.push_back(j);
    out.timesteps.push_back(t);
    out.x0_sigmas.push_back(sg[hits.front()]);                        // argmin |table - t|: the first
    out.noise_sigmas.push_back(sg[hits.size() > 1 ? hits[1] : hits[0]]);  // index_for_timestep
  }
  return out;
}

LingbotChunkResult lingbot_generate_chunk(LingbotDitImpl& model, const at::Tensor& noise, const at::Tensor& cond,
                                          const at::Tensor& cam, const LingbotText& text, int64_t first_frame,
                                          const WanKvContext& ctx, const LingbotSchedule& schedule,
                                          const LingbotNoise& renoise, LingbotChunkTrace* trace) {
  const size_t n = schedule.timesteps.size();
  WM_CHECK(n > 0 && schedule.x0_sigmas.size() == n && schedule.noise_sigmas.size() == n,
           "the schedule is empty or inconsistent");
  at::NoGradGuard ng;
  const auto dev = model.device();
  const auto lo = at::TensorOptions().dtype(at::kLong).device(dev);
  at::Tensor x = noise.to(dev, at::kFloat);
  at::Tensor x0;
  for (size_t i = 0; i < n; ++i) {
    at::Tensor t = at::full({1}, schedule.timesteps[i], lo);
    at::Tensor flow = model.forward_chunk(x, t, cond, cam, text, first_frame, ctx).to(at::kFloat);
    if (trace) {
      trace->x.push_back(x);
      trace->t.push_back(t);
      trace->flow.push_back(flow);
    }
    x0 = (x.to(at::kDouble) - double(schedule.x0_sigmas[i]) * flow.to(at::kDouble)).to(at::kFloat);
    if (i + 1 < n) {
      WM_CHECK(renoise, "the sampler needs a noise source for its re-noising");
      at::Tensor z = renoise(int(i), x0.sizes()).to(dev, at::kFloat);
      WM_CHECK(z.sizes() == x0.sizes(), "re-noising noise must be ", x0.sizes(), ", got ", z.sizes());
      const at::Tensor s = at::scalar_tensor(schedule.noise_sigmas[i + 1], x0.options());
      x = (1 - s) * x0 + s * z;
    }
  }
  LingbotChunkResult r;
  r.latents = x0;
  at::Tensor t0 = at::zeros({1}, lo);
  at::Tensor flow = model.forward_chunk(x0, t0, cond, cam, text, first_frame, ctx, &r.kv).to(at::kFloat);
  if (trace) {
    trace->x.push_back(x0);
    trace->t.push_back(t0);
    trace->flow.push_back(flow);
  }
  return r;
}

LingbotNativeCache::LingbotNativeCache(int64_t local_frames, int64_t sink_frames, int64_t frames_per_chunk,
                                       int64_t tokens_per_frame)
    : local_(local_frames), sink_(sink_frames), chunk_(frames_per_chunk), tpf_(tokens_per_frame) {
  WM_CHECK(tokens_per_frame > 0 && frames_per_chunk > 0 && sink_frames >= 0, "bad native cache: sink ", sink_frames,
           ", chunk ", frames_per_chunk, ", ", tokens_per_frame, " tokens a frame");
  WM_CHECK(local_frames == -1 || local_frames >= sink_frames + frames_per_chunk, "local_attn_size ", local_frames,
           " must be -1 or >= sink ", sink_frames, " + chunk ", frames_per_chunk);
}

WanKvContext LingbotNativeCache::context() const {
  WanKvContext c;
  if (frames_ > 0) c.main = &main_;
  return c;
}

void LingbotNativeCache::commit(const LingbotChunkKv& kv) {
  const int64_t F = kv.n_tokens() / tpf_;
  WM_CHECK(F * tpf_ == kv.n_tokens(), "a chunk of ", kv.n_tokens(), " tokens is not whole frames of ", tpf_);
  const int64_t total = frames_ + F;
  // What the next chunk sees: everything while it fits beside the chunk, else sink + most recent.
  const int64_t room = local_ < 0 ? total : local_ - chunk_;
  const int64_t keep = std::min(total, room);
  const int64_t sink = total > keep ? sink_ : 0;
  const int64_t drop_begin = sink * tpf_, drop_tokens = (total - keep) * tpf_;
  if (main_.empty()) main_.assign(kv.main.size(), LayerKv{});
  WM_CHECK(main_.size() == kv.main.size(), "a chunk of ", kv.main.size(), " layers, the cache ", main_.size());
  for (size_t l = 0; l < kv.main.size(); ++l) {
    LayerKv& m = main_[l];
    const LayerKv& a = kv.main[l];
    auto join = [&](const at::Tensor& old, const at::Tensor& add, int64_t dim) {
      at::Tensor all = old.defined() && old.size(dim) > 0 ? at::cat({old, add}, dim) : add;
      if (drop_tokens == 0) return all;
      const int64_t len = all.size(dim);
      return at::cat({all.narrow(dim, 0, drop_begin), all.narrow(dim, drop_begin + drop_tokens,
                                                                 len - drop_begin - drop_tokens)},
                     dim)
          .contiguous();
    };
    m.k = join(m.k, a.k, 1);
    m.v = join(m.v, a.v, 1);
    m.pos = join(m.pos, a.pos, 0);
    m.logw = join(m.logw, a.logw, 0);
  }
  frames_ = keep;
}

void LingbotNativeCache::clear() {
  main_.clear();
  frames_ = 0;
}

}  // namespace wm::dit
