#include "dit/sampler.h"

#include <ATen/core/grad_mode.h>

#include "runtime/error.h"

namespace wm::dit {

SamplerConfig sampler_with_steps(int n) {
  WM_CHECK(n >= 1, "a sampler needs at least one step, got ", n);
  SamplerConfig sc;
  sc.timesteps.clear();
  for (int i = 0; i < n; ++i) sc.timesteps.push_back(1.0 - static_cast<double>(i) / n);
  return sc;
}

std::vector<double> flow_schedule(const SamplerConfig& cfg) {
  WM_CHECK(!cfg.timesteps.empty(), "the sampler needs at least one timestep");
  WM_CHECK(cfg.shift > 0, "shift must be > 0, got ", cfg.shift);
  std::vector<double> s;
  for (size_t i = 0; i < cfg.timesteps.size(); ++i) {
    const double t = cfg.timesteps[i];
    WM_CHECK(t > 0 && t <= 1, "timestep ", i, " must be in (0, 1], got ", t);
    WM_CHECK(i == 0 || t < cfg.timesteps[i - 1], "timesteps must be strictly descending: ", cfg.timesteps[i - 1],
             " then ", t);
    s.push_back(cfg.shift * t / (1.0 + (cfg.shift - 1.0) * t));
  }
  s.push_back(0.0);
  return s;
}

at::Tensor flow_step(const at::Tensor& x, const at::Tensor& v, double t, double t_next, const at::Tensor& noise) {
  if (!noise.defined()) return x + (t_next - t) * v;
  at::Tensor x0 = x - t * v;
  return (1.0 - t_next) * x0 + t_next * noise;
}

FlowPair make_flow_pair(const at::Tensor& x0, const at::Tensor& t, const at::Tensor& noise) {
  WM_CHECK(noise.sizes() == x0.sizes(), "noise ", noise.sizes(), " differs from x0 ", x0.sizes());
  at::Tensor tt = t.to(x0.device(), x0.scalar_type());
  WM_CHECK(tt.dim() == 0 || (tt.dim() + 3 == x0.dim() && x0.sizes().slice(0, tt.dim()) == tt.sizes()),
           "t must be a scalar or [..., T] matching x0 ", x0.sizes(), ", got ", t.sizes());
  if (tt.dim() > 0) tt = tt.view(tt.sizes().vec()).unsqueeze(-1).unsqueeze(-1).unsqueeze(-1);
  return {(1 - tt) * x0 + tt * noise, noise - x0};
}

at::Tensor seeded_noise(at::IntArrayRef shape, at::Generator& gen, at::Device device) {
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)).to(device);
}

at::Tensor sample_flow(const at::Tensor& noise, const SamplerConfig& cfg, const Denoiser& denoise,
                       at::Generator* gen) {
  const std::vector<double> s = flow_schedule(cfg);
  const bool renoise = cfg.method == SamplingMethod::Renoise;
  WM_CHECK(!renoise || gen, "renoise sampling needs a generator");
  at::Tensor x = noise;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    at::Tensor v = denoise(x, s[i]);
    WM_CHECK(v.sizes() == x.sizes(), "velocity ", v.sizes(), " differs from x ", x.sizes());
    const bool last = i + 2 == s.size();
    at::Tensor fresh = renoise && !last ? seeded_noise(x.sizes(), *gen, x.device()) : at::Tensor();
    x = flow_step(x, v.to(x.scalar_type()), s[i], s[i + 1], fresh);
  }
  return x;
}

ChunkResult generate_chunk(CausalDit& model, KvWindow* window, const FrameCond& cond, int64_t first_frame,
                           const SamplerConfig& cfg, at::Generator& gen) {
  at::NoGradGuard ng;
  const DitConfig& c = model->config();
  const at::Device dev = model->patch_embedding->weight.device();
  const int64_t F = c.frames_per_chunk;
  at::Tensor noise = seeded_noise({F, c.latent_channels, c.latent_height, c.latent_width}, gen, dev);
  auto denoise = [&](const at::Tensor& x, double t) {
    return model->forward_chunk(x, at::scalar_tensor(t, at::TensorOptions().dtype(at::kFloat)), cond, first_frame,
                                window);
  };
  ChunkResult r;
  r.latents = sample_flow(noise, cfg, denoise, &gen);
  if (cfg.refill) {
    WM_CHECK(cfg.context_t >= 0 && cfg.context_t < 1, "context_t must be in [0, 1), got ", cfg.context_t);
    at::Tensor ctx = r.latents;
    if (cfg.context_t > 0)
      ctx = (1.0 - cfg.context_t) * r.latents + cfg.context_t * seeded_noise(r.latents.sizes(), gen, dev);
    // Without the reference: context chunks are made, and trained, without one.
    FrameCond ctx_cond = cond;
    ctx_cond.reference = at::Tensor();
    model->forward_chunk(ctx, at::scalar_tensor(cfg.context_t, at::TensorOptions().dtype(at::kFloat)), ctx_cond,
                         first_frame, window, &r.kv);
  }
  return r;
}

}  // namespace wm::dit
