#pragma once
// A world model kind behind the streaming session (worldkv/session.h): what differs between the
// tiny DiT, Matrix-Game-2.0 and LingBot-World-Fast is its conditioning (camera poses, keyboard
// and mouse, text or image context), its sampler, its codec and any per-chunk
// state that must travel with the chunk's K/V (Matrix-Game-2.0's action K/V). Everything else
// lives once in the session: the memory's plan/apply around each chunk, the retrieval pose of
// every frame, the chunk bookkeeping, the timings and the bank's statistics.
//
// Frames: a chunk is frames_per_chunk latent frames. A codec with a temporal stride s (the Wan
// VAE: 4; the tiny model's pixel patches: 1) makes 1 + s (F - 1) video frames of the first
// chunk and s F of every later one, and the session takes one FrameControl per video frame.
// Latent frame j has the retrieval pose of video frame s j.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dit/image.h"
#include "runtime/kv_spec.h"
#include "runtime/window.h"
#include "worldkv/action.h"
#include "worldkv/pose.h"

namespace wm::worldkv {

// One video frame's control input, whatever drives the model: each kind reads the fields it is
// driven by and ignores the others (ModelInfo::controls names them).
struct FrameControl {
  Pose pose;       // the camera pose of the frame (pose-driven kinds: the tiny DiT, LingBot-World)
  Action action;   // the movement keys and the turn that led to it (the tiny DiT)
  Mg2Input mg2;    // keyboard and mouse (Matrix-Game-2.0); its pose is integrated from them
};

// Controls of pose-driven frames (one action per pose) and of keyboard-and-mouse frames. Throws
// wm::Error when the lists differ in length.
std::vector<FrameControl> pose_controls(const std::vector<Pose>& poses, const std::vector<Action>& actions);
std::vector<FrameControl> mg2_controls(const std::vector<Mg2Input>& inputs);

// What the session and the programs need to know of a model kind; fixed for the adapter's life.
struct ModelInfo {
  std::string kind;               // "tiny_dit", "matrix-game-2.0", "lingbot-world-fast"
  std::string name;               // the model's own name (config) or mode
  std::string controls;           // what drives it: "pose+action", "keyboard+mouse", "pose"
  int frames_per_chunk = 3;       // latent frames a chunk
  int64_t tokens_per_frame = 0;   // latent tokens a frame (the memory's unit)
  int temporal_stride = 1;        // video frames a latent frame (after the first)
  int frame_width = 0, frame_height = 0;  // of the decoded frames (0: no codec)
  double hfov_deg = 0;            // horizontal field of view the model was trained with (0: unknown)
  bool native_window = false;     // the model has a window of its own (MG2: upstream's rolling cache)
  bool chunk_state = false;       // sample() returns per-chunk state that travels with the chunk
  bool prompt_frames = false;     // prompt() can start a rollout from given frames
};

// Per-chunk state of a model that travels with the chunk's K/V: kept by the session under the
// chunk's id for as long as the chunk is in the window or in the bank.
class ChunkState {
 public:
  virtual ~ChunkState() = default;
  virtual size_t nbytes() const = 0;
};

// A chunk in the window while the next one is made, in window order.
struct HeldChunk {
  std::string id;
  int64_t shift = 0;                  // latent frames it was moved by since it was made (re-anchored)
  const ChunkState* state = nullptr;  // what the model kept of it (null when it keeps nothing)
};

// What the model gets to make chunk `index`; valid during the call.
struct ChunkStep {
  int64_t index = 0;
  int64_t first_frame = 0;                          // absolute latent frame of the chunk's first
  const std::vector<FrameControl>* controls = nullptr;  // every video frame's control so far
  size_t first_control = 0;                         // where this chunk's begin in *controls
  const std::vector<Pose>* latent_poses = nullptr;  // retrieval pose of each of its latent frames
  KvWindow* window = nullptr;                       // the world memory's window; null: the model's own
  std::vector<HeldChunk> held;                      // with the world memory and chunk_state only
  at::Generator* gen = nullptr;                     // the rollout's noise (CPU generator)

  // This chunk's controls.
  std::vector<FrameControl> chunk_controls() const {
    return {controls->begin() + static_cast<std::ptrdiff_t>(first_control), controls->end()};
  }
};

// A chunk as the model made it.
struct SampledChunk {
  at::Tensor latents;                  // [F, C, h, w] clean, on the model's device and dtype
  std::vector<LayerKv> kv;             // its refill K/V for the world memory (with window only)
  std::shared_ptr<ChunkState> state;   // travels with the chunk (null: none)
};

class ModelAdapter {
 public:
  virtual ~ModelAdapter() = default;

  virtual const ModelInfo& info() const = 0;
  // The K/V spec of the world memory's window (layers, heads, head dim, dtype, device).
  virtual KvSpec kv_spec() const = 0;
  // Throws wm::Error naming the frame and what is wrong when a chunk's controls do not fit the
  // model (Matrix-Game-2.0: the keyboard's width); before the session changes anything.
  virtual void check_controls(const std::vector<FrameControl>& controls) const { (void)controls; }
  // The retrieval pose after one more video frame of control, from `previous` (the first frame's
  // from Pose{}): the given pose, or one integrated from keys and mouse.
  virtual Pose next_pose(const Pose& previous, const FrameControl& control) const = 0;
  // A new rollout: the codec's streaming state, the model's own window, anything kept between
  // chunks. `native`: the rollout runs on the model's own window (ModelInfo::native_window).
  virtual void reset(bool native) = 0;
  // Samples chunk step.index over step.window (or the model's own window, which it also updates).
  virtual SampledChunk sample(const ChunkStep& step) = 0;
  // Chunk 0 from given frames (the codec's size, one per control): encoded and passed once through
  // the model at t = 0 over step.window for their K/V. Throws wm::Error unless info().prompt_frames.
  virtual SampledChunk prompt(const std::vector<Image>& frames, const ChunkStep& step);
  // The chunk's video frames from its latents (continuing the codec's stream); empty without a codec.
  virtual std::vector<Image> decode(const at::Tensor& latents) = 0;

  // The model's own window (native_window only): bytes of its K/V and of its chunk state, and
  // the chunks whose frames it holds while chunk `index` is made, oldest first.
  virtual size_t native_window_bytes() const { return 0; }
  virtual size_t native_state_bytes() const { return 0; }
  virtual std::vector<std::string> native_window_chunks(int64_t index) const {
    (void)index;
    return {};
  }
};

}  // namespace wm::worldkv
