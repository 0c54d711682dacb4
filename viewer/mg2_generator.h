#pragma once
// The Matrix-Game-2.0 generation worker: a thread that owns the WorldSession (Mg2Adapter) and the Wan VAE codec
// and turns chunks of per-video-frame inputs into decoded frames, so the UI thread never waits
// on the model. As Generator does for the tiny model: requests and restarts are served in order,
// every result carries the epoch it was made in, and a restart (a policy switch, or the same
// policy again from the first frame) starts a new epoch.
#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dit/codec.h"
#include "dit/mg2_model.h"
#include "viewer/generator.h"
#include "worldkv/mg2_adapter.h"
#include "worldkv/session.h"

namespace wm::viewer {

// What a rollout starts from: the model, its first frame's condition, the session's settings.
struct Mg2Start {
  dit::Mg2Dit model{nullptr};
  at::Tensor image_latents;          // [N, 16, 44, 80] float32
  at::Tensor clip_tokens;            // [257, 1280] float32
  worldkv::SessionConfig session;    // policy ("native" or a video policy), memory sizes, seed
  at::Device device = at::kCPU;
};

struct Mg2Result {
  uint64_t epoch = 0;
  worldkv::ChunkOutput chunk;              // index, latents, decoded frames (one per input), timings,
                                           // window / action / bank bytes; of a failed chunk the index only
  double decode_ms = 0;                    // the codec's share, not in chunk.ms
  std::vector<worldkv::Mg2Input> inputs;   // the request's, one per frame
  std::vector<worldkv::Pose> poses;        // retrieval pose after each of its frames
  MemorySnapshot memory;                   // the window the chunk was made over (native: the
                                           // chunks whose frames the rolling window held)
  std::string error;                       // non-empty: the chunk failed with this message
};

class Mg2Generator {
 public:
  // Builds and starts the session (throws wm::Error on a bad policy, memory config or
  // condition), then the worker. codec decodes every chunk; on_result (optional) is called on the
  // worker thread after each result is queued and must not block.
  Mg2Generator(Mg2Start start, std::unique_ptr<dit::Codec> codec, std::function<void()> on_result = nullptr);
  // Stops the worker after the chunk it is on (queued requests are dropped) and joins it.
  ~Mg2Generator();
  Mg2Generator(const Mg2Generator&) = delete;
  Mg2Generator& operator=(const Mg2Generator&) = delete;

  // Queues the next chunk of the current epoch: inputs_for_chunk(its index) inputs.
  void submit(std::vector<worldkv::Mg2Input> inputs);
  // Queues a restart from the first frame under `policy` ("native" or a video policy name; the
  // caller checks the name); returns the new epoch.
  uint64_t restart(const std::string& policy);
  // The oldest finished result, if any (never blocks).
  std::optional<Mg2Result> poll();
  // Chunk requests queued or in progress.
  int pending() const;
  // Video frames of input chunk `index` of a rollout takes: 1 + 4 (F - 1) for the first, 4 F after.
  int inputs_for_chunk(int64_t index) const;
  const dit::Mg2Config& model_config() const { return start_.model->config(); }

 private:
  struct Job {
    bool restart = false;
    uint64_t epoch = 0;
    std::string policy;
    std::vector<worldkv::Mg2Input> inputs;
  };
  using Regions = std::vector<std::pair<std::string, std::vector<std::string>>>;
  std::unique_ptr<worldkv::WorldSession> make_session(const std::string& policy) const;
  void run();
  Mg2Result generate(const Job& job);

  Mg2Start start_;
  std::unique_ptr<dit::Codec> codec_;
  std::function<void()> on_result_;
  std::unique_ptr<worldkv::WorldSession> session_;  // worker-only once the worker runs
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::deque<Mg2Result> results_;
  int pending_chunks_ = 0;
  uint64_t epoch_ = 0;
  bool stop_ = false;
  Regions after_commit_;  // worker-only: the world memory's regions after the last commit
  std::thread worker_;    // last: starts after everything above is built
};

}  // namespace wm::viewer
