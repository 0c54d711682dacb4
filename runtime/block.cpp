#include "runtime/block.h"

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace wm {

namespace {
struct PayloadDecoders {
  std::mutex mu;
  std::map<std::string, BlockPayloadDecoder> by_type;
};
PayloadDecoders& payload_decoders() {
  static PayloadDecoders d;
  return d;
}
}  // namespace

bool register_block_payload(const std::string& type, BlockPayloadDecoder decode) {
  WM_CHECK(!type.empty() && decode != nullptr, "a payload type needs a name and a decoder");
  auto& d = payload_decoders();
  std::lock_guard<std::mutex> lock(d.mu);
  auto [it, added] = d.by_type.emplace(type, decode);
  WM_CHECK(added || it->second == decode, "payload type '", type, "' already has another decoder");
  return true;
}

std::shared_ptr<const BlockPayload> decode_block_payload(const std::string& type, const nlohmann::json& data) {
  BlockPayloadDecoder decode = nullptr;
  std::string known;
  {
    auto& d = payload_decoders();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.by_type.find(type);
    if (it != d.by_type.end()) decode = it->second;
    for (auto& [name, f] : d.by_type) known += (known.empty() ? "" : ", ") + name;
  }
  if (decode == nullptr)
    throw Error(str_cat("no decoder for block payload type '", type, "' (registered: ",
                        known.empty() ? "none" : known, ")"));
  return decode(data);
}

size_t Block::nbytes() const {
  size_t n = 0;
  for (auto& l : layers)
    for (const at::Tensor* t : {&l.k, &l.v, &l.pos, &l.logw})
      if (t->defined()) n += t->numel() * t->element_size();
  return n;
}

Block Block::to(at::Device device, bool copy, bool non_blocking) const {
  Block b;
  b.id = id;
  b.meta = meta;
  b.stats = stats;
  b.layers.reserve(layers.size());
  for (auto& l : layers) {
    LayerKv o;
    o.k = l.k.to(device, l.k.scalar_type(), non_blocking, copy);
    o.v = l.v.to(device, l.v.scalar_type(), non_blocking, copy);
    o.logw = l.logw.to(device, l.logw.scalar_type(), non_blocking, copy);
    o.pos = copy ? l.pos.clone() : l.pos;
    b.layers.push_back(std::move(o));
  }
  return b;
}

void Block::validate(const KvSpec& spec) const {
  WM_CHECK(n_layers() == spec.n_layers, "block '", id, "' has ", n_layers(), " layers, spec has ", spec.n_layers);
  for (int i = 0; i < n_layers(); ++i) {
    auto& l = layers[i];
    const std::string where = str_cat("block '", id, "' layer ", i);
    WM_CHECK(l.k.defined() && l.v.defined() && l.pos.defined() && l.logw.defined(), where, ": a tensor is missing");
    const int64_t n = l.k.size(1);
    WM_CHECK(l.k.dim() == 3 && l.k.size(0) == spec.n_kv_heads && l.k.size(2) == spec.head_dim, where,
             ": K must be [", spec.n_kv_heads, ", n, ", spec.head_dim, "], got ", l.k.sizes());
    WM_CHECK(l.v.sizes() == l.k.sizes(), where, ": V ", l.v.sizes(), " differs from K ", l.k.sizes());
    WM_CHECK(l.k.scalar_type() == spec.dtype && l.v.scalar_type() == spec.dtype, where, ": dtype ",
             l.k.scalar_type(), " but the spec says ", spec.dtype);
    WM_CHECK(l.pos.dim() == 2 && l.pos.size(0) == n && l.pos.size(1) == spec.rope.n_axes() &&
                 l.pos.scalar_type() == at::kLong && l.pos.device().is_cpu(),
             where, ": positions must be int64 CPU [", n, ", ", spec.rope.n_axes(), "], got ", l.pos.sizes());
    WM_CHECK(l.logw.dim() == 1 && l.logw.size(0) == n && l.logw.scalar_type() == at::kFloat, where,
             ": log-weights must be float32 [", n, "], got ", l.logw.sizes());
    WM_CHECK(l.logw.device() == l.k.device(), where, ": log-weights on ", l.logw.device(), ", K on ", l.k.device());
  }
}

Block make_block(std::string id, std::vector<at::Tensor> k, std::vector<at::Tensor> v, const at::Tensor& pos) {
  WM_CHECK(k.size() == v.size(), "block '", id, "': ", k.size(), " K layers but ", v.size(), " V layers");
  Block b;
  b.id = std::move(id);
  at::Tensor p = pos.to(at::kCPU, at::kLong).contiguous();
  for (size_t i = 0; i < k.size(); ++i) {
    LayerKv l;
    l.k = k[i];
    l.v = v[i];
    l.pos = p;
    l.logw = at::zeros({k[i].size(1)}, at::TensorOptions().dtype(at::kFloat).device(k[i].device()));
    b.layers.push_back(std::move(l));
  }
  return b;
}

}  // namespace wm
