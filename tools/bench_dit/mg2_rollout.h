#pragma once
// wm_bench_dit --mg2-rollout MODE: frames per second of a whole Matrix-Game-2.0 rollout at the
// release's shape (random weights: speed does not depend on them), as a user runs it: per chunk
// the denoising steps, the t = 0 refresh pass, the memory's own work and the Wan VAE's streaming
// decode of the chunk's 12 video frames (9 for the first), under each memory policy asked for.
//
// The camera walks forward while turning (W held, yaw +0.05 a video frame: a full turn every 126
// frames, ~10 chunks), so that policies that retrieve by pose find banked chunks again. A
// rollout is measured at each length asked for (seconds of video at --video-fps frames a second):
// frames per second of wall time over the whole rollout so far and over its last 10 chunks. A
// policy whose memory outgrows the device (full KV over a long rollout) is reported with the
// chunk at which it failed and the others go on.
#include <cstdint>
#include <string>
#include <vector>

namespace wm::bench {

struct Mg2RolloutOptions {
  std::string mode = "universal";
  std::vector<std::string> policies;  // native, full_kv, worldkv, worldkv_c, ...
  std::vector<double> seconds;        // checkpoints, in seconds of video; the last is the length
  double video_fps = 25;              // video frames per second of video
  std::string device = "auto";
  std::string dtype = "bf16";         // the DiT's: f32 or bf16
  bool decode = true;                 // Wan VAE decode per chunk (random weights, float16)
  double bank_device_gib = 8;         // the bank's device tier (GPU); the rest on the host
  bool pin_host = true;               // the bank's host tier in pinned memory
  int layers = 0;                     // keep the first `layers` blocks (0: all 30)
  uint64_t seed = 0;
  std::string json_out;
};

// Prints a table on stdout and progress on stderr; returns the exit code (0). Throws wm::Error on
// bad options.
int run_mg2_rollout(const Mg2RolloutOptions& o);

}  // namespace wm::bench
