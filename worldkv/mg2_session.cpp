#include "worldkv/mg2_session.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cmath>

#include "dit/sampler.h"
#include "runtime/error.h"
#include "worldkv/chunk_payload.h"

namespace wm::worldkv {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

Pose mg2_integrate_pose(const Pose& p, const Mg2Input& in, const std::string& mode, double ts, double rs) {
  Pose q = p;
  auto key = [&](size_t i) { return i < in.keyboard.size() ? double(in.keyboard[i]) : 0.0; };
  double fwd = 0, strafe = 0, turn = double(in.yaw) * rs, look = double(in.pitch) * rs;
  if (mode == "templerun") {
    // [nomove, jump, slide, turnleft, turnright, leftside, rightside]: the runner keeps running.
    fwd = key(0) > 0.5 ? 0.0 : 1.0;
    turn += 0.1 * rs * (key(4) - key(3));
    strafe = key(6) - key(5);
  } else {
    fwd = key(0) - key(1);                       // W - S
    if (in.keyboard.size() >= 4) strafe = key(3) - key(2);  // D - A
  }
  q.yaw += turn;
  q.pitch = std::clamp(q.pitch + look, -1.5, 1.5);
  q.x += ts * (fwd * std::cos(q.yaw) - strafe * std::sin(q.yaw));
  q.y += ts * (fwd * std::sin(q.yaw) + strafe * std::cos(q.yaw));
  return q;
}

Mg2Session::Mg2Session(dit::Mg2Dit model, std::unique_ptr<dit::Codec> codec, Mg2SessionConfig cfg,
                       at::Device device)
    : model_(std::move(model)), codec_(std::move(codec)), cfg_(std::move(cfg)), device_(device) {
  const auto& mc = model_->config();
  schedule_ = dit::mg2_schedule(cfg_.steps.empty() ? dit::mg2_default_steps(mc) : cfg_.steps);
  if (cfg_.policy != "native") {
    cfg_.memory.policy = parse_policy(cfg_.policy);
    cfg_.memory.frames_per_chunk = mc.frames_per_chunk;
    cfg_.memory.denoise_frames = mc.frames_per_chunk;
    cfg_.memory.tokens_per_frame = mc.tokens_per_frame();
    cfg_.memory.validate();
  }
  gen_ = at::detail::createCPUGenerator(cfg_.seed);
}

int Mg2Session::inputs_for_next_chunk() const {
  const int F = model_->config().frames_per_chunk, r = 4;
  return next_index_ == 0 ? 1 + r * (F - 1) : r * F;
}

void Mg2Session::start(const at::Tensor& image_latents, const at::Tensor& clip_tokens) {
  const auto& c = model_->config();
  WM_CHECK(image_latents.dim() == 4 && image_latents.size(0) >= 1 && image_latents.size(1) == c.out_dim &&
               image_latents.size(2) == c.latent_height && image_latents.size(3) == c.latent_width,
           "image latents must be [N, ", c.out_dim, ", ", c.latent_height, ", ", c.latent_width, "], got ",
           image_latents.sizes());
  at::NoGradGuard ng;
  image_latents_ = image_latents.to(device_, at::kFloat);
  visual_ = model_->encode_visual(clip_tokens.to(device_));
  if (cfg_.policy == "native") {
    native_ = std::make_unique<dit::Mg2NativeCache>(c.local_attn_size - c.frames_per_chunk, c.tokens_per_frame());
  } else {
    memory_ = std::make_unique<WorldMemory>(model_->kv_spec(device_, model_->dtype()), cfg_.memory);
  }
  if (codec_) codec_->reset();
  action_kv_.clear();
  inputs_.clear();
  poses_.clear();
  gen_ = at::detail::createCPUGenerator(cfg_.seed);
  next_index_ = 0;
  started_ = true;
}

dit::Mg2Actions Mg2Session::actions_tensor() const {
  const auto& c = model_->config();
  const int64_t n = int64_t(inputs_.size());
  dit::Mg2Actions a;
  a.keyboard = at::zeros({n, c.keyboard_dim()}, at::TensorOptions().dtype(at::kFloat));
  if (c.mouse_dim() > 0) a.mouse = at::zeros({n, c.mouse_dim()}, at::TensorOptions().dtype(at::kFloat));
  auto kb = a.keyboard.accessor<float, 2>();
  for (int64_t i = 0; i < n; ++i) {
    for (int j = 0; j < c.keyboard_dim(); ++j) kb[i][j] = inputs_[i].keyboard[j];
    if (c.mouse_dim() > 0) {
      a.mouse[i][0] = inputs_[i].pitch;
      a.mouse[i][1] = inputs_[i].yaw;
    }
  }
  return a;
}

dit::ActionKv Mg2Session::action_context() const {
  const KvWindow& w = memory_->window();
  const auto& lay = w.layout();
  const auto& ac = *model_->config().action;
  std::vector<dit::ActionKv> parts;
  at::Tensor pos = w.pos(0);
  for (int r = 0; r < lay.n_regions(); ++r)
    for (const auto& seg : lay.segments(r)) {
      auto it = action_kv_.find(seg.id);
      WM_CHECK(it != action_kv_.end(), "the window holds ", seg.id, " but its action K/V are gone");
      int64_t delta = 0;
      if (lay.segment_len(0, seg.id) > 0) {
        const int64_t t_now = pos[lay.segment_begin(0, seg.id)][0].item<int64_t>();
        delta = t_now - chunk_payload(w.meta(seg.id), seg.id).first_frame();
      }
      parts.push_back(delta == 0 ? it->second : it->second.reanchored(delta, ac));
    }
  std::vector<const dit::ActionKv*> ptrs;
  for (const auto& p : parts) ptrs.push_back(&p);
  return dit::ActionKv::cat(ptrs);
}

void Mg2Session::prune_action_kv() {
  for (auto it = action_kv_.begin(); it != action_kv_.end();) {
    const bool in_window = memory_->window().layout().find(it->first).first >= 0;
    if (in_window || memory_->bank().contains(it->first))
      ++it;
    else
      it = action_kv_.erase(it);
  }
}

Mg2ChunkOutput Mg2Session::next(const std::vector<Mg2Input>& inputs) {
  WM_CHECK(started_, "start() the rollout with its image latents and CLIP tokens first");
  const auto& c = model_->config();
  const int F = c.frames_per_chunk;
  const int want = inputs_for_next_chunk();
  WM_CHECK(int(inputs.size()) == want, "chunk ", next_index_, " takes ", want, " video frames of input, got ",
           inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    WM_CHECK(int(inputs[i].keyboard.size()) == c.keyboard_dim(), "input ", i, ": ", inputs[i].keyboard.size(),
             " keyboard values, the ", c.mode(), " model takes ", c.keyboard_dim());
  const auto t0 = Clock::now();
  at::NoGradGuard ng;
  Mg2ChunkOutput out;
  out.index = next_index_;
  for (const auto& in : inputs) {
    inputs_.push_back(in);
    poses_.push_back(mg2_integrate_pose(poses_.empty() ? Pose{} : poses_.back(), in, c.mode(),
                                        cfg_.translation_scale, cfg_.rotation_scale));
  }
  const int64_t sf = next_index_ * F;
  std::vector<Pose> latent_poses;
  for (int64_t j = sf; j < sf + F; ++j) latent_poses.push_back(poses_.at(size_t(4 * j)));

  // Condition of the chunk's frames: mask (1 at latent frame 0) | image latents.
  const int64_t N = image_latents_.size(0);
  at::Tensor idx = at::arange(sf, sf + F, at::TensorOptions().dtype(at::kLong)).clamp_max(N - 1).to(device_);
  at::Tensor img = image_latents_.index_select(0, idx);
  at::Tensor mask = at::zeros({F, 4, c.latent_height, c.latent_width}, img.options());
  if (sf == 0) mask[0].fill_(1.0);
  at::Tensor cond = at::cat({mask, img}, 1);

  at::Tensor noise = dit::seeded_noise({F, c.out_dim, c.latent_height, c.latent_width}, gen_, device_);
  dit::Mg2Noise renoise = [&](int, at::IntArrayRef shape) { return dit::seeded_noise(shape, gen_, device_); };
  const dit::Mg2Actions actions = actions_tensor();

  dit::Mg2Context ctx;
  dit::ActionKv action_ctx;
  if (native_) {
    ctx = native_->context();
  } else {
    memory_->prepare(out.index, latent_poses);
    if (memory_->policy().banks()) out.retrieved = memory_->region_ids("retrieved");
    ctx.window = &memory_->window();
    if (c.action) {
      action_ctx = action_context();
      ctx.action = &action_ctx;
    }
  }
  const auto td = Clock::now();
  dit::Mg2ChunkResult r =
      dit::mg2_generate_chunk(*model_, noise, cond, visual_, actions, sf, ctx, schedule_, renoise);
  out.dit_ms = ms_since(td);
  if (native_) {
    native_->commit(r.kv);
    out.window_bytes = native_->nbytes();
    out.action_bytes = native_->action().nbytes();
  } else {
    const std::string id = WorldMemory::chunk_id(out.index);
    action_kv_[id] = std::move(r.kv.action);
    memory_->commit(out.index, std::move(r.kv.main), latent_poses);
    prune_action_kv();
    out.window_bytes = memory_->window_bytes();
    for (const auto& kv : action_kv_) out.action_bytes += kv.second.nbytes();
    for (int t = 0; t < 3; ++t) out.bank_bytes[t] = memory_->bank().bytes(static_cast<Tier>(t));
  }
  out.latents = r.latents.to(at::kCPU, at::kFloat);
  if (codec_) {
    const auto tc = Clock::now();
    out.frames = codec_->decode_images(r.latents.to(at::kFloat));
    out.decode_ms = ms_since(tc);
  }
  ++next_index_;
  out.ms = ms_since(t0);
  return out;
}

}  // namespace wm::worldkv
