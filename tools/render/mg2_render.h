#pragma once
// wm_render's Matrix-Game-2.0 path: a model folder as the hub lays it out, a first image (or given
// image latents and CLIP tokens), an actions file or a generated trajectory, a memory policy; the
// decoded frames to MP4 and/or the latents to safetensors.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace wm::render {

struct Mg2RenderOptions {
  std::string model;       // DiT folder (config.json + .safetensors) or its .safetensors
  std::string mode;        // expected mode; empty: the model's
  std::string image;       // first frame (PNG/JPEG)
  std::string vae;         // Wan2.1_VAE.pth (default: beside the model folder, as the hub has it)
  std::string clip;        // models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (idem)
  std::string latents_in;  // instead of --image: safetensors with image_latents [N,16,44,80], clip_tokens [257,1280]
  std::string latents_out; // write the generated latents here (safetensors)
  std::string actions;     // actions file (one line per video frame)
  std::string trajectory = "revisit";  // generated when no actions file
  int chunks = 0;          // 0: what the actions cover (or 4 for a trajectory)
  std::string policy = "native";
  int sink_frames = 0, retrieved_frames = 9, recent_frames = 3;
  std::string placement = "original";
  std::string kv_files;    // keep the window's K/V in files in this folder (empty: in memory)
  std::string dtype = "f32";
  std::string out;         // MP4 (needs the VAE)
  int fps = 12;            // upstream writes its demos at 12 frames/s
  int cond_latents = 0;    // latents of the image condition to encode (0: every chunk's)
  uint64_t seed = 0;
  std::string device = "auto";
  int threads = 0;

  void add_to(CLI::App& app);
};

// Runs it; throws wm::Error on bad input. Returns the process exit code.
int run_mg2_render(const Mg2RenderOptions& o);

}  // namespace wm::render
