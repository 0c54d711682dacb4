#pragma once
// LingBot-World-Fast's camera input, as upstream prepares it (wan/utils/cam_utils.py and
// WanI2VFast.generate in wan/image2video_fast.py of Robbyant/lingbot-world):
//   1. camera-to-world poses (OpenCV convention) given per video frame are interpolated to one a
//      latent frame at linspace(0, N - 1, n_latent): translation linearly (scipy interp1d),
//      rotation by SLERP (scipy Slerp over the quaternions);
//   2. relative poses, frame to frame: P_0 = I, P_i = inv(rel_{i-1}) rel_i with rel_i =
//      inv(c2w_0) c2w_i;
//   3. translations divided by the largest translation norm of the whole trajectory (when > 0);
//   4. intrinsics (fx, fy, cx, cy) given for 480 x 832 scaled to the video size;
//   5. per pixel (centre at +0.5) the ray origin (the pose's translation) and unit direction
//      rotated by the pose: 6 channels (not Pluecker coordinates: the moment is not used);
//   6. each 8 x 8 pixel block folded into 384 channels at latent resolution.
//
// Step 3 is not causal: a frame's input depends on poses that come later. Offline (a whole
// trajectory given, as upstream always runs), lingbot_max_translation over the trajectory gives
// upstream's scale exactly. For a live trajectory the caller chooses the scale: the running
// maximum over the frames seen so far (equal to upstream's whenever the largest step has already
// happened, e.g. from the first moving frame of a constant-speed walk, where every step has the
// same length and becomes a unit vector), or a fixed scale.
//
// Tensors are float32 on the CPU unless said; poses [n, 4, 4], intrinsics [4] (fx, fy, cx, cy).
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace wm::dit {

// Latent frames upstream takes from n video-frame poses: (n - 1) / 4 + 1, rounded down to whole chunks.
int64_t lingbot_latent_frames(int64_t n_video_frames, int64_t frames_per_chunk = 3);

// Poses c2ws [N, 4, 4] (any float dtype) resampled at linspace(0, N - 1, n_out) as upstream's
// interpolate_camera_poses (computed in float64, returned float32). Throws wm::Error on bad shapes.
at::Tensor lingbot_interpolate_poses(const at::Tensor& c2ws, int64_t n_out);

// compute_relative_poses(framewise = true) without the normalisation: [n, 4, 4] float32.
at::Tensor lingbot_relative_poses(const at::Tensor& c2ws);

// The largest translation norm of relative poses [n, 4, 4] (0 when the camera never moves).
double lingbot_max_translation(const at::Tensor& rel);

// A copy of rel with translations divided by scale; scale <= 0 leaves them (as upstream when the
// camera never moves).
at::Tensor lingbot_normalize_translation(const at::Tensor& rel, double scale);

// Intrinsics K [4] or [n, 4] for an org_h x org_w image scaled to h x w (get_Ks_transformed
// without crop), same shape.
at::Tensor lingbot_scale_intrinsics(const at::Tensor& K, int64_t org_h, int64_t org_w, int64_t h, int64_t w);

// Ray origins and directions of every pixel: rel [n, 4, 4], K [4] -> [n, h, w, 6] (o | d).
at::Tensor lingbot_camera_rays(const at::Tensor& rel, const at::Tensor& K, int64_t h, int64_t w);

// Folds rays [n, h, w, c] by blocks of bh x bw into [n, c * bh * bw, h / bh, w / bw], channels
// ordered (c, row in block, column in block), as upstream's rearrange.
at::Tensor lingbot_fold_rays(const at::Tensor& rays, int64_t bh, int64_t bw);

// Upstream's whole path for a known trajectory: c2ws [N, 4, 4] per video frame, K [4] for a
// 480 x 832 image, the video size h x w (multiples of 8) -> the DiT's camera input
// [lingbot_latent_frames(N), 384, h / 8, w / 8], translations normalised by the trajectory's max.
at::Tensor lingbot_camera_input(const at::Tensor& c2ws, const at::Tensor& K, int64_t h, int64_t w,
                                int64_t frames_per_chunk = 3);

// The camera input of a live trajectory, one chunk at a time: latent-frame poses are pushed as they
// come (a latent frame's pose is its video frame 4j's, where upstream's interpolation lands when
// the trajectory's length is whole chunks: 4j exactly). Relative poses are upstream's arithmetic
// on the prefix (each frame's depends only on it and the frames before), so they equal the
// offline ones; the translation scale is the one causal choice:
//   fixed_scale > 0: that scale (equals upstream's when it is the trajectory's max step);
//   fixed_scale == 0: the running maximum of the step lengths pushed so far, this chunk's
//   included (equals upstream's from the chunk that holds the trajectory's longest step on; a
//   step longer than all before it makes later frames' translations smaller than upstream's
//   would have been for the frames before it, which are already generated).
class LingbotLiveCamera {
 public:
  // K [4] (fx, fy, cx, cy) for a 480 x 832 image; h x w the video size (multiples of 8).
  LingbotLiveCamera(const at::Tensor& K, int64_t h, int64_t w, double fixed_scale = 0);
  // Appends latent-frame poses c2ws [F, 4, 4]; returns their camera input [F, 384, h / 8, w / 8].
  at::Tensor push(const at::Tensor& c2ws);
  // The scale the last push divided translations by (0: the camera has not moved).
  double scale() const { return scale_; }
  int64_t frames() const { return int64_t(poses_.size()); }

 private:
  at::Tensor K_;
  int64_t h_, w_;
  double fixed_, scale_ = 0;
  std::vector<at::Tensor> poses_;  // [4, 4] each
};

}  // namespace wm::dit
