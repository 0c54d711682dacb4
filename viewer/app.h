#pragma once
// The interactive viewer: an SDL2 window that runs the world model live. The UI thread polls
// events, samples held input on a 16 fps frame clock into per-frame actions, integrates the
// camera against the ground-truth scene and hands chunks of poses + actions to the generation
// worker; finished frames are shown as they come, with the HUD, the window-regions bar and the
// minimap. A script can drive it headless (tests, demos) and it can exit after N chunks.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tools/world/pose.h"
#include "tools/world/scene.h"
#include "viewer/layout.h"
#include "viewer/stats.h"

namespace wm::viewer {

struct ViewerOptions {
  std::string model_path;        // safetensors written by the trainer (config in its metadata)
  uint64_t seed = 1;             // scene and noise seed
  std::string policy = "worldkv";
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
  // Matrix-Game-2.0 (viewer/mg2_app.h): model_path names its folder (config.json + .safetensors)
  // or its .safetensors; the frames come from the Wan VAE, the first one from `image` or `latents`.
  std::string mode;              // universal, gta_drive, templerun: checked against the model (empty: the model's)
  std::string image;             // first frame (PNG/JPEG); needs vae and clip
  std::string latents;           // instead of image: safetensors with image_latents [N,16,44,80], clip_tokens [257,1280]
  std::string vae;               // Wan2.1_VAE.pth (empty: beside the model folder, as the hub has it)
  std::string clip;              // models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (idem)
  std::string dtype = "f32";     // the DiT's precision: f32 or bf16
  int cond_latents = 8;          // latent frames of the image condition encoded (later ones reuse the last)
};

struct ViewerSummary {
  int64_t chunks = 0, frames = 0;  // generated and shown, all scenes and policies
  double wall_s = 0;               // from the first request to the last result
  LatencySummary chunk_ms;
  double model_fps = 0;            // frames per second of model time: 3 / mean chunk seconds
  double delivered_fps = 0;        // frames generated per second of wall time
  std::string policy, device, model;
  uint64_t seed = 0;
  world::Pose start, end;          // camera before the first frame and after the last requested one
  world::Pose shown;               // camera of the last frame shown
  int win_w = 0, win_h = 0;
  Layout layout;                   // at exit
  bool ground_truth_shown = false;
  std::vector<std::string> screenshots, recordings;
  double load_avg = -1;            // 1-minute load average at exit (-1: unknown)
  // Matrix-Game-2.0 only (mode empty otherwise). start/end/shown are the retrieval poses (x, y,
  // yaw in degrees) before the first frame, after the last frame generated and of the one shown.
  std::string mode;
  int64_t inputs = 0;               // video frames of input handed to the model
  std::vector<std::pair<std::string, int64_t>> keyboard_frames;  // per keyboard entry: frames it was on
  size_t window_bytes = 0, action_bytes = 0;  // after the last chunk
  double dit_ms_mean = 0, decode_ms_mean = 0;
};

// Runs the viewer until quit, the chunk/frame limit or the end of the script: the tiny model's
// path, or Matrix-Game-2.0's (run_mg2_viewer) when is_mg2_model says so. Throws wm::Error
// (model missing, SDL failure, bad script, timeout) with a message for the user.
ViewerSummary run_viewer(const ViewerOptions& options);

// The summary as printed on exit (a few lines).
std::string format_summary(const ViewerSummary& s);
// Writes the summary as JSON. Throws wm::Error naming the path if it cannot be written.
void write_summary_json(const ViewerSummary& s, const std::string& path);

// A start pose for a scene: the centre of the free cell with the longest free run ahead along
// one of the four axes (the one nearest the map's centre among equals), facing along it.
world::Pose start_pose(const world::Scene& scene);

// The model path to use: `path` if given; else the embedded model
// assets/models/tiny/model.safetensors (relative to the working directory, then to the source
// tree). Throws wm::Error saying where it looked and how to get one.
std::string resolve_model_path(const std::string& path);

}  // namespace wm::viewer
