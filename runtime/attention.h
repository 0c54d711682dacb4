#pragma once
// Attention of the current tokens' queries over [window keys; current keys]:
//   softmax(q . K^T / sqrt(d) + [logw; 0] + mask + bias) . V
// The per-key log-weight makes one merged entry count as p identical keys (log p). GQA: n_heads
// is a multiple of n_kv_heads. Masking applies among the current tokens only; every query sees
// every window key. An optional dense additive bias (any visibility pattern the mask kinds do not
// express, e.g. teacher forcing) is added on top. Optionally returns the attention mass each key
// received.
//
// With fused SDPA (libtorch 2.x): a plain causal self-attention runs with is_causal and no bias
// tensor; without a mask or bias the log-weights are one broadcast row; a mask is built once per
// shape and reused. GQA reads K/V through views (the query heads of a kv head folded into the
// query length, or SDPA's enable_gqa from 2.5 on); only a masked GQA call on libtorch 2.0-2.4
// repeats K/V per query head.
//
// Without fused SDPA (libtorch 1.x, a mass capture, or allow_fused off) the queries run in
// chunks whose scores stay bounded (cache-sized on the CPU for short windows, up to 128 MiB over
// long ones): a masked chunk reads only the keys it may see, the mask touches only the chunk's
// diagonal keys (a cached tile), the softmax runs in place, and autograd sees one node per call
// whose backward walks the same chunks. Over many
// keys a chunk covers a group of heads (down to one kv head) with enough query rows for its
// products to be efficient, rather than every head with a few rows. K/V are never repeated per
// query head. bfloat16 on a CPU with bfloat16 units (no-grad calls): the two products there
// (runtime/onednn.h), the scores and softmax in float32; half types otherwise in float32.
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
  at::Tensor bias;             // optional additive bias [n_q, n_k] or [B or 1, 1, n_q, n_k] (float;
                               // 0 where seen, -inf where hidden), added to the log-weights and
                               // the mask; undefined: none. It gets a gradient only if it requires
                               // one (the plain path). Prefer the mask kinds where they suffice
  bool capture_mass = false;   // fill AttentionResult::key_mass
  int64_t mass_queries = 0;    // the mass of the last mass_queries queries only (0: of all), e.g.
                               // SnapKV's observation window
  bool allow_fused = true;     // use fused SDPA (libtorch 2.x) when no capture is asked
  bool cpu_bf16_products = true;  // bfloat16 on a CPU with bfloat16 units (onednn.h): the two
                               // products in bfloat16 with float32 accumulation, the scores and
                               // softmax in float32, the probabilities rounded to bfloat16 for the
                               // second product, as flash attention computes on a GPU (no-grad
                               // calls); off: in float32 throughout
  int64_t chunk_elems = 0;     // score elements (batch x heads x queries x keys) per chunk; 0:
                               // automatic. Results do not depend on it beyond rounding
};

struct AttentionResult {
  at::Tensor out;       // [n_heads, n_q, head_dim] (or [B, n_heads, n_q, head_dim])
  at::Tensor key_mass;  // [n_kv_heads, n_k] float32: softmax mass per key, summed over the
                        // queries and the query heads of each kv head (if captured)
};

// q [n_heads, n_q, d] or [B, n_heads, n_q, d]; k, v [n_kv_heads, n_k, d] (or with B);
// logw [n_k] float32 or undefined (all 0). With a mask, the queries are the last n_q current
// tokens: query i is current token (n_k - n_window - n_q + i). out need not be contiguous.
// Gradients flow to q, k, v, and to logw and opt.bias when they require grad (then the plain,
// unchunked path runs). Throws wm::Error on bad shapes.
AttentionResult attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logw,
                          const AttentionOptions& opt = {});

// The additive bias (float32): log-weights plus the mask (-inf where hidden) plus opt.bias, a new
// tensor on `device`, [n_q, n_k] (or [B, 1, n_q, n_k] if opt.bias has a batch). Throws wm::Error if
// a mask has fewer current keys than queries or opt.bias does not fit.
at::Tensor attention_bias(int64_t n_q, int64_t n_k, const at::Tensor& logw, const AttentionOptions& opt,
                          at::Device device);

}  // namespace wm
