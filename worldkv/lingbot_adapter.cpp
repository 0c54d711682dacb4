#include "worldkv/lingbot_adapter.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "dit/sampler.h"
#include "runtime/error.h"
#include "worldkv/world_memory.h"

namespace wm::worldkv {
namespace {

const dit::LingbotConfig& config_of(const dit::LingbotDit& m) {
  WM_CHECK(m, "LingbotAdapter: no model");
  return m->config();
}

// Upstream's offline camera input before the rays: the trajectory interpolated to its whole
// chunks of latent frames, relative poses, translations over the largest. [n, 4, 4].
at::Tensor known_relative_poses(const at::Tensor& c2ws, int frames_per_chunk) {
  const int64_t n = dit::lingbot_latent_frames(c2ws.size(0), frames_per_chunk);
  WM_CHECK(n >= 1, "the trajectory's ", c2ws.size(0), " poses make no whole chunk of ", frames_per_chunk,
           " latent frames (", 1 + 4 * (frames_per_chunk - 1), " video frames)");
  at::Tensor rel = dit::lingbot_relative_poses(dit::lingbot_interpolate_poses(c2ws, n));
  return dit::lingbot_normalize_translation(rel, dit::lingbot_max_translation(rel));
}

}  // namespace

at::Tensor lingbot_c2ws(const std::vector<Pose>& poses) {
  at::Tensor out = at::empty({int64_t(poses.size()), 4, 4}, at::TensorOptions().dtype(at::kDouble));
  auto a = out.accessor<double, 3>();
  for (size_t i = 0; i < poses.size(); ++i) {
    const Matrix4 m = opencv_camera_to_world(poses[i]);
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) a[int64_t(i)][r][c] = m[size_t(4 * r + c)];
  }
  return out.to(at::kFloat);
}

std::vector<std::string> lingbot_native_window_chunks(int64_t index, int local_attn_size, int sink_size,
                                                      int frames_per_chunk) {
  const int64_t F = frames_per_chunk, total = index * F;
  const int64_t room = local_attn_size < 0 ? total : local_attn_size - F;
  const int64_t keep = std::min(total, room), sink = total > keep ? sink_size : 0;
  std::vector<std::string> ids;
  auto add = [&](int64_t frame) {
    const std::string id = WorldMemory::chunk_id(frame / F);
    if (ids.empty() || ids.back() != id) ids.push_back(id);
  };
  for (int64_t f = 0; f < sink; ++f) add(f);
  for (int64_t f = total - (keep - sink); f < total; ++f) add(f);
  return ids;
}

LingbotAdapter::LingbotAdapter(dit::LingbotDit model, std::unique_ptr<dit::Codec> codec,
                               const at::Tensor& text_context, const at::Tensor& image_latents,
                               LingbotOptions options, at::Device device)
    : model_(std::move(model)), codec_(std::move(codec)), opt_(std::move(options)), device_(device) {
  const auto& c = config_of(model_);
  at::NoGradGuard ng;
  if (c.cond_channels() > 0) {
    WM_CHECK(image_latents.defined() && image_latents.dim() == 4, "an ", c.model_type,
             " model needs image latents [N, 16, h, w]");
    lat_h_ = image_latents.size(2);
    lat_w_ = image_latents.size(3);
    WM_CHECK(c.cond_channels() == 4 + image_latents.size(1), "the model takes ", c.cond_channels(),
             " condition channels (mask 4 + image latent), the image latents have ", image_latents.size(1));
    image_.emplace(image_latents, c.out_dim, lat_h_, lat_w_, device_);
  } else {
    WM_CHECK(!image_latents.defined(), "a ", c.model_type, " model takes no image latents");
    lat_h_ = opt_.latent_height;
    lat_w_ = opt_.latent_width;
  }
  WM_CHECK(lat_h_ > 0 && lat_w_ > 0 && lat_h_ % c.patch_h == 0 && lat_w_ % c.patch_w == 0,
           "the latent size must be positive multiples of the patch (", c.patch_h, " x ", c.patch_w, "), got ",
           lat_h_, " x ", lat_w_);
  if (codec_)
    WM_CHECK(codec_->image_height() == 8 * lat_h_ && codec_->image_width() == 8 * lat_w_, "the codec makes ",
             codec_->image_width(), " x ", codec_->image_height(), " frames, the latents are ", 8 * lat_w_, " x ",
             8 * lat_h_, " pixels");
  schedule_ = opt_.step_indices.empty() ? dit::lingbot_schedule({0, 179, 358, 679}, opt_.shift)
                                        : dit::lingbot_schedule(opt_.step_indices, opt_.shift);
  text_ = model_->encode_text(text_context.defined() ? text_context
                                                      : at::zeros({c.text_len, c.text_dim}, at::kFloat));
  const auto& k = opt_.intrinsics;
  WM_CHECK(k[0] > 0 && k[1] > 0, "the focal lengths must be > 0, got ", k[0], ", ", k[1]);
  intrinsics_ = at::tensor(std::vector<float>{float(k[0]), float(k[1]), float(k[2]), float(k[3])});
  if (opt_.trajectory.defined()) known_rel_ = known_relative_poses(opt_.trajectory, c.frames_per_chunk);

  info_.kind = "lingbot-world-fast";
  info_.name = c.model_type;
  info_.controls = "pose";
  info_.frames_per_chunk = c.frames_per_chunk;
  info_.tokens_per_frame = (lat_h_ / c.patch_h) * (lat_w_ / c.patch_w);
  info_.temporal_stride = 4;
  if (codec_) {
    info_.frame_width = codec_->image_width();
    info_.frame_height = codec_->image_height();
  }
  info_.hfov_deg = degrees(2.0 * std::atan(416.0 / k[0]));
  info_.native_window = true;
}

