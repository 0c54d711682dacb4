#pragma once
// A streaming world session: the world model generating video chunk by chunk from the camera
// poses and actions it is given, over the window the world memory assembles. Per chunk:
// memory.prepare -> sampler (N steps over the window) -> refill K/V -> memory.commit -> decode.
// The generation is the model's alone: nothing of the past frames or the ground truth is copied
// into the output (a warp_reference model reads the last frame made, turned to the new yaws, as
// an input: dit/README.md). This is what programs and the viewer drive; poses and actions are in the
// model's terms (worldkv/pose.h, worldkv/action.h), so a source of camera motion with its own
// types (a test world, a game engine) converts at its edge.
#include <ATen/ATen.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "dit/codec.h"
#include "dit/image.h"
#include "dit/model.h"
#include "dit/sampler.h"
#include "worldkv/action.h"
#include "worldkv/pose.h"
#include "worldkv/world_memory.h"

namespace wm::worldkv {

struct SessionConfig {
  MemoryConfig memory;       // policy, region sizes, compression, bank tiers (tokens_per_frame
                             // and frames_per_chunk are taken from the model)
  dit::SamplerConfig sampler;
  uint64_t seed = 0;         // noise of every chunk is drawn from this
};

// One chunk of the rollout as the session made it, and the memory's size right after it: what
// programs, the episode runner and the viewer keep of a chunk.
struct ChunkOutput {
  int64_t index = 0;                  // chunk index
  std::vector<Image> frames;          // frames_per_chunk decoded RGB frames
  double ms = 0;                      // wall time of the chunk (sampling, refill, memory, decode)
  double cpu_ms = 0;                  // the process's CPU time over the same span (all threads)
  double memory_ms = 0;               // of which the memory's own work: retrieval, placement, banking
  std::vector<std::string> retrieved; // chunks in the retrieved region for this chunk
  bool prompt = false;                // the frames are the given prompt, not generated
  size_t window_bytes = 0;            // the window's bytes once the chunk is committed
  std::array<size_t, 3> bank_bytes{}; // the bank's bytes then, per tier: device, host, disk
};

class WorldSession {
 public:
  // The model is shared (sessions of several policies may use one), the codec is the model's.
  // Throws wm::Error on a bad memory config or an unknown policy.
  WorldSession(dit::CausalDit model, SessionConfig cfg, at::Device device);

  // Generates the next chunk for frames with these poses and actions (frames_per_chunk each).
  // Throws wm::Error on a wrong count.
  ChunkOutput next(const std::vector<Pose>& poses, const std::vector<Action>& actions);
  // Starts the rollout from given frames, as image-to-video world models start from an image:
  // the frames (one chunk, the codec's size) are encoded and their K/V written into the window
  // as chunk 0 by the refill pass. Must come first (else wm::Error). The output holds the
  // prompt frames themselves (prompt = true).
  ChunkOutput prompt(const std::vector<Image>& frames, const std::vector<Pose>& poses,
                     const std::vector<Action>& actions);
  // Back to an empty memory and chunk 0, with a new noise seed and optionally another policy.
  void reset(uint64_t seed);
  void reset(uint64_t seed, Policy policy);

  int frames_per_chunk() const;
  int64_t chunks_done() const { return next_index_; }
  const WorldMemory& memory() const { return *memory_; }
  const dit::CausalDit& model() const { return model_; }
  const SessionConfig& config() const { return cfg_; }
  at::Device device() const { return device_; }

 private:
  // Keeps the chunk's last frame and its yaw (cond.pose's last row) for the next reference
  // (warp_reference models; a no-op for the others).
  void keep_last_frame(const at::Tensor& latents, const dit::FrameCond& cond);
  // Sets out's window and bank sizes from the memory as it is now.
  void record_memory_size(ChunkOutput& out) const;

  dit::CausalDit model_;
  std::unique_ptr<dit::Codec> codec_;
  SessionConfig cfg_;
  at::Device device_;
  std::unique_ptr<WorldMemory> memory_;
  at::Generator gen_;
  int64_t next_index_ = 0;
  // The last frame made (or prompted), latents [C, h, w], and its yaw in degrees: the next
  // chunk's reference for a warp_reference model.
  at::Tensor last_latent_;
  double last_yaw_deg_ = 0;
};

// Loads a model saved by the trainer (config in its metadata) onto `device`, in eval mode.
// Throws wm::Error (or wm::CorruptData) naming the file.
dit::CausalDit load_world_model(const std::string& path, at::Device device);

}  // namespace wm::worldkv
