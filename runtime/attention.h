#pragma once
// Attention of the current tokens' queries over [window keys; current keys]:
//   softmax(q . K^T / sqrt(d) + [logw; 0] + mask) . V
// The per-key log-weight makes one merged entry count as p identical keys (log p). GQA: n_heads
// is a multiple of n_kv_heads. Masking applies among the current tokens only; every query sees
// every window key. Optionally returns the attention mass each key received.
//
// Without fused SDPA (libtorch 1.x, a mass capture, or allow_fused off) the queries run in
// chunks whose scores stay small (cache-sized on the CPU): a masked chunk reads only the keys it
// may see, the mask touches only the chunk's diagonal keys (a cached tile), the softmax runs in
// place, and autograd sees one node per call whose backward walks the same chunks. K/V are
// never repeated per query head.
#include <ATen/ATen.h>

#include <cstdint>

namespace wm {

struct AttentionMask {
  enum Kind { None, Causal, BlockCausal };
  Kind kind = None;
  int64_t block = 1;  // BlockCausal: current token i sees current token j iff j / block <= i / block
};

struct AttentionOptions {
  AttentionMask mask;
  int64_t n_window = 0;        // the first n_window keys are the window's; the rest are current
  bool capture_mass = false;   // fill AttentionResult::key_mass
  bool allow_fused = true;     // use fused SDPA (libtorch 2.x) when no capture is asked
  int64_t chunk_elems = 0;     // score elements (batch x heads x queries x keys) per query chunk;
                               // 0: automatic. Results do not depend on it beyond rounding
};

struct AttentionResult {
  at::Tensor out;       // [n_heads, n_q, head_dim] (or [B, n_heads, n_q, head_dim])
  at::Tensor key_mass;  // [n_kv_heads, n_k] float32: softmax mass per key, summed over the
                        // queries and the query heads of each kv head (if captured)
};

// q [n_heads, n_q, d] or [B, n_heads, n_q, d]; k, v [n_kv_heads, n_k, d] (or with B);
// logw [n_k] float32 or undefined (all 0). With a mask, the queries are the last n_q current
// tokens: query i is current token (n_k - n_window - n_q + i). out need not be contiguous.
// Gradients flow to q, k, v and logw. Throws wm::Error on bad shapes.
AttentionResult attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logw,
                          const AttentionOptions& opt = {});

// The additive bias [n_q, n_k] (float32): log-weights plus the mask (-inf where hidden), a new
// tensor on `device`. Throws wm::Error if a mask has fewer current keys than queries.
at::Tensor attention_bias(int64_t n_q, int64_t n_k, const at::Tensor& logw, const AttentionOptions& opt,
                          at::Device device);

}  // namespace wm
