#include "worldkv/mg2_adapter.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "dit/sampler.h"
#include "runtime/error.h"
#include "worldkv/world_memory.h"

namespace wm::worldkv {

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

std::vector<std::string> mg2_rolling_window_chunks(int64_t index, int local_attn_size, int frames_per_chunk) {
  const int64_t F = frames_per_chunk, held = std::max(0, local_attn_size - frames_per_chunk);
  const int64_t first_frame = std::max<int64_t>(0, index * F - held);
  std::vector<std::string> ids;
  for (int64_t c = first_frame / F; c < index; ++c) ids.push_back(WorldMemory::chunk_id(c));
  return ids;
}

namespace {

const dit::Mg2Config& config_of(const dit::Mg2Dit& m) {
  WM_CHECK(m, "Mg2Adapter: no model");
  return m->config();
}

}  // namespace

Mg2Adapter::Mg2Adapter(dit::Mg2Dit model, std::unique_ptr<dit::Codec> codec, const at::Tensor& image_latents,
                       const at::Tensor& clip_tokens, Mg2Options options, at::Device device)
    : model_(std::move(model)),
      codec_(std::move(codec)),
      opt_(std::move(options)),
      device_(device),
      image_(image_latents, config_of(model_).out_dim, config_of(model_).latent_height,
             config_of(model_).latent_width, device) {
  const auto& c = model_->config();
  mode_ = c.mode();
  schedule_ = dit::mg2_schedule(opt_.steps.empty() ? dit::mg2_default_steps(c) : opt_.steps);
  at::NoGradGuard ng;
  visual_ = model_->encode_visual(clip_tokens.to(device_));
  info_.kind = "matrix-game-2.0";
  info_.name = mode_;
  info_.controls = "keyboard+mouse";
  info_.frames_per_chunk = c.frames_per_chunk;
  info_.tokens_per_frame = c.tokens_per_frame();
  info_.temporal_stride = 4;
  if (codec_) {
    info_.frame_width = codec_->image_width();
    info_.frame_height = codec_->image_height();
  }
  info_.native_window = true;
  info_.chunk_state = true;
}

void Mg2Adapter::check_controls(const std::vector<FrameControl>& controls) const {
  const auto& c = model_->config();
  for (size_t i = 0; i < controls.size(); ++i)
    WM_CHECK(int(controls[i].mg2.keyboard.size()) == c.keyboard_dim(), "input ", i, ": ",
             controls[i].mg2.keyboard.size(), " keyboard values, the ", c.mode(), " model takes ", c.keyboard_dim());
}

Pose Mg2Adapter::next_pose(const Pose& previous, const FrameControl& control) const {
  return mg2_integrate_pose(previous, control.mg2, mode_, opt_.translation_scale, opt_.rotation_scale);
}

void Mg2Adapter::reset(bool native) {
  const auto& c = model_->config();
  native_.reset();
  if (native)
    native_ = std::make_unique<dit::Mg2NativeCache>(c.local_attn_size - c.frames_per_chunk, c.tokens_per_frame());
  if (codec_) codec_->reset();
}

std::vector<std::string> Mg2Adapter::native_window_chunks(int64_t index) const {
  const auto& c = model_->config();
  return mg2_rolling_window_chunks(index, c.local_attn_size, c.frames_per_chunk);
}

dit::Mg2Actions Mg2Adapter::actions_tensor(const std::vector<FrameControl>& controls) const {
  const auto& c = model_->config();
  const int64_t n = int64_t(controls.size());
  dit::Mg2Actions a;
  a.keyboard = at::zeros({n, c.keyboard_dim()}, at::TensorOptions().dtype(at::kFloat));
  if (c.mouse_dim() > 0) a.mouse = at::zeros({n, c.mouse_dim()}, at::TensorOptions().dtype(at::kFloat));
  auto kb = a.keyboard.accessor<float, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const Mg2Input& in = controls[size_t(i)].mg2;
    for (int j = 0; j < c.keyboard_dim(); ++j) kb[i][j] = in.keyboard[j];
    if (c.mouse_dim() > 0) {
      a.mouse[i][0] = in.pitch;
      a.mouse[i][1] = in.yaw;
    }
  }
  return a;
}

dit::ActionKv Mg2Adapter::action_context(const std::vector<HeldChunk>& held) const {
  const auto& ac = *model_->config().action;
  std::vector<dit::ActionKv> parts;
  for (const HeldChunk& h : held) {
    const auto* s = dynamic_cast<const Mg2ActionState*>(h.state);
    WM_CHECK(s != nullptr, "the window holds ", h.id, " but its action K/V are gone");
    parts.push_back(h.shift == 0 ? s->kv : s->kv.reanchored(h.shift, ac));
  }
  std::vector<const dit::ActionKv*> ptrs;
  for (const auto& p : parts) ptrs.push_back(&p);
  return dit::ActionKv::cat(ptrs);
}

SampledChunk Mg2Adapter::sample(const ChunkStep& step) {
  const auto& c = model_->config();
  WM_CHECK(step.window != nullptr || native_ != nullptr, "Mg2Adapter: no window (reset(native) first)");
  const at::Tensor cond = image_.condition(step.first_frame, c.frames_per_chunk);
  at::Generator& gen = *step.gen;
  at::Tensor noise = dit::seeded_noise({c.frames_per_chunk, c.out_dim, c.latent_height, c.latent_width}, gen, device_);
  dit::Mg2Noise renoise = [&](int, at::IntArrayRef shape) { return dit::seeded_noise(shape, gen, device_); };
  const dit::Mg2Actions actions = actions_tensor(*step.controls);
  dit::Mg2Context ctx;
  dit::ActionKv action_ctx;
  if (!step.window) {
    ctx = native_->context();
  } else {
    ctx.window = step.window;
    if (c.action) {
      action_ctx = action_context(step.held);
      ctx.action = &action_ctx;
    }
  }
  dit::Mg2ChunkResult r =
      dit::mg2_generate_chunk(*model_, noise, cond, visual_, actions, step.first_frame, ctx, schedule_, renoise);
  if (!step.window) {
    native_->commit(r.kv);
    return SampledChunk{std::move(r.latents), {}, nullptr};
  }
  return SampledChunk{std::move(r.latents), std::move(r.kv.main), std::make_shared<Mg2ActionState>(std::move(r.kv.action))};
}

std::vector<Image> Mg2Adapter::decode(const at::Tensor& latents) { return wan_decode_frames(codec_.get(), latents); }

}  // namespace wm::worldkv
