#pragma once
// Key-key compression of a chunk as it enters the bank. Per layer: the anchor (first) frame is
// kept whole; of the other tokens, keep the fraction r whose key, flattened over heads, has the
// lowest cosine similarity to the anchor frame's mean key: ceil(r * n) pooled over all
// non-anchor frames, or ceil(r * tokens_per_frame) in each frame. Kept tokens keep their
// positions (RoPE stays right) and their order.
#include "runtime/block.h"

namespace wm::worldkv {

struct CompressionConfig {
  double keep_ratio = 0.25;
  bool per_frame = false;  // false: pooled over the non-anchor frames
};

// The token indices kept in one layer's K [n_kv_heads, frames * tokens_per_frame, head_dim],
// ascending. Throws wm::Error if the token count is not frames * tokens_per_frame.
at::Tensor compression_keep_indices(const at::Tensor& k, int64_t tokens_per_frame, const CompressionConfig& cfg);

// How many tokens a chunk of `frames` frames keeps (the same in every layer).
int64_t compressed_token_count(int64_t frames, int64_t tokens_per_frame, const CompressionConfig& cfg);

// The compressed block (a copy; metadata and statistics carried over).
Block compress_chunk(const Block& chunk, int64_t tokens_per_frame, const CompressionConfig& cfg);

}  // namespace wm::worldkv
