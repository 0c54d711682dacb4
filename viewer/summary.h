#pragma once
// The viewer's summary of a run, the same shape for every model kind: printed on exit and, with
// --summary-json, written as JSON.
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "viewer/layout.h"
#include "viewer/stats.h"
#include "worldkv/pose.h"

namespace wm::viewer {

struct ViewerSummary {
  std::string kind, name;          // the model kind and its name (ModelInfo)
  std::string model;               // the model and where it came from
  int64_t chunks = 0, frames = 0;  // generated and shown, all restarts
  int64_t controls = 0;            // video frames of control handed to the model
  double wall_s = 0;               // from the first request to the last result
  LatencySummary chunk_ms;         // the session's time a chunk
  double model_ms_mean = 0, decode_ms_mean = 0;  // of which the model's sampling, the codec's decode
  double model_fps = 0;            // frames per second of the session's time
  double delivered_fps = 0;        // frames generated per second of wall time
  std::string policy, device;
  uint64_t seed = 0;
  worldkv::Pose start, end, shown;  // retrieval poses: before the first frame, of the last frame
                                    // received, of the frame on screen at exit
  int win_w = 0, win_h = 0;
  Layout layout;                   // at exit
  bool ground_truth_shown = false;
  std::vector<std::string> screenshots, recordings;
  double load_avg = -1;            // 1-minute load average at exit (-1: unknown)
  std::vector<std::pair<std::string, int64_t>> keys;  // per input entry: the frames it was on
  size_t window_bytes = 0, state_bytes = 0;           // after the last chunk
  std::array<size_t, 3> bank_bytes{};                 // idem, per tier: device, host, disk
};

// The summary as printed on exit (a few lines).
std::string format_summary(const ViewerSummary& s);
// Writes the summary as JSON. Throws wm::Error naming the path if it cannot be written.
void write_summary_json(const ViewerSummary& s, const std::string& path);

}  // namespace wm::viewer
