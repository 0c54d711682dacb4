#pragma once
// Attention of the current tokens' queries over [window keys; current keys]:
//   softmax(q . K^T / sqrt(d) + [logw; 0] + mask) . V
// The per-key log-weight makes one merged entry count as p identical keys (log p). GQA: n_heads
// is a multiple of n_kv_heads. Masking applies among the current tokens only; every query sees
// every window key. Optionally returns the attention mass each key received.
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
};

struct AttentionResult {
  at::Tensor out;       // [n_heads, n_q, head_dim] (or [B, n_heads, n_q, head_dim])
  at::Tensor key_mass;  // [n_kv_heads, n_k] float32: softmax mass per key, summed over the
                        // queries and the query heads of each kv head (if captured)
};

// q [n_heads, n_q, d] or [B, n_heads, n_q, d]; k, v [n_kv_heads, n_k, d] (or with B);
// logw [n_k] float32 or undefined (all 0). With a mask, the queries are the last n_q current
// tokens: query i is current token (n_k - n_window - n_q + i). Throws wm::Error on bad shapes.
AttentionResult attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logw,
                          const AttentionOptions& opt = {});

// The additive bias [n_q, n_k] (float32): log-weights plus the mask (-inf where hidden).
at::Tensor attention_bias(int64_t n_q, int64_t n_k, const at::Tensor& logw, const AttentionOptions& opt,
                          at::Device device);

}  // namespace wm
