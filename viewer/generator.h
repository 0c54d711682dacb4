#pragma once
// The generation worker: a thread that owns the WorldSession (any model kind) and turns chunk
// requests into chunk results, so the UI thread never waits on the model. Requests and resets are
// served in the order they are made; every result carries the epoch it was made in, and a reset
// starts a new epoch, so the UI can drop results that a reset made stale.
#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "worldkv/pose.h"
#include "worldkv/session.h"

namespace wm::viewer {

// What the HUD and the panels show of the memory, copied on the worker thread.
struct MemorySnapshot {
  std::string policy;
  // The window chunk i was made over, in window order: {"sink", [...]}, {"retrieved", [...]},
  // {"recent", [...]}, {"denoise", ["chunk:i"]} (regions the policy lacks are left out); on the
  // model's own window {"rolling", [the chunks whose frames it holds]}, {"denoise", ...}.
  std::vector<std::pair<std::string, std::vector<std::string>>> window;
  int retrieved_capacity = 0;                  // chunks the retrieved region can hold (0: none), as
                                               // the memory lays it out (worldkv::window_chunks)
  std::vector<std::string> retrieved;          // retrieved for chunk i, nearest first
  std::vector<double> retrieved_distance;      // their retrieval distances (pose or attention score)
  std::vector<std::string> banked;             // ids in the bank, oldest first
  std::vector<worldkv::Pose> chunk_poses;      // mean pose of every committed chunk, by index
  std::array<size_t, 3> tier_count{}, tier_bytes{};  // bank per tier: device, host, disk
  size_t window_bytes = 0;
};

// A chunk of controls, one per video frame (WorldSession::controls_for_chunk of them).
struct ChunkRequest {
  std::vector<worldkv::FrameControl> controls;
  std::vector<Image> prompt_frames;  // first chunk of a rollout only: the frames the model starts
                                     // from (WorldSession::prompt); else empty
};

// A request served: the session's output for it and the memory as the HUD shows it.
struct ChunkResult {
  uint64_t epoch = 0;
  worldkv::ChunkOutput chunk;  // index in its epoch, frames, poses, timings, sizes; of a failed
                               // chunk, the index only
  std::vector<worldkv::FrameControl> controls;  // the request's, one per frame
  MemorySnapshot memory;
  std::string error;           // non-empty: the chunk (or the reset before it) failed with this message
};

class Generator {
 public:
  // Starts the worker, which owns `session`. on_result (optional) is called on the worker thread
  // after each result is queued (e.g. to wake the UI's event loop); it must not block.
  Generator(std::unique_ptr<worldkv::WorldSession> session, std::function<void()> on_result = nullptr);
  // Stops the worker after the chunk it is on (queued requests are dropped) and joins it.
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Queues a chunk of the current epoch.
  void submit(ChunkRequest request);
  // Queues a reset of the session (empty memory, chunk 0, noise seed, policy: "native" or a video
  // policy); returns the new epoch, whose results follow every earlier request's.
  uint64_t reset(uint64_t seed, const std::string& policy);
  // The oldest finished result, if any (never blocks).
  std::optional<ChunkResult> poll();
  // Chunk requests queued or in progress (resets not counted).
  int pending() const;
  uint64_t epoch() const;
  // The model (fixed; readable from any thread) and the video frames of control chunk `index`
  // of a rollout takes.
  const worldkv::ModelInfo& info() const { return info_; }
  int controls_for_chunk(int64_t index) const;

 private:
  struct Job {
    bool reset = false;
    uint64_t epoch = 0;
    uint64_t seed = 0;
    std::string policy;
    ChunkRequest chunk;
  };
  void run();
  ChunkResult generate(Job& job);
  void push(ChunkResult r, bool chunk);

  std::unique_ptr<worldkv::WorldSession> session_;
  worldkv::ModelInfo info_;
  std::function<void()> on_result_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::deque<ChunkResult> results_;
  int pending_chunks_ = 0;
  uint64_t epoch_ = 0;
  bool stop_ = false;
  // Worker-only state: the window after the last commit (the next chunk's window before retrieval).
  std::vector<std::pair<std::string, std::vector<std::string>>> after_commit_;
  std::thread worker_;  // last: starts after everything above is built
};

// Takes the snapshot of `memory` right after chunk `index` was generated over a window whose
// sink/recent regions were `before` (the layout after the previous commit) and whose retrieved
// region was `retrieved`.
MemorySnapshot snapshot_memory(const worldkv::WorldMemory& memory, int64_t index,
                               const std::vector<std::pair<std::string, std::vector<std::string>>>& before,
                               const std::vector<std::string>& retrieved);

// The snapshot of a chunk made on the model's own window: the chunks it held, the chunk's window bytes.
MemorySnapshot snapshot_native(const worldkv::WorldSession& session, const worldkv::ChunkOutput& chunk);

}  // namespace wm::viewer
