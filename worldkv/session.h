#pragma once
// The streaming session of every world model: a model kind (worldkv/model_adapter.h: the tiny
// DiT in tiny_dit_adapter.h, Matrix-Game-2.0 in mg2_adapter.h, LingBot-World-Fast in
// lingbot_adapter.h) generating video chunk by chunk
// from per-frame controls, over the window the world memory assembles (or the model's own
// window, "native"). Per chunk:
//   controls -> retrieval poses -> memory.prepare (the policy's plan applied) -> the model samples
//   over the window -> memory.commit (its refill K/V; what leaves is dropped or banked) and the
//   model's chunk state kept beside the chunk -> decoded frames
// This is what programs and the viewer drive; poses and controls are in the model's terms
// (worldkv/pose.h, worldkv/action.h), so a source of camera motion with its own types (a test
// world, a game engine, a script of keys) converts at its edge. The generation is the model's
// alone: nothing of past frames or of the ground truth is copied into the output.
#include <ATen/ATen.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dit/image.h"
#include "worldkv/model_adapter.h"
#include "worldkv/pose.h"
#include "worldkv/world_memory.h"

namespace wm::worldkv {

struct SessionConfig {
  MemoryConfig memory;         // policy, region sizes, compression, bank tiers (frames_per_chunk,
                               // denoise_frames and tokens_per_frame are taken from the model)
  bool native_window = false;  // the model's own window instead of the world memory
  uint64_t seed = 0;           // noise of every chunk is drawn from this

  // "native" (the model's own window) or a video policy's name; throws wm::Error for an unknown one.
  void set_policy(const std::string& name);
  // "native" or memory.policy's name.
  std::string policy_name() const;
  // Throws wm::Error for what no session could run: a window in files (memory.kv_files_dir) with
  // the model's own window, which stays in memory, or in a folder that cannot take a file. The
  // model-dependent checks come at reset.
  void check() const;
};

// One chunk of the rollout as the session made it, and the memory's size right after it: what
// programs, the episode runner and the viewer keep of a chunk.
struct ChunkOutput {
  int64_t index = 0;                   // chunk index
  std::vector<Image> frames;           // its decoded video frames, one per control (empty without a codec)
  at::Tensor latents;                  // [F, C, h, w] float32 on the CPU, clean
  std::vector<Pose> poses;             // retrieval pose of each of its video frames
  double ms = 0;                       // wall time of the chunk (memory, model, decode)
  double cpu_ms = 0;                   // the process's CPU time over the same span (all threads)
  double memory_ms = 0;                // of which the memory's own work: retrieval, placement, banking
  double model_ms = 0;                 // the model's sampling (steps and refill)
  double decode_ms = 0;                // the codec's decode
  std::vector<std::string> retrieved;  // chunks in the retrieved region for this chunk
  bool prompt = false;                 // the frames are the given prompt, not generated
  size_t window_bytes = 0;             // the window's bytes once the chunk is committed
  size_t state_bytes = 0;              // the model's chunk state kept (window and bank; MG2: action K/V)
  std::array<size_t, 3> bank_bytes{};  // the bank's bytes then, per tier: device, host, disk
};

class WorldSession {
 public:
  // Starts a rollout (reset(cfg.seed)). Throws wm::Error on a bad memory config, an unknown
  // policy, or a native window the model does not have.
  WorldSession(std::unique_ptr<ModelAdapter> model, SessionConfig cfg);

  // Generates the next chunk from its video frames' controls (controls_for_next_chunk() of them).
  // Throws wm::Error on a wrong count or controls the model cannot take, before anything changes.
  ChunkOutput next(const std::vector<FrameControl>& controls);
  // Starts the rollout from given frames, as image-to-video world models start from an image:
  // the frames (one chunk, the codec's size, one per control) are encoded and their K/V written
  // into the window as chunk 0. Must come first, with the world memory, for a model that can
  // (ModelInfo::prompt_frames); else wm::Error. The output holds the frames themselves (prompt).
  ChunkOutput prompt(const std::vector<Image>& frames, const std::vector<FrameControl>& controls);
  // Back to an empty memory and chunk 0 with a new noise seed, optionally under another policy
  // ("native" or a video policy's name; throws wm::Error for an unknown one or a bad memory
  // config, leaving the session as it was).
  void reset(uint64_t seed);
  void reset(uint64_t seed, const std::string& policy);

  // Video frames of control chunk `index` takes: 1 + s (F - 1) for the first, s F after.
  int controls_for_chunk(int64_t index) const;
  int controls_for_next_chunk() const { return controls_for_chunk(next_index_); }
  int frames_per_chunk() const { return model_->info().frames_per_chunk; }
  int64_t chunks_done() const { return next_index_; }
  // The world memory (null on the model's own window).
  const WorldMemory* memory() const { return memory_.get(); }
  const ModelAdapter& model() const { return *model_; }
  const ModelInfo& info() const { return model_->info(); }
  const SessionConfig& config() const { return cfg_; }
  // Retrieval pose of every video frame so far.
  const std::vector<Pose>& poses() const { return poses_; }

 private:
  // Checks the count and the model's reading of a chunk's controls, then appends them and their
  // poses; returns the chunk's latent frames' poses.
  std::vector<Pose> take_controls(const std::vector<FrameControl>& controls);
  // The step the model gets for the current chunk (prepare() already done).
  ChunkStep make_step(const std::vector<Pose>& latent_poses);
  // The chunks in the window in window order, with how far each was moved and its chunk state.
  std::vector<HeldChunk> held_chunks() const;
  // Has the memory lay out the window for the current chunk; sets out's memory_ms and retrieved.
  void prepare(const std::vector<Pose>& latent_poses, ChunkOutput& out);
  // Hands the chunk to the memory and keeps its state; sets out's memory figures.
  void commit(SampledChunk& s, const std::vector<Pose>& latent_poses, ChunkOutput& out);
  // Sets out's window, state and bank sizes from the memory as it is now.
  void record_sizes(ChunkOutput& out) const;

  std::unique_ptr<ModelAdapter> model_;
  SessionConfig cfg_;
  std::unique_ptr<WorldMemory> memory_;
  std::map<std::string, std::shared_ptr<ChunkState>> states_;  // by chunk id (world memory only)
  std::vector<FrameControl> controls_;
  std::vector<Pose> poses_;
  at::Generator gen_;
  int64_t next_index_ = 0;
};

}  // namespace wm::worldkv
