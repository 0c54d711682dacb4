#pragma once
// A block: the unit of KV memory that leaves and re-enters the window (a video chunk, a file,
// a tool result, a user turn). Per layer it holds K and V [n_kv_heads, n_l, head_dim] (n_l may
// differ per layer after compression), per-token positions [n_l, n_axes] (int64, always on the
// CPU: bookkeeping, not compute) and per-token log-weights [n_l] (float32; 0 for an ordinary
// token, log p for a merged entry standing for p tokens).
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kv_spec.h"

namespace wm {

struct LayerKv {
  at::Tensor k;     // [n_kv_heads, n, head_dim], stored already rotated
  at::Tensor v;     // [n_kv_heads, n, head_dim]
  at::Tensor pos;   // [n, n_axes] int64, CPU
  at::Tensor logw;  // [n] float32, same device as k

  int64_t n_tokens() const { return k.defined() ? k.size(1) : 0; }
};

struct BlockMeta {
  std::string kind;          // "chunk", "file", "tool", "turn", ...
  std::vector<double> pose;  // free-form pose vector (video: x, y, yaw, ...); may be empty
  at::Tensor embedding;      // optional retrieval embedding, any shape, CPU
  double priority = 0.0;
  bool pinned = false;       // pinned blocks are demoted last and never dropped
  int64_t created = 0;       // step at which the block was made
};

struct BlockStats {
  double attn_ema = 0.0;  // exponential moving average of the attention mass it received
  int64_t last_use = 0;   // step of its last use
  int64_t uses = 0;
};

struct Block {
  std::string id;
  std::vector<LayerKv> layers;
  BlockMeta meta;
  BlockStats stats;

  int n_layers() const { return static_cast<int>(layers.size()); }
  // Bytes of K, V, positions and log-weights over all layers.
  size_t nbytes() const;
  // Tokens in layer l.
  int64_t n_tokens(int l) const { return layers.at(l).n_tokens(); }
  // A copy with K, V, log-weights on `device` (positions stay on the CPU). When the block is
  // already there and copy is false the tensors are shared, not copied.
  Block to(at::Device device, bool copy = false, bool non_blocking = false) const;
  // Throws wm::Error naming the block, layer and field on any shape, dtype or device mismatch.
  void validate(const KvSpec& spec) const;
};

// A block of n tokens in every layer with ordinary weights, from per-layer K/V; positions are
// given once [n, n_axes] and shared by all layers.
Block make_block(std::string id, std::vector<at::Tensor> k, std::vector<at::Tensor> v, const at::Tensor& pos);

}  // namespace wm
