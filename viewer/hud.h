#pragma once
// The heads-up display: run figures and memory state as text in the panel, the window's
// regions as a bar of chunks, and the help overlay listing every key.
#include <SDL.h>

#include <string>
#include <vector>

#include "tools/world/pose.h"
#include "viewer/font.h"
#include "viewer/generator.h"

namespace wm::viewer {

struct HudInfo {
  std::string model;              // model name and where it came from
  std::string device;             // "cpu (2 threads)"
  std::string policy;             // the policy now in force
  uint64_t seed = 0;
  std::string scene;              // "rooms 24x20"
  int64_t chunks = 0, frames = 0; // generated in this scene/policy (epoch)
  double gen_fps = 0;             // frames generated per second of wall time, recent seconds
  double model_fps = 0;           // frames per second of model time (3 / chunk seconds)
  double last_ms = 0, p50_ms = 0, p90_ms = 0;
  world::Pose pose;               // of the frame on screen
  const MemorySnapshot* memory = nullptr;  // null before the first chunk
  bool recording = false;
  double record_s = 0;
  bool paused = false, captured = false, show_gt = false;
  std::string status;             // a transient message ("policy: worldkv_c")
};

// The HUD text block inside `area`.
void draw_hud(SDL_Renderer* r, const BitmapFont& font, const SDL_Rect& area, const HudInfo& info);
// The window [sink | retrieved | recent | denoise] as a row of chunk boxes named by chunk index,
// each region captioned and coloured; empty retrieved slots drawn as outlines.
void draw_region_bar(SDL_Renderer* r, const BitmapFont& font, const SDL_Rect& area, const MemorySnapshot* mem);
// What was retrieved for the chunk on screen (with distances) and a bar chart of the latest
// chunk latencies against the real-time budget (budget_ms; 0: none).
void draw_latency_graph(SDL_Renderer* r, const BitmapFont& font, const SDL_Rect& area, const std::vector<double>& ms,
                        double budget_ms, const MemorySnapshot* mem);
// The key list over `area` (a translucent box).
void draw_help(SDL_Renderer* r, const BitmapFont& font, const SDL_Rect& area);
// The same with another key list (lines of text).
void draw_help(SDL_Renderer* r, const BitmapFont& font, const SDL_Rect& area, const std::string& text);

// One number through a printf format ("%.1f"), for the panels' text.
std::string fmt(const char* f, double a);
// The machine's 1-minute load average (/proc/loadavg), -1 where it cannot be read: the viewers'
// summaries record it beside their frame rates.
double load_average();
// "1.23 MB", "512 B", ... for byte counts.
std::string format_bytes(size_t bytes);
// The chunk number of "chunk:42" (-1 when the id is not of that form).
int64_t chunk_number(const std::string& id);
// The key lines of the help overlay (also printed by --help).
const char* help_text();

}  // namespace wm::viewer
