#pragma once
// The viewer's options (wm_viewer's command line), for the app and the model views alike.
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>

namespace wm::viewer {

struct ViewerOptions {
  std::string model_path;        // the tiny model's safetensors (empty: the embedded one), a
                                 // Matrix-Game-2.0 folder (config.json + .safetensors) or its .safetensors,
                                 // or a LingBot-World-Fast folder
  uint64_t seed = 1;             // scene and noise seed
  std::string policy = "worldkv";  // a video policy, or "native" (Matrix-Game-2.0's own window)
  std::string device = "cpu";    // "cpu", "cuda", "cuda:N", "auto"
  int threads = 0;               // CPU threads for the model (0: all cores but one)
  int scale = 0;                 // frame upscale on screen (0: fit the window)
  int width = 0, height = 0;     // window size (0: from scale, or 1280 x 720)
  std::string record_path;       // start recording here at once (empty: only when R is pressed)
  int record_upscale = 4;        // nearest-neighbour upscale of recorded frames
  bool ground_truth = false;     // start with the ground-truth view beside the model's
  double fps = 16;               // frame clock: input sampling and display rate (0: as fast as generated)
  std::string script;            // script text (see script.h); empty: interactive
  std::string script_source;     // its name in errors ("--inject", a file name)
  std::string screenshot_path;   // PNG of the window at exit (after --chunks/--frames or the script)
  int64_t chunks = 0;            // exit after this many chunks (0: no limit)
  int64_t frames = 0;            // exit after this many frames (0: no limit)
  double timeout_s = 0;          // give up (error) after this long (0: never)
  bool software = false;         // SDL software renderer (headless, no GPU)
  std::string summary_json;      // write the run's summary here as JSON at exit
  // Matrix-Game-2.0 (viewer/mg2_view.h): the frames come from the Wan VAE, the first one from
  // `image` or `latents`.
  std::string mode;              // universal, gta_drive, templerun: checked against the model (empty: the model's)
  std::string image;             // first frame (PNG/JPEG); needs vae and clip
  std::string latents;           // instead of image: safetensors with image_latents [N,16,44,80], clip_tokens [257,1280]
  std::string vae;               // Wan2.1_VAE.pth (empty: beside the model folder, as the hub has it)
  std::string clip;              // models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (idem)
  std::string dtype = "f32";     // the DiT's precision: f32 or bf16
  int cond_latents = 8;          // latent frames of the image condition encoded (later ones reuse the last)
  // LingBot-World-Fast (viewer/lingbot_view.h), with image, vae, dtype and cond_latents above.
  std::string text_context;      // safetensors with `context` [L, 4096]
  std::optional<std::string> prompt;  // text through umT5 instead (neither: zero rows)
  std::string size = "480*832";  // the video's largest area, as upstream's --size
};

// The model's device from --device, the CPU threads set (--threads, or all cores but one, which
// the window's thread keeps: on 2 cores one model thread gives more frames/s than two) and freed
// memory kept for reuse; `desc` describes the device ("cpu (1 threads)"). Throws wm::Error for a
// bad --device.
at::Device choose_device(const ViewerOptions& o, std::string& desc);

}  // namespace wm::viewer
