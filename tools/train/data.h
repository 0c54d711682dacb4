#pragma once
// Training samples for the world model, shaped like the windows it meets at inference: for a
// target chunk i of a trajectory with loop closures, the context is the sink (chunk 0), up to
// `retrieved` earlier chunks nearest in camera pose (what worldkv retrieves; for a revisit, the
// first visit), and the recent chunk i-1; or (sliding_prob) the chunks just before i, as a
// sliding window holds them. Fresh scenes every sample: no fixed data set.
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "dit/codec.h"
#include "dit/config.h"
#include "tools/world/trajectory.h"

namespace wm::train {

struct SampleOptions {
  int retrieved = 3;            // retrieved chunks in the context
  double revisit_prob = 0.6;    // target a revisit chunk (when the trajectory has one)
  double random_ctx_prob = 0.2; // retrieved chunks drawn at random instead of by pose
  double sliding_prob = 0.0;    // instead, the `sliding_chunks` chunks just before the target
  int sliding_chunks = 5;       // (no sink): the window of a sliding_window rollout
  int min_seconds = 10, max_seconds = 24;
};

// One sample: S chunks in time order, the last one the target.
struct Sample {
  at::Tensor latents;      // [S * F, C, h, w] float32, clean
  at::Tensor frame_index;  // [S * F] int64, absolute frame index in the trajectory
  at::Tensor pose;         // [S * F, 3]
  at::Tensor action;       // [S * F, 5]
  std::vector<int> chunks; // chunk index of each of the S chunks
  bool revisit = false;    // the target revisits a view of a context chunk
  int first_visit_chunk = -1;  // that chunk (revisit samples)
  int retrieved_begin = 0, retrieved_end = 0;  // chunks[retrieved_begin, retrieved_end): retrieved ones
};

// Makes the sample for one seed (scene, trajectory and choices all follow from it).
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

}  // namespace wm::train
