#include "viewer/summary.h"

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "viewer/hud.h"

namespace wm::viewer {

std::string format_summary(const ViewerSummary& s) {
  char b[1024];
  std::string out;
  std::snprintf(b, sizeof b, "wm_viewer: %lld chunks (%lld frames) in %.1f s; %s; policy %s; %s; model %s\n",
                static_cast<long long>(s.chunks), static_cast<long long>(s.frames), s.wall_s, s.kind.c_str(),
                s.policy.c_str(), s.device.c_str(), s.model.c_str());
  out += b;
  std::snprintf(b, sizeof b, "  chunk ms: mean %.1f  p50 %.1f  p90 %.1f  min %.1f  max %.1f (model %.1f, decode %.1f)\n",
                s.chunk_ms.mean, s.chunk_ms.p50, s.chunk_ms.p90, s.chunk_ms.min, s.chunk_ms.max, s.model_ms_mean,
                s.decode_ms_mean);
  out += b;
  std::snprintf(b, sizeof b, "  generated fps: %.1f from the session's time, %.1f delivered over the run\n", s.model_fps,
                s.delivered_fps);
  out += b;
  std::snprintf(b, sizeof b, "  pose: start (%.2f, %.2f, yaw %.1f) -> end (%.2f, %.2f, yaw %.1f)", s.start.x, s.start.y,
                worldkv::degrees(s.start.yaw), s.end.x, s.end.y, worldkv::degrees(s.end.yaw));
  out += b;
  if (s.load_avg >= 0) {
    std::snprintf(b, sizeof b, "; load average %.2f", s.load_avg);
    out += b;
  }
  out += "\n";
  std::snprintf(b, sizeof b, "  %lld video frames of control; window %s, chunk state %s, bank %s\n",
                static_cast<long long>(s.controls), format_bytes(s.window_bytes).c_str(),
                format_bytes(s.state_bytes).c_str(),
                format_bytes(s.bank_bytes[0] + s.bank_bytes[1] + s.bank_bytes[2]).c_str());
  out += b;
  for (const auto& p : s.screenshots) out += "  screenshot: " + p + "\n";
  for (const auto& p : s.recordings) out += "  recording: " + p + "\n";
  return out;
}

void write_summary_json(const ViewerSummary& s, const std::string& path) {
  using nlohmann::json;
  auto pose = [](const worldkv::Pose& p) {
    return json{{"x", p.x}, {"y", p.y}, {"yaw_deg", worldkv::degrees(p.yaw)}, {"pitch_deg", worldkv::degrees(p.pitch)}};
  };
  auto rect = [](const SDL_Rect& r) { return json::array({r.x, r.y, r.w, r.h}); };
  json keys = json::object();
  for (const auto& [name, n] : s.keys) keys[name] = n;
  json j{{"kind", s.kind},
         {"name", s.name},
         {"model", s.model},
         {"chunks", s.chunks},
         {"frames", s.frames},
         {"controls", s.controls},
         {"wall_s", s.wall_s},
         {"chunk_ms", {{"n", s.chunk_ms.n}, {"mean", s.chunk_ms.mean}, {"p50", s.chunk_ms.p50}, {"p90", s.chunk_ms.p90},
                       {"min", s.chunk_ms.min}, {"max", s.chunk_ms.max}}},
         {"model_ms_mean", s.model_ms_mean},
         {"decode_ms_mean", s.decode_ms_mean},
         {"model_fps", s.model_fps},
         {"delivered_fps", s.delivered_fps},
         {"policy", s.policy},
         {"device", s.device},
         {"seed", s.seed},
         {"start", pose(s.start)},
         {"end", pose(s.end)},
         {"shown", pose(s.shown)},
         {"window", {s.win_w, s.win_h}},
         {"layout", {{"frame", rect(s.layout.frame)}, {"gt", rect(s.layout.gt)}, {"hud", rect(s.layout.hud)},
                     {"minimap", rect(s.layout.minimap)}, {"bar", rect(s.layout.bar)}, {"graph", rect(s.layout.graph)},
                     {"scale", s.layout.scale}}},
         {"ground_truth_shown", s.ground_truth_shown},
         {"screenshots", s.screenshots},
         {"recordings", s.recordings},
         {"load_avg", s.load_avg},
         {"keys", keys},
         {"window_bytes", s.window_bytes},
         {"state_bytes", s.state_bytes},
         {"bank_bytes", {s.bank_bytes[0], s.bank_bytes[1], s.bank_bytes[2]}}};
  std::ofstream f(path);
  if (!f) throw Error(str_cat("write_summary_json: cannot open '", path, "'"));
  f << j.dump(2) << "\n";
  if (!f) throw Error(str_cat("write_summary_json: cannot write '", path, "'"));
}

}  // namespace wm::viewer
