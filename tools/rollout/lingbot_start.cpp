#include "tools/rollout/lingbot_start.h"

#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dit/lingbot_weights.h"
#include "dit/umt5_prompt.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tools/cli/npy.h"
#include "tools/rollout/mg2_actions.h"
#include "tools/rollout/mg2_start.h"
#include "worldkv/lingbot_adapter.h"
#include "worldkv/mg2_adapter.h"

namespace wm::rollout {
namespace fs = std::filesystem;

bool is_lingbot_folder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  const fs::path d(dir);
  if (fs::exists(d / "diffusion_pytorch_model.safetensors.index.json", ec) ||
      fs::exists(d / "diffusion_pytorch_model.safetensors", ec))
    return true;
  std::ifstream f(d / "config.json");
  if (!f) return false;
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  return j.is_object() && j.value("_class_name", "") == "WanModelFast";
}

std::string lingbot_vae_path(const std::string& model_dir, const std::string& given) {
  if (!given.empty()) return given;
  const std::string pth = mg2_file_beside_model(model_dir, "", "Wan2.1_VAE.pth");
  const std::string converted = mg2_file_beside_model(model_dir, "", "Wan2.1_VAE.safetensors");
  return !fs::exists(pth) && fs::exists(converted) ? converted : pth;
}

std::unique_ptr<dit::WanVaeCodec> load_lingbot_vae(const std::string& model_dir, const std::string& given,
                                                   const LingbotVideoSize& size, at::Device device,
                                                   at::ScalarType encode_dtype, at::ScalarType decode_dtype,
                                                   const std::string& why) {
  dit::WanVaeCodecOptions vo;
  vo.device = device;
  vo.encode_dtype = encode_dtype;
  vo.decode_dtype = decode_dtype;
  vo.image_height = int(size.height);
  vo.image_width = int(size.width);
  return load_mg2_vae(lingbot_vae_path(model_dir, given), vo, why);
}

int64_t lingbot_max_area(const std::string& size) {
  const size_t star = size.find('*');
  auto number = [&](const std::string& s) -> int64_t {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) return 0;
    return std::stoll(s);
  };
  const int64_t h = star == std::string::npos ? 0 : number(size.substr(0, star));
  const int64_t w = star == std::string::npos ? 0 : number(size.substr(star + 1));
  if (h <= 0 || w <= 0) throw Error(str_cat("size '", size, "': expected HEIGHT*WIDTH, e.g. 480*832"));
  return h * w;
}

LingbotVideoSize lingbot_video_size(int64_t image_h, int64_t image_w, int64_t max_area) {
  WM_CHECK(image_h > 0 && image_w > 0 && max_area > 0, "bad image ", image_w, " x ", image_h, " or area ", max_area);
  const double ar = double(image_h) / double(image_w);
  const int64_t lat_h = int64_t(std::floor(std::floor(std::sqrt(double(max_area) * ar) / 8.0) / 2.0)) * 2;
  const int64_t lat_w = int64_t(std::floor(std::floor(std::sqrt(double(max_area) / ar) / 8.0) / 2.0)) * 2;
  if (lat_h <= 0 || lat_w <= 0)
    throw Error(str_cat("an area of ", max_area, " pixels gives a ", image_w, " x ", image_h,
                        " image no latent frame (16 x 16 pixels at least)"));
  return {8 * lat_h, 8 * lat_w};
}

at::Tensor lingbot_image_latents(const Image& image, const dit::WanVaeCodec& vae, int64_t n_latents,
                                 at::Device device) {
  WM_CHECK(image.width > 0 && image.height > 0, "the image is empty");
  WM_CHECK(n_latents >= 1, "n_latents must be >= 1, got ", n_latents);
  at::NoGradGuard ng;
  const int64_t h = vae.image_height(), w = vae.image_width();
  at::Tensor img = at::from_blob(const_cast<uint8_t*>(image.rgb.data()), {image.height, image.width, 3}, at::kByte)
                       .permute({2, 0, 1})
                       .to(at::kFloat)
                       .div_(255.0)
                       .sub_(0.5)
                       .div_(0.5);
  at::Tensor resized = at::upsample_bicubic2d(img.unsqueeze(0), {h, w}, false);  // [1, 3, h, w]
  at::Tensor video = at::zeros({1 + 4 * (n_latents - 1), 3, h, w}, resized.options());
  video[0].copy_(resized[0]);
  return vae.encode_video(video.to(vae.options().device), device);
}

at::Tensor load_lingbot_text_context(const std::string& path) {
  if (!fs::exists(path)) throw Error(str_cat(path, ": no such file (the text context)"));
  SafeTensors st = SafeTensors::open(path);
  if (!st.contains("context")) throw Error(str_cat(path, ": no tensor 'context' (umT5's output [L, text_dim])"));
  at::Tensor c = st.get("context").to(at::kFloat);
  if (c.dim() == 3 && c.size(0) == 1) c = c[0];
  if (c.dim() != 2) throw Error(str_cat(path, ": 'context' must be [L, text_dim] or [1, L, text_dim], got ", c.sizes()));
  return c;
}

