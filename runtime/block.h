#pragma once
// A block: the unit of KV memory that leaves and re-enters the window (a video chunk, a file,
// a tool result, a user turn). Per layer it holds K and V [n_kv_heads, n_l, head_dim] (n_l may
// differ per layer after compression), per-token positions [n_l, n_axes] (int64, always on the
// CPU: bookkeeping, not compute) and per-token log-weights [n_l] (float32; 0 for an ordinary
// token, log p for a merged entry standing for p tokens).
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
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

// What the owning path keeps with a block beyond the generic metadata (the video path: the
// chunk's camera pose and first frame, worldkv/chunk_payload.h). Immutable once attached, shared by
// copies of the metadata. Spill files keep it as {"type": type(), "data": to_json()} and read it
// back through the decoder registered for its type (register_block_payload); the bank keeps
// the metadata itself in memory, whatever its tier.
class BlockPayload {
 public:
  virtual ~BlockPayload() = default;
  // A name for the type, unique over the program ("worldkv.chunk").
  virtual std::string type() const = 0;
  // The payload's fields as JSON; decoding it gives an equal payload back.
  virtual nlohmann::json to_json() const = 0;
};

using BlockPayloadDecoder = std::shared_ptr<const BlockPayload> (*)(const nlohmann::json& data);
// Registers how spill files decode payloads of `type` (once per type, e.g. from a static
// initializer in the file that defines it). Returns true; throws wm::Error if `type` already has
// another decoder. Thread-safe.
bool register_block_payload(const std::string& type, BlockPayloadDecoder decode);
// The payload of `type` decoded from `data`. Throws wm::Error naming the type and the registered
// ones if none is registered, and whatever the decoder throws on bad data.
std::shared_ptr<const BlockPayload> decode_block_payload(const std::string& type, const nlohmann::json& data);

// A block's metadata. The block's identity is Block::id; the metadata travels with the block
// through the window (place, extract, remove), the bank and spill files.
struct BlockMeta {
  std::string kind;          // "chunk", "file", "tool", "turn", ...
  double priority = 0.0;
  bool pinned = false;       // pinned blocks are demoted last and never dropped
  int64_t created = 0;       // the owner's step at which the block was made
  at::Tensor embedding;      // optional retrieval embedding, any shape, CPU
  std::shared_ptr<const BlockPayload> payload;  // the owning path's data; may be null

  // The payload as T, or null when there is none or it is another type.
  template <class T>
  const T* payload_as() const {
    return dynamic_cast<const T*>(payload.get());
  }
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
