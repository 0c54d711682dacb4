#pragma once
// Beam search whose beams share one KV cache. Per layer the cache holds K and V
// [capacity, n_beams, n_kv_heads, head_dim]: at each position every beam writes its token's
// K/V into its own row, in place. A beam table [n_beams, capacity] (int64) records, for beam b
// and position j, which row holds the K/V that b reads at j. When the beams are reordered after
// a step (a beam continues from another's history), only the table's rows are rewritten; no K/V
// moves. The prompt is stored once (row 0) and read by every beam.
//
// beam_search_copying() is the plain reference: each beam owns a copy of its cache, and a
// reorder copies the parent's cache. Both run the same selection and the same arithmetic on the
// same K/V layout, so they return the same beams and the same scores bit for bit.
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "llmkv/model.h"
#include "runtime/kv_spec.h"

namespace wm::llm {

class BeamKvCache {
 public:
  // Preallocates `capacity` positions for n_beams beams in every layer of `spec`.
  BeamKvCache(const KvSpec& spec, int n_beams, int64_t capacity);

  int n_beams() const { return n_beams_; }
  int64_t capacity() const { return capacity_; }
  // Copies a prefix every beam shares, k and v [n_kv_heads, n, head_dim], into row 0 of layer l
  // at positions [0, n), the table pointing every beam at row 0 there. Throws wm::Error if it
  // does not fit.
  void write_prefix(int l, const at::Tensor& k, const at::Tensor& v);
  // Writes each beam's K/V at position t of layer l, k and v [n_beams, n_kv_heads, 1, head_dim],
  // into the beam's own row; the table then points each beam at its own row for t.
  void write(int l, int64_t t, const at::Tensor& k, const at::Tensor& v);
  // What beam b reads at positions [0, n) of layer l, for all beams:
  // K, V [n_beams, n_kv_heads, n, head_dim] (contiguous, gathered through the table). The
  // gather materialises each beam's keys for the attention call (a kernel reading through the
  // table would not); the cache itself is never rewritten.
  std::pair<at::Tensor, at::Tensor> gather(int l, int64_t n) const;
  // After a step: beam b continues from beam parents[b]; rewrites the table over positions
  // [0, n). The K/V buffers are not touched.
  void reorder(const std::vector<int64_t>& parents, int64_t n);
  // The table [n_beams, capacity] (int64, CPU).
  const at::Tensor& table() const { return table_; }
  // Bytes of K and V allocated over all layers.
  size_t bytes() const;

 private:
  KvSpec spec_;
  int n_beams_;
  int64_t capacity_;
  std::vector<at::Tensor> k_, v_;  // per layer [capacity, n_beams, n_kv_heads, head_dim]
  at::Tensor table_;               // [n_beams, capacity] int64, CPU
};

// The search keeps max(2, 1 + end tokens) x num_beams candidates per step, so that num_beams
// of them continue however many end tokens rank among the best. A candidate ending in an end
// token, among the num_beams best, becomes a finished hypothesis, ranked by its score over its
// length (without the end token) to the power length_penalty. The search stops once num_beams
// hypotheses have finished (Hugging Face's early_stopping=True) or at max_new_tokens, where the
// open beams join the ranking (length = their tokens).
struct BeamOptions {
  int num_beams = 4;
  int64_t max_new_tokens = 32;
  double length_penalty = 1.0;  // a finished beam ranks by score / length^length_penalty
  std::vector<int64_t> eos_token_ids;
  int64_t prefill_chunk = 512;

  // Throws wm::Error naming the field on a non-positive count or a non-finite penalty.
  void validate() const;
};

struct BeamHypothesis {
  std::vector<int64_t> tokens;  // generated tokens (an end token included when it ended)
  double score = 0.0;           // sum of the tokens' log-probabilities (float64)
  double ranked = 0.0;          // score / length^length_penalty
  bool finished = false;        // ended by an end token
};

struct BeamResult {
  std::vector<BeamHypothesis> beams;  // best first, num_beams of them
  size_t cache_bytes = 0;             // K/V allocated for the beams (not counting the prompt's window)
  size_t bytes_copied = 0;            // K/V bytes copied by reorders (0 with the beam table)
};

// Beam search from prompt (token ids) on `device` with the shared cache and beam table.
BeamResult beam_search(LlmModelImpl& model, const std::vector<int64_t>& prompt, const BeamOptions& opt,
                       at::Device device, at::ScalarType dtype = at::kFloat);

// The same search where every beam keeps its own cache and a reorder copies it (reference).
BeamResult beam_search_copying(LlmModelImpl& model, const std::vector<int64_t>& prompt, const BeamOptions& opt,
                               at::Device device, at::ScalarType dtype = at::kFloat);

}  // namespace wm::llm
