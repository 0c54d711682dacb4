#pragma once
// What a LingBot-World-Fast rollout starts from, read from the files a user names (wm_render,
// wm_revisit_bench, the viewer): the video size upstream derives from the image and a maximum
// area, the image condition through the Wan VAE, the text context (a file, or a prompt through
// umT5), and the camera trajectory (upstream's poses.npy / intrinsics.npy, or one generated from
// the trajectories Matrix-Game-2.0's programs use).
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

// The checkpoint folder of a model folder as the hub lays it out: the folder above
// (lingbot-world-base-cam/ holding lingbot_world_fast/, Wan2.1_VAE.pth, the umT5 encoder and
// google/umt5-xxl/).
std::string lingbot_checkpoint_dir(const std::string& model_dir);

// Where a rollout's text context comes from (the programs' --text-context and --prompt): at most
// one of the two.
struct LingbotTextSource {
  std::string context_file;           // safetensors with `context` [L, text_dim]
  std::optional<std::string> prompt;  // text through umT5 (empty text included: EOS alone)
};

// The text context of a rollout of the model folder `model_dir` (its config.json read for text_dim
// and text_len): the file's, or the prompt through umT5 as upstream encodes it
// (dit::encode_umt5_prompt: the encoder and tokenizer found in lingbot_checkpoint_dir(model_dir),
// run once on `device` in `dtype` and freed before returning; one line on stderr prefixed by
// `program` saying the tokens and the time, and one more when the prompt was cut to text_len).
// [L, text_dim], L <= text_len (the DiT zero-pads it). Undefined when neither is given: the
// adapter then attends to text_len zero rows. Throws wm::Error when both are given, when the
// encoder's width is not the DiT's text_dim, or naming the file at fault.
at::Tensor lingbot_text_context(const LingbotTextSource& source, const std::string& model_dir, at::Device device,
                                at::ScalarType dtype, const std::string& program);

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
