#pragma once
// Benchmark suites of scene-trajectory pairs: generation from (seed, count), the JSON file format,
// loading with verification, and one entry point for programs: load_or_generate_suite(spec).
//
// JSON format ("wm.world.suite", version 1), all angles in degrees, positions in map cells:
//   {"format": "wm.world.suite", "version": 1, "name": "revisit60",
//    "generator": {"seed": 60, "count": 60},            // informative
//    "fps": 16,
//    "render": {"width": 64, "height": 64, "fov_deg": 90, "supersample": 2},
//    "revisit": {"pos_tol": 0.02, "yaw_tol_deg": 0.5, "pitch_tol_deg": 0.5, "min_gap_frames": 48,
//                "away_dist": 1.5, "away_yaw_deg": 90},
//    "episodes": [ {
//       "name": "revisit60/000",
//       "world": {"seed": 123, "layout": "rooms", "width": 24, "height": 20, "rooms": 6, "room_min": 3,
//                 "room_max": 7, "block_min": 2, "block_max": 4, "pillars": 0.5, "extra_links": 0.4,
//                 "landmarks": 6},
//       "motion": {"speed": 0.125, "radius": 0.2, "max_pitch_deg": 60},
//       "start": [x, y, yaw_deg] or [x, y, yaw_deg, pitch_deg],   // pose before frame 0
//       "frames": N,
//       "actions": [[count, "keys", dyaw_deg] or [count, "keys", dyaw_deg, dpitch_deg], ...],  // runs
//       "poses": {"every": 1, "decimals": 3, "values": [[x, y, yaw_deg(, pitch_deg)], ...]},   // optional
//       "revisits": [[first, revisit], ...],                // frame revisit shows frame first again
//       "segments": [["kind", start, end], ...] } ]}       // optional
// A file holding one episode object with "format": "wm.world.episode" and the fps / render /
// revisit fields beside it is accepted too. Poses are always re-derived from start + actions; stored
// poses (every k-th frame, rounded) are checked against them, and every listed revisit pair is
// checked against the criteria. Errors name the file and the field (episodes[3].actions[7][1] ...).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tools/world/scene.h"
#include "tools/world/trajectory.h"

namespace wm::world {

struct Suite {
  std::string name = "suite";
  int fps = 16;
  RenderSpec render;
  RevisitCriteria criteria;
  uint64_t gen_seed = 0;  // informative: what generated it (0 / 0 when unknown)
  int gen_count = 0;
  std::vector<Episode> episodes;
  std::string source;     // file path or "gen:SEED:COUNT" it came from
};

// Suites are split as the text tasks' held-out samples are (tools/llm_tasks/sample.h): a suite
// generated from a seed below 1000000 is a dev suite (settings are tuned on it; the shipped
// revisit60, seed 60, is one), from 2000000 on a test suite (figures are reported on it).
// "dev", "test", or "neither" (between the two, or unknown: gen_seed 0 and gen_count 0).
inline const char* suite_split(const Suite& s) {
  if (s.gen_seed == 0 && s.gen_count == 0) return "neither";
  return s.gen_seed < 1000000 ? "dev" : s.gen_seed >= 2000000 ? "test" : "neither";
}

struct SuiteOptions {
  std::string name = "suite";
  TrajectoryOptions trajectory;  // lengths, fps, criteria, render spec, PSNR check
};

// Generates `count` episodes; episode i uses seed json_safe_seed(hash_combine(seed, i)). Deterministic.
// progress (optional) is called after each episode with (done, count).
Suite generate_suite(uint64_t seed, int count, const SuiteOptions& options = {},
                     const std::function<void(int, int)>& progress = nullptr);

struct SaveOptions {
  int pose_every = 1;     // store every k-th pose (0 = no poses)
  int pose_decimals = 3;  // rounding of stored poses
  bool segments = true;   // store the generator's segments
};

struct LoadOptions {
  bool verify_poses = true;     // stored poses must match the re-derived ones
  bool verify_revisits = true;  // listed pairs must satisfy the criteria
};

// Serialises a suite to JSON text (one line per episode field, compact arrays).
std::string suite_to_json(const Suite& suite, const SaveOptions& options = {});
// Writes suite_to_json to a file; throws wm::Error naming the file on failure.
void save_suite(const Suite& suite, const std::string& path, const SaveOptions& options = {});
// Parses JSON text (suite or single episode); `source` names it in errors. Throws wm::Error
// with "source: field: expected ..., got ..." on bad input.
Suite suite_from_json(const std::string& text, const std::string& source, const LoadOptions& options = {});
// Reads and parses a suite file.
Suite load_suite(const std::string& path, const LoadOptions& options = {});

// The one entry point for programs: spec is a file path, or "gen:SEED:COUNT" to generate on the fly
// (with default SuiteOptions, named "gen-SEED"). Throws wm::Error.
Suite load_or_generate_suite(const std::string& spec, const LoadOptions& options = {});

// The scene of an episode (generate_scene(ep.world)).
inline Scene scene_of(const Episode& ep) { return generate_scene(ep.world); }

}  // namespace wm::world
