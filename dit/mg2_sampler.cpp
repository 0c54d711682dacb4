#include "dit/mg2_sampler.h"

#include <ATen/core/grad_mode.h>

#include "runtime/error.h"

namespace wm::dit {

std::vector<int> mg2_default_steps(const Mg2Config& c) {
  if (c.mode() == "templerun") return {1000, 750, 500, 250};
  return {1000, 666, 333};
}

Mg2Schedule mg2_schedule(const std::vector<int>& steps, double shift) {
  WM_CHECK(!steps.empty(), "the step list is empty");
  for (size_t i = 0; i < steps.size(); ++i) {
    WM_CHECK(steps[i] >= 1 && steps[i] <= 1000, "steps must lie in 1..1000, got ", steps[i]);
    WM_CHECK(i == 0 || steps[i] < steps[i - 1], "steps must descend, got ", steps[i - 1], " then ", steps[i]);
  }
  WM_CHECK(shift > 0, "shift must be > 0, got ", shift);
  // As upstream computes the table: float32 linspace, float32 shift, float32 * 1000.
  at::Tensor s = at::linspace(1.0, 0.0, 1001, at::TensorOptions().dtype(at::kFloat)).narrow(0, 0, 1000);
  s = shift * s / (1 + (shift - 1) * s);
  at::Tensor ts = s * 1000;
  auto sa = s.accessor<float, 1>();
  auto ta = ts.accessor<float, 1>();
  Mg2Schedule out;
  for (int st : steps) {
    const int idx = 1000 - st;
    out.timesteps.push_back(ta[idx]);
    out.sigmas.push_back(sa[idx]);
  }
  return out;
}

Mg2ChunkResult mg2_generate_chunk(Mg2DitImpl& model, const at::Tensor& noise, const at::Tensor& cond,
                                  const Mg2Visual& visual, const Mg2Actions& actions, int64_t first_frame,
                                  const Mg2Context& ctx, const Mg2Schedule& schedule, const Mg2Noise& renoise,
                                  Mg2ChunkTrace* trace, const Mg2AfterCall& after_call) {
  WM_CHECK(!schedule.timesteps.empty() && schedule.timesteps.size() == schedule.sigmas.size(),
           "the schedule is empty or inconsistent");
  at::NoGradGuard ng;
  const auto dt = model.dtype();
  const auto dev = model.device();
  const int64_t F = noise.size(0);
  at::Tensor x = noise.to(dev, dt);
  at::Tensor x0;
  const size_t n = schedule.timesteps.size();
  auto tensor_t = [&](float t) { return at::full({F}, t, at::TensorOptions().dtype(at::kFloat).device(dev)); };
  for (size_t i = 0; i < n; ++i) {
    at::Tensor t = tensor_t(schedule.timesteps[i]);
    at::Tensor flow = model.forward_chunk(x, t, cond, visual, actions, first_frame, ctx);
    if (trace) {
      trace->x.push_back(x);
      trace->t.push_back(t);
      trace->flow.push_back(flow);
    }
    x0 = (x.to(at::kDouble) - double(schedule.sigmas[i]) * flow.to(at::kDouble)).to(dt);
    if (i + 1 < n) {
      WM_CHECK(renoise, "the sampler needs a noise source for its re-noising");
      at::Tensor z = renoise(int(i), x0.sizes()).to(dev, dt);
      WM_CHECK(z.sizes() == x0.sizes(), "re-noising noise must be ", x0.sizes(), ", got ", z.sizes());
      const at::Tensor s = at::scalar_tensor(schedule.sigmas[i + 1], at::TensorOptions().dtype(at::kFloat).device(dev));
      x = ((1 - s) * x0 + s * z).to(dt);
    }
    if (after_call) after_call(i, i + 1 < n ? x : x0);
  }
  Mg2ChunkResult r;
  r.latents = x0;
  at::Tensor t0 = tensor_t(0.0f);
  at::Tensor flow = model.forward_chunk(x0, t0, cond, visual, actions, first_frame, ctx, &r.kv);
  if (after_call) after_call(n, r.kv.main.back().k);
  if (trace) {
    trace->x.push_back(x0);
    trace->t.push_back(t0);
    trace->flow.push_back(flow);
  }
  return r;
}

Mg2NativeCache::Mg2NativeCache(int64_t keep_frames, int64_t tokens_per_frame)
    : keep_(keep_frames), tpf_(tokens_per_frame) {
  WM_CHECK(keep_frames >= 0 && tokens_per_frame > 0, "bad native cache: keep ", keep_frames, " frames of ",
           tokens_per_frame, " tokens");
}

Mg2Context Mg2NativeCache::context() const {
  Mg2Context c;
  if (frames_ > 0) {
    c.main = &main_;
    c.action = &action_;
  }
  return c;
}

void Mg2NativeCache::commit(const Mg2ChunkKv& kv) {
  const int64_t F = kv.n_tokens() / tpf_;
  WM_CHECK(F * tpf_ == kv.n_tokens(), "a chunk of ", kv.n_tokens(), " tokens is not whole frames of ", tpf_);
  const int64_t total = frames_ + F, keep = std::min(keep_, total);
  const int64_t drop_tokens = (total - keep) * tpf_;
  if (main_.empty()) main_.assign(kv.main.size(), LayerKv{});
  for (size_t l = 0; l < kv.main.size(); ++l) {
    LayerKv& m = main_[l];
    const LayerKv& a = kv.main[l];
    auto join = [&](const at::Tensor& old, const at::Tensor& add, int64_t dim) {
      at::Tensor all = old.defined() && old.size(dim) > 0 ? at::cat({old, add}, dim) : add;
      return all.narrow(dim, drop_tokens, all.size(dim) - drop_tokens).contiguous();
    };
    m.k = join(m.k, a.k, 1);
    m.v = join(m.v, a.v, 1);
    m.pos = join(m.pos, a.pos, 0);
    m.logw = join(m.logw, a.logw, 0);
  }
  action_ = ActionKv::cat({&action_, &kv.action}).last_frames(keep);
  frames_ = keep;
}

void Mg2NativeCache::clear() {
  main_.clear();
  action_ = ActionKv{};
  frames_ = 0;
}

size_t Mg2NativeCache::nbytes() const {
  size_t n = action_.nbytes();
  for (const auto& l : main_)
    if (l.k.defined()) n += (l.k.numel() * l.k.element_size()) * 2;
  return n;
}

}  // namespace wm::dit
