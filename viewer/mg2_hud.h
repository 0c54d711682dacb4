#pragma once
// The heads-up display of the Matrix-Game-2.0 path: run figures (mode, policy, chunk ms split
// into DiT and VAE, window and action K/V bytes, the bank), the input of the frame on screen,
// the retrieval pose's track seen from above, and the key list of the mode.
#include <SDL.h>

#include <string>
#include <vector>

#include "viewer/font.h"
#include "viewer/generator.h"
#include "worldkv/action.h"
#include "worldkv/pose.h"
#include "worldkv/pose.h"

namespace wm::viewer {

struct Mg2HudInfo {
  std::string model;                // where the model came from ("universal/model.safetensors")
  std::string device;               // "cpu (2 threads)"
  std::string mode;                 // universal, gta_drive, templerun
  std::string policy;               // native or a video policy
  std::vector<std::string> keyboard_names;  // the mode's keyboard entries
  int64_t chunks = 0, frames = 0;   // generated since the last restart
  double gen_fps = 0;               // frames generated per second of wall time, recent seconds
  double model_fps = 0;             // frames per second of model time (frames of a chunk / its ms)
  double last_ms = 0, p50_ms = 0, p90_ms = 0;  // chunk ms (DiT, rest of the session, VAE decode)
  double dit_ms = 0, decode_ms = 0; // of the last chunk
  size_t window_bytes = 0;          // main window (or rolling cache) after the last chunk
  size_t action_bytes = 0;          // action K/V kept
  const MemorySnapshot* memory = nullptr;  // null before the first chunk
  const worldkv::Mg2Input* input = nullptr;  // of the frame on screen (null: none yet)
  worldkv::Pose pose;               // retrieval pose of the frame on screen
  bool recording = false;
  double record_s = 0;
  bool paused = false, captured = false;
  std::string status;               // a transient message
};

// The HUD text block inside `area`.
void draw_mg2_hud(SDL_Renderer* r, const BitmapFont& font, const SDL_Rect& area, const Mg2HudInfo& info);
// The track of retrieval poses (x, y) from above, fitted into `area` with equal axes: the path,
// the chunks in the window (region colours, when the memory has chunk poses) and the camera
// with its heading.
void draw_mg2_track(SDL_Renderer* r, const BitmapFont& font, const SDL_Rect& area, const std::vector<worldkv::Pose>& track,
                    const MemorySnapshot* mem);
// "W . . D" for universal's keys, "W ." for gta_drive's, the action's name for templerun's.
std::string format_mg2_keys(const worldkv::Mg2Input& in, const std::vector<std::string>& names);
// The key lines of the help overlay for a mode (also printed by --help).
std::string mg2_help_text(const std::string& mode);

}  // namespace wm::viewer