std::string lingbot_checkpoint_dir(const std::string& model_dir) {
  fs::path p = fs::absolute(fs::path(model_dir)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "DIR/"
  return p.parent_path().string();
}

namespace {

// The prompt through umT5, the encoder checked against the DiT before its weights are read.
at::Tensor encode_lingbot_prompt(const std::string& prompt, const std::string& model_dir,
                                 const dit::LingbotConfig& cfg, at::Device device, at::ScalarType dtype,
                                 const std::string& program) {
  const dit::Umt5Files files = dit::find_umt5_files(lingbot_checkpoint_dir(model_dir));
  const int64_t dim = dit::umt5_config_from_checkpoint(files.encoder).dim;
  if (dim != cfg.text_dim)
    throw Error(str_cat(files.encoder, ": the umT5 encoder is ", dim, " wide, the DiT in ", model_dir, " takes ",
                        cfg.text_dim));
  std::fprintf(stderr, "%s: encoding the prompt with %s\n", program.c_str(), files.encoder.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  const dit::Umt5Prompt p = dit::encode_umt5_prompt(prompt, files, cfg.text_len, device, dtype);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "%s: prompt: %lld umT5 tokens of %d (EOS included), encoded in %.2f s\n", program.c_str(),
               static_cast<long long>(p.tokens), int(cfg.text_len), s);
  if (p.prompt_tokens > p.tokens)
    std::fprintf(stderr, "%s: the prompt's %lld tokens were cut to %lld, as upstream cuts them\n", program.c_str(),
                 static_cast<long long>(p.prompt_tokens), static_cast<long long>(p.tokens));
  return p.context;
}

}  // namespace

at::Tensor lingbot_text_context(const LingbotTextSource& source, const std::string& model_dir, at::Device device,
                                at::ScalarType dtype, const std::string& program) {
  if (source.prompt && !source.context_file.empty())
    throw Error("--prompt and --text-context both give the text context: give one");
  if (!source.prompt && source.context_file.empty()) return at::Tensor();
  at::NoGradGuard ng;
  const dit::LingbotConfig cfg = dit::load_lingbot_config(dit::find_lingbot_files(model_dir).config);
  if (source.prompt) return encode_lingbot_prompt(*source.prompt, model_dir, cfg, device, dtype, program);
  const at::Tensor t = load_lingbot_text_context(source.context_file);
  if (t.size(1) != cfg.text_dim || t.size(0) > cfg.text_len)
    throw Error(str_cat(source.context_file, ": context ", t.sizes(), ", the model takes [L <= ", cfg.text_len, ", ",
                        cfg.text_dim, "]"));
  return t;
}

LingbotTrajectory load_lingbot_poses(const std::string& path) {
  const fs::path file = fs::is_directory(path) ? fs::path(path) / "poses.npy" : fs::path(path);
  LingbotTrajectory t;
  at::Tensor p = cli::load_npy(file.string());
  if (p.dim() != 3 || p.size(1) != 4 || p.size(2) != 4 || p.size(0) < 1)
    throw Error(str_cat(file.string(), ": camera-to-world poses must be [N, 4, 4], got ", p.sizes()));
  if (!at::isfinite(p).all().item<bool>()) throw Error(str_cat(file.string(), ": a pose holds NaN or inf"));
  t.c2ws = p.to(at::kFloat);
  const fs::path kfile = file.parent_path() / "intrinsics.npy";
  if (fs::exists(kfile)) {
    at::Tensor k = cli::load_npy(kfile.string()).to(at::kDouble);
    if (k.size(-1) != 4 || k.dim() > 2 || k.numel() < 4)
      throw Error(str_cat(kfile.string(), ": intrinsics must be [N, 4] or [4] (fx, fy, cx, cy), got ", k.sizes()));
    k = k.reshape({-1, 4})[0];
    t.intrinsics = std::array<double, 4>{k[0].item<double>(), k[1].item<double>(), k[2].item<double>(),
                                         k[3].item<double>()};
  }
  // Retrieval poses relative to the first frame (roll dropped).
  const at::Tensor c2w = p.to(at::kDouble);
  const at::Tensor rel = at::matmul(at::inverse(c2w[0]).unsqueeze(0), c2w).contiguous();
  auto a = rel.accessor<double, 3>();
  for (int64_t i = 0; i < rel.size(0); ++i) {
    worldkv::Matrix4 m;
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) m[size_t(4 * r + c)] = a[i][r][c];
    t.poses.push_back(worldkv::pose_from_opencv(m));
  }
  return t;
}

LingbotTrajectory lingbot_generated_trajectory(const std::string& name, int n, uint64_t seed) {
  LingbotTrajectory t;
  worldkv::Pose p;
  for (const worldkv::Mg2Input& in : mg2_trajectory(name, n, "universal", seed)) {
    p = worldkv::mg2_integrate_pose(p, in, "universal", 1.0, 1.0);
    t.poses.push_back(p);
  }
  t.c2ws = worldkv::lingbot_c2ws(t.poses);
  return t;
}

}  // namespace wm::rollout