void LingbotAdapter::check_controls(const std::vector<FrameControl>& controls) const {
  for (size_t i = 0; i < controls.size(); ++i) {
    const Pose& p = controls[i].pose;
    WM_CHECK(std::isfinite(p.x) && std::isfinite(p.y) && std::isfinite(p.z) && std::isfinite(p.yaw) &&
                 std::isfinite(p.pitch),
             "frame ", i, ": a pose with a non-finite value");
  }
}

Pose LingbotAdapter::next_pose(const Pose& previous, const FrameControl& control) const {
  (void)previous;
  return control.pose;  // driven by the pose itself
}

void LingbotAdapter::reset(bool native) {
  const auto& c = model_->config();
  native_.reset();
  if (native)
    native_ = std::make_unique<dit::LingbotNativeCache>(c.local_attn_size, c.sink_size, c.frames_per_chunk,
                                                         info_.tokens_per_frame);
  live_.reset();
  if (!known_rel_.defined())
    live_ = std::make_unique<dit::LingbotLiveCamera>(intrinsics_, 8 * lat_h_, 8 * lat_w_, opt_.translation_scale);
  if (codec_) codec_->reset();
}

size_t LingbotAdapter::native_window_bytes() const {
  if (!native_) return 0;
  size_t n = 0;
  for (const LayerKv& l : native_->main())
    for (const at::Tensor* t : {&l.k, &l.v, &l.pos, &l.logw})
      if (t->defined()) n += t->nbytes();
  return n;
}

std::vector<std::string> LingbotAdapter::native_window_chunks(int64_t index) const {
  const auto& c = model_->config();
  return lingbot_native_window_chunks(index, c.local_attn_size, c.sink_size, c.frames_per_chunk);
}

at::Tensor LingbotAdapter::camera_input(const ChunkStep& step) {
  const int64_t F = model_->config().frames_per_chunk, h = 8 * lat_h_, w = 8 * lat_w_;
  if (live_) {
    WM_CHECK(live_->frames() == step.first_frame, "the live camera holds ", live_->frames(),
             " latent frames, the chunk starts at ", step.first_frame, " (reset first)");
    WM_CHECK(step.latent_poses != nullptr && int64_t(step.latent_poses->size()) == F, "the chunk needs ", F,
             " latent poses");
    return live_->push(lingbot_c2ws(*step.latent_poses));
  }
  WM_CHECK(step.first_frame + F <= known_rel_.size(0), "the trajectory covers ", known_rel_.size(0),
           " latent frames (", known_rel_.size(0) / F, " chunks); chunk ", step.index, " needs frames ",
           step.first_frame, "..", step.first_frame + F - 1);
  const at::Tensor K = dit::lingbot_scale_intrinsics(intrinsics_, 480, 832, h, w);
  return dit::lingbot_fold_rays(dit::lingbot_camera_rays(known_rel_.narrow(0, step.first_frame, F), K, h, w), 8, 8);
}

SampledChunk LingbotAdapter::sample(const ChunkStep& step) {
  const auto& c = model_->config();
  WM_CHECK(step.window != nullptr || native_ != nullptr, "LingbotAdapter: no window (reset(native) first)");
  const int64_t F = c.frames_per_chunk;
  const at::Tensor cond = image_ ? image_->condition(step.first_frame, F) : at::Tensor();
  const at::Tensor cam = camera_input(step);
  at::Generator& gen = *step.gen;
  at::Tensor noise = dit::seeded_noise({F, c.out_dim, lat_h_, lat_w_}, gen, device_);
  dit::LingbotNoise renoise = [&](int, at::IntArrayRef shape) { return dit::seeded_noise(shape, gen, device_); };
  dit::WanKvContext ctx;
  if (step.window)
    ctx.window = step.window;
  else
    ctx = native_->context();
  dit::LingbotChunkResult r =
      dit::lingbot_generate_chunk(*model_, noise, cond, cam, text_, step.first_frame, ctx, schedule_, renoise);
  if (!step.window) {
    native_->commit(r.kv);
    return SampledChunk{std::move(r.latents), {}, nullptr};
  }
  return SampledChunk{std::move(r.latents), std::move(r.kv.main), nullptr};
}

}  // namespace wm::worldkv
