#pragma once
// A scene-trajectory pair ("episode") and the generator of trajectories with loop closures:
// yaw sweeps away and back, out-and-back walks (turn round, step back, strafe back), laps round
// a block, returns to an earlier view, repeated revisits; with travel in between so that revisits
// happen in the middle of a trajectory too.
#include <cstdint>
#include <string>
#include <vector>

#include "tools/world/actions.h"
#include "tools/world/raycaster.h"
#include "tools/world/revisits.h"
#include "tools/world/scene.h"

namespace wm::world {

// A stretch of a trajectory and what the generator meant it to be (frames [start, end)).
struct Segment {
  std::string kind;  // "travel", "yaw_sweep", "spin", "look_around", "out_and_back", "step_back",
                     // "strafe_back", "loop_block", "return", "repeat_sweep"
  int start = 0;
  int end = 0;
};

// A scene-trajectory pair: the world (by params), the start pose, per-frame actions, and what
// follows from them: per-frame poses (re-derived by integrate) and detected revisit pairs.
struct Episode {
  std::string name;
  WorldParams world;
  MotionParams motion;
  Pose start;                         // pose before frame 0
  std::vector<Action> actions;        // one per frame
  std::vector<Pose> poses;            // one per frame: integrate(scene, motion, start, actions)
  std::vector<RevisitPair> revisits;  // loop closures (frame revisit shows frame first again)
  std::vector<Segment> segments;      // generator's plan, for analysis; may be empty

  int frames() const { return static_cast<int>(actions.size()); }
};

struct TrajectoryOptions {
  int fps = 16;
  int min_seconds = 10;        // trajectory length drawn uniformly in whole seconds
  int max_seconds = 60;
  RevisitCriteria criteria;
  RenderSpec render;           // used to check revisit pairs by rendering
  double min_psnr_db = 30.0;   // pairs whose ground-truth renders agree less are dropped
  bool verify_psnr = true;
  int max_attempts = 20;       // plans tried until one has a revisit
};

// Validates options; throws wm::Error naming the field.
void validate(const TrajectoryOptions& o);

// Re-derives ep.poses from ep.start and ep.actions in `scene`.
void derive_poses(Episode& ep, const Scene& scene);

// Generates an episode in a scene drawn from the seed (random_world_params). Deterministic in
// (seed, options). Throws wm::Error if no plan with a revisit is found.
Episode generate_episode(uint64_t seed, const TrajectoryOptions& options = {});

// Generates a trajectory in the given scene (its params are stored in the episode).
Episode generate_episode(const Scene& scene, uint64_t seed, const TrajectoryOptions& options = {});

// PSNR (dB, wm::media::psnr: uncapped, +infinity where the two renders are identical) of the
// ground-truth renders at each revisit pair's two frames, in pair order. Throws wm::Error for a
// pair out of range.
std::vector<double> revisit_psnrs(const Episode& ep, const Scene& scene, const RenderSpec& spec);

}  // namespace wm::world
