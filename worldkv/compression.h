#pragma once
// Key-key compression of a chunk as it enters the bank. Per layer: the anchor (first) frame is
// kept whole; of the other tokens, keep the fraction r whose key, flattened over heads, has the
// lowest cosine similarity to the anchor frame's mean key: ceil(r * n) pooled over all
// non-anchor frames, or ceil(r * tokens_per_frame) in each frame. Kept tokens keep their
// positions (RoPE stays right) and their order.
//
// What becomes of the tokens that are not kept (the merge mode; merge by default):
//   drop   they are gone (the WorldKV paper's rule).
//   votes  each votes for the kept token whose key is most like its own (cosine, flattened over
//          heads); a kept token with p voters gets log-weight log(1 + p), so attention counts it
//          as the 1 + p keys it stands for (KeepKV's electoral votes). K and V are unchanged.
//   merge  votes, and the kept token's V becomes the mean of its own and its voters' V, weighted
//          by their weights (K stays: it carries the kept token's RoPE position).
// Log-weights already on the chunk add up: a token of weight w counts as w tokens.
#include <string>

#include "runtime/block.h"

namespace wm::worldkv {

enum class MergeMode { Drop, Votes, Merge };
MergeMode parse_merge_mode(const std::string& name);  // "drop", "votes", "merge"; wm::Error otherwise
std::string merge_mode_name(MergeMode m);

struct CompressionConfig {
  double keep_ratio = 0.25;
  bool per_frame = false;  // false: pooled over the non-anchor frames
  MergeMode merge = MergeMode::Merge;  // Drop: the WorldKV paper's rule
};

// The token indices kept in one layer's K [n_kv_heads, frames * tokens_per_frame, head_dim],
// ascending. Throws wm::Error if the token count is not frames * tokens_per_frame.
at::Tensor compression_keep_indices(const at::Tensor& k, int64_t tokens_per_frame, const CompressionConfig& cfg);

// How many tokens a chunk of `frames` frames keeps (the same in every layer).
int64_t compressed_token_count(int64_t frames, int64_t tokens_per_frame, const CompressionConfig& cfg);

// For each token of one layer's K, the position in `keep` (ascending token indices) of the kept
// token it goes to: a kept token goes to itself, a dropped one to the kept token of highest key
// cosine similarity (flattened over heads). [n] int64, on K's device.
at::Tensor vote_targets(const at::Tensor& k, const at::Tensor& keep);

// The compressed block (a copy; metadata and statistics carried over).
Block compress_chunk(const Block& chunk, int64_t tokens_per_frame, const CompressionConfig& cfg);

}  // namespace wm::worldkv
