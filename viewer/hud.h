#pragma once
// The heads-up display, the same for every model kind: run figures and memory state as text in
// the panel (with the model view's own lines among them), the window's regions as a bar of
// chunks, what was retrieved with a graph of chunk latencies, and the help overlay.
#include <SDL.h>

#include <string>
#include <vector>

#include "viewer/font.h"
#include "viewer/generator.h"
#include "viewer/palette.h"
#include "worldkv/pose.h"

namespace wm::viewer {

// A line of the HUD: a label and its value.
struct HudLine {
  std::string label, value;
  SDL_Color color = palette::kText;  // of the value
};

struct HudInfo {
  std::string header;             // "TINY DIT", "MATRIX-GAME-2.0"
  std::string model;              // the model and where it came from
  std::string device;             // "cpu (2 threads)"
  std::string policy;             // the policy now in force
  std::vector<HudLine> model_lines;  // the model view's (scene, mode), after the policy
  std::vector<HudLine> input_lines;  // the model view's of the frame on screen, after the pose
  int64_t chunks = 0, frames = 0; // generated since the last restart
  double gen_fps = 0;             // frames generated per second of wall time, recent seconds
  double model_fps = 0;           // frames per second of the session's time
  double last_ms = 0, p50_ms = 0, p90_ms = 0;  // chunk latency
  double model_ms = 0, decode_ms = 0;          // of the last chunk: the model's sampling, the codec's decode
  worldkv::Pose pose;             // retrieval pose of the frame on screen
  size_t window_bytes = 0;        // after the last chunk (the memory's window or the model's own)
  std::string state_label;        // the model's chunk state ("action K/V"; empty: it keeps none)
  size_t state_bytes = 0;
  const MemorySnapshot* memory = nullptr;  // null before the first chunk
  bool recording = false;
  double record_s = 0;
  bool paused = false, captured = false, mouse = true, show_gt = false;
  std::string status;             // a transient message ("policy: worldkv_c")
};

// The HUD text block inside `area`.
void draw_hud(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const HudInfo& info);
// The window [sink | retrieved | recent | denoise] as a row of chunk boxes named by chunk index,
// each region captioned and coloured; empty retrieved slots drawn as outlines.
void draw_region_bar(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const MemorySnapshot* mem);
// What was retrieved for the chunk on screen (with distances) and a bar chart of the latest
// chunk latencies against the real-time budget (budget_ms; 0: none).
void draw_latency_graph(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::vector<double>& ms,
                        double budget_ms, const MemorySnapshot* mem);
// A key list (lines of text) over `area`, in a translucent box.
void draw_help(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::string& text);
// A caption centred in a dark translucent box over `area` ("PAUSED (P)").
void draw_banner(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::string& text, SDL_Color c);

// One number through a printf format ("%.1f"), for the panels' text.
std::string fmt(const char* f, double a);
// Milliseconds as "120 ms", or as seconds from 10 s up ("61.3 s"): a chunk takes 0.1 s on a GPU
// and minutes on a CPU.
std::string format_ms(double ms);
// Several times in the unit of the largest, each after its label: ({120, 95}, {"", "  p50 "}) ->
// "120  p50 95 ms".
std::string format_ms_list(const std::vector<double>& ms, const std::vector<std::string>& labels);
// The machine's 1-minute load average (/proc/loadavg), -1 where it cannot be read: the viewer's
// summary records it beside its frame rates.
double load_average();
// "1.23 MB", "512 B", ... for byte counts.
std::string format_bytes(size_t bytes);
// The chunk number of "chunk:42" (-1 when the id is not of that form).
int64_t chunk_number(const std::string& id);

}  // namespace wm::viewer
