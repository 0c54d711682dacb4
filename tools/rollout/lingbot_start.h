#pragma once
// What a LingBot-World-Fast rollout starts from, read from the files a user names (wm_render,
// benchmarks): the video size upstream derives from the image and a maximum area, the image
// condition through the Wan VAE, the text context, and the camera trajectory (upstream's
// poses.npy / intrinsics.npy, or one generated from the trajectories Matrix-Game-2.0's programs
// use).
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dit/codec.h"
#include "dit/image.h"
#include "worldkv/pose.h"

namespace wm::rollout {

// True when `dir` is a folder holding a LingBot-World-Fast model: diffusers' sharded or single
// file (diffusion_pytorch_model*), or a config.json naming WanModelFast.
bool is_lingbot_folder(const std::string& dir);

// The Wan VAE of a model folder: `given` if set, else Wan2.1_VAE.pth in the folder above (the
// hub's layout: lingbot-world-base-cam/Wan2.1_VAE.pth beside lingbot_world_fast/), else
// Wan2.1_VAE.safetensors there (converted, or a random one); the .pth path when neither exists.
std::string lingbot_vae_path(const std::string& model_dir, const std::string& given);

struct LingbotVideoSize;
// That VAE for frames of `size`, its encoder in encode_dtype, its decoder in decode_dtype, on
// `device`. Throws wm::Error naming the path when there is none, `why` saying what needs it.
std::unique_ptr<dit::WanVaeCodec> load_lingbot_vae(const std::string& model_dir, const std::string& given,
                                                   const LingbotVideoSize& size, at::Device device,
                                                   at::ScalarType encode_dtype, at::ScalarType decode_dtype,
                                                   const std::string& why);

// "480*832" (upstream's --size) -> 399360. Throws wm::Error for anything else than two positive
// integers joined by '*'.
int64_t lingbot_max_area(const std::string& size);

// Upstream's video size (WanI2VFast.generate): for an image of image_h x image_w and a maximum
// area, lat_h = floor(floor(sqrt(area * h / w) / 8) / 2) * 2, lat_w likewise with w / h; the
// video is 8 lat_h x 8 lat_w. Throws wm::Error when a side comes out 0.
struct LingbotVideoSize {
  int64_t height = 0, width = 0;
};
LingbotVideoSize lingbot_video_size(int64_t image_h, int64_t image_w, int64_t max_area);

// The image condition as upstream builds it: the image in [-1, 1] resized to the VAE's frame
// size by bicubic interpolation (torch's, align_corners false), then the VAE's encoding of
// [image, zeros x 4 (n_latents - 1)]: [n_latents, 16, h / 8, w / 8] float32 on `device`.
at::Tensor lingbot_image_latents(const Image& image, const dit::WanVaeCodec& vae, int64_t n_latents,
                                 at::Device device);

// A text context file: safetensors holding `context` [L, text_dim] or [1, L, text_dim] (umT5's
// output for the prompt). Throws wm::Error naming the file.
at::Tensor load_lingbot_text_context(const std::string& path);

// A camera trajectory, one entry a video frame.
struct LingbotTrajectory {
  at::Tensor c2ws;                            // [N, 4, 4] float32, OpenCV camera-to-world
  std::optional<std::array<double, 4>> intrinsics;  // fx, fy, cx, cy for 480 x 832 (the file's first row)
  std::vector<worldkv::Pose> poses;           // retrieval poses (relative to frame 0, worldkv/pose.h)
};

// Upstream's files: `path` a poses.npy [N, 4, 4] (float32 or float64), or a folder holding one;
// intrinsics.npy [N, 4] or [4] beside it is read when present. Throws wm::Error naming the file.
LingbotTrajectory load_lingbot_poses(const std::string& path);

// n video frames of a generated trajectory (rollout::mg2_trajectory's names: revisit, forward,
// orbit, random; Matrix-Game-2.0's universal keys and mouse integrated into poses, one unit of
// translation a frame and a radian per unit of mouse).
LingbotTrajectory lingbot_generated_trajectory(const std::string& name, int n, uint64_t seed);

}  // namespace wm::rollout
