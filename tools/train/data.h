#pragma once
// Training samples for the world model, shaped like the windows it meets at inference: for a
// target chunk i of a trajectory with loop closures, the context is the window the world memory
// lays out for chunk i (worldkv::window_chunks of SampleOptions::memory): its sink, of the banked
// chunks as many as the retrieved region holds, nearest in camera pose (what worldkv retrieves;
// for a revisit, the first visit), and its recent chunks; or (sliding_prob) the window of a
// sliding_window memory of the same size, the chunks just before i. Fresh scenes every sample:
// no fixed data set.
#include <ATen/ATen.h>

#include <functional>
#include <future>
#include <map>

#include <cstdint>
#include <vector>

#include "dit/codec.h"
#include "dit/config.h"
#include "tools/world/trajectory.h"
#include "worldkv/memory_config.h"

namespace wm::train {

struct SampleOptions {
  worldkv::MemoryConfig memory;  // the window's policy and region sizes (its frames_per_chunk and
                                 // tokens_per_frame are the model's, as in a session)
  double revisit_prob = 0.6;     // target a revisit chunk (when the trajectory has one whose first
                                 // visit is banked by then)
  double random_ctx_prob = 0.2;  // retrieved chunks drawn at random from the bank instead of by pose
  double sliding_prob = 0.0;     // instead, the window of a sliding_window memory (no sink)
  int min_seconds = 10, max_seconds = 24;
};

// The memory config whose window a sample follows: opt.memory, or for a sliding sample the
// sliding_window policy over the same region sizes; frames_per_chunk, denoise_frames and
// tokens_per_frame taken from the model's config.
worldkv::MemoryConfig window_config(const SampleOptions& opt, const dit::DitConfig& cfg, bool sliding);

// One sample: S chunks in time order, the last one the target: the window's sink, retrieved and
// recent chunks, then the target.
struct Sample {
  at::Tensor latents;      // [S * F, C, h, w] float32, clean
  at::Tensor frames;       // [S * F, H, W, 3] uint8: the rendered frames the latents encode
  at::Tensor frame_index;  // [S * F] int64, absolute frame index in the trajectory
  at::Tensor pose;         // [S * F, 3]
  at::Tensor action;       // [S * F, 5]
  std::vector<int> chunks; // chunk index of each of the S chunks
  bool revisit = false;    // the target revisits a view of a context chunk
  int first_visit_chunk = -1;  // that chunk (revisit samples)
  int retrieved_begin = 0, retrieved_end = 0;  // chunks[retrieved_begin, retrieved_end): retrieved ones
                                               // (after the sink, before recent)
};

// Makes the sample for one seed (scene, trajectory and choices all follow from it). Throws
// wm::Error on a trajectory shorter than two chunks or a bad opt.memory.
Sample make_sample(uint64_t seed, const dit::DitConfig& cfg, const dit::Codec& codec, const SampleOptions& opt);

// Chunk-level visibility for teacher forcing over [S - 1 clean context chunks ; the last K chunks
// noisy]: clean j sees clean j' <= j; noisy copy of chunk c sees the clean chunks before c and
// itself. [S - 1 + K, S - 1 + K] bool.
at::Tensor visibility(int S, int K);

// Compressed retrieved chunks, as worldkv_c banks them: in the token-level attention bias
// [n, n] of the teacher-forcing layout [S - 1 clean chunks ; noisy chunks] (see visibility),
// every query after a retrieved chunk sees its anchor (first) frame whole and, of its other
// tokens, the ceil(keep * n) least similar to the anchor frame's mean (worldkv's
// compression_keep_indices, pooled); the rest become -inf. It ranks the clean latent patches
// (inference ranks keys per layer; the latent patch is what the first layer's keys are made of). The chunk's own queries and earlier
// ones see it whole, as when its K/V were made.
void hide_compressed_tokens(at::Tensor& bias, const Sample& s, const dit::DitConfig& cfg, double keep);

// Makes the samples of the steps ahead on worker threads while the current step trains: the
// sample of step k is make_sample(seed_of(k), ...), whatever thread made it, so a run with
// prefetching draws exactly the samples of a run without. take(k) returns step k's sample
// (making it here if no worker has) and keeps the next `threads` steps under way. threads 0:
// none, every sample made in take(). The codec must allow concurrent encode() calls (the
// built-in ones are stateless).
class SamplePrefetcher {
 public:
  SamplePrefetcher(int threads, std::function<uint64_t(int64_t step)> seed_of, const dit::DitConfig& cfg,
                   const dit::Codec& codec, SampleOptions opt);
  ~SamplePrefetcher();
  SamplePrefetcher(const SamplePrefetcher&) = delete;
  SamplePrefetcher& operator=(const SamplePrefetcher&) = delete;
  Sample take(int64_t step);

 private:
  int threads_;
  std::function<uint64_t(int64_t)> seed_of_;
  const dit::DitConfig& cfg_;
  const dit::Codec& codec_;
  SampleOptions opt_;
  std::map<int64_t, std::future<Sample>> ahead_;
};

}  // namespace wm::train
