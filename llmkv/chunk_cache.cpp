#include "llmkv/chunk_cache.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/hash.h"
#include "runtime/remote_store.h"
#include "runtime/window.h"

namespace wm::llm {

namespace {
constexpr uint64_t kPrefixSeed = 0x70726566697821ull;  // "prefix!": prefix keys apart from chunk keys
}  // namespace

std::string key_hex(ChunkKey key) { return hex64(key); }

uint64_t model_fingerprint(LlmModelImpl& model) {
  at::NoGradGuard no_grad;
  Xxh64 h(0x6d6f64656cull);
  const std::string cfg = model.config().to_json().dump();
  h.update(cfg.data(), cfg.size());
  std::map<std::string, at::Tensor> params;  // name order, whatever order the module lists them in
  for (const auto& p : model.named_parameters(true)) params.emplace(p.key(), p.value());
  for (const auto& [name, t] : params) {
    h.update(name.data(), name.size());
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    h.update(c.data_ptr(), c.numel() * c.element_size());
  }
  // Weights kept as GGUF blocks have emptied parameters: their blocks count instead.
  std::map<std::string, at::Tensor> stored;
  for (const auto& m : model.named_modules()) {
    const auto* lin = dynamic_cast<const LlmLinearImpl*>(m.value().get());
    if (lin && lin->qw.defined()) stored.emplace(m.key() + ".gguf", lin->qw.blocks);
  }
  if (model.quant_embedding().defined()) stored.emplace("model.embed_tokens.gguf", model.quant_embedding().blocks);
  for (const auto& [name, t] : stored) {
    h.update(name.data(), name.size());
    const at::Tensor c = t.contiguous();
    h.update(c.data_ptr(), c.numel() * c.element_size());
  }
  return h.digest();
}

int64_t ChunkKv::first_position() const {
  if (layers.empty() || layers[0].n_tokens() == 0) return 0;
  return layers[0].pos[0][0].item<int64_t>();
}

void ChunkCacheConfig::validate() const {
  WM_CHECK(prefill_chunk > 0, "prefill_chunk must be positive, got ", prefill_chunk);
}

ChunkCache::ChunkCache(LlmModel model, ChunkCacheConfig cfg) : model_(std::move(model)), cfg_(std::move(cfg)) {
  cfg_.validate();
  cfg_.store.device = model_->device();
  model_key_ = cfg_.model_key != 0 ? cfg_.model_key : model_fingerprint(*model_);
  n_layers_ = static_cast<int>(model_->config().num_hidden_layers);
  if (cfg_.store.remote) {
    WM_CHECK(cfg_.store.remote->config().ns == key_hex(model_key_), "the chunk cache's remote store has namespace '",
             cfg_.store.remote->config().ns, "', this model's key is ", key_hex(model_key_),
             ": entries of one model must not be offered to another");
    cfg_.store.remote_publish = true;
  }
  store_ = std::make_unique<BlockStore>(cfg_.store);
}

ChunkKey ChunkCache::chunk_key(const std::vector<int64_t>& ids) const {
  return xxh64(ids.data(), ids.size() * sizeof(int64_t), model_key_);
}

ChunkKey ChunkCache::prefix_key(ChunkKey previous, ChunkKey chunk) const {
  const uint64_t two[2] = {previous, chunk};
  return xxh64(two, sizeof two, model_key_ ^ kPrefixSeed);
}

std::vector<ChunkKey> ChunkCache::prefix_keys(const std::vector<std::vector<int64_t>>& segments) const {
  std::vector<ChunkKey> out;
  out.reserve(segments.size());
  ChunkKey prev = 0;
  for (const auto& s : segments) out.push_back(prev = prefix_key(prev, chunk_key(s)));
  return out;
}

ChunkKv ChunkCache::prefill(const std::vector<int64_t>& ids, int64_t first_position) {
  at::NoGradGuard no_grad;
  WM_CHECK(!ids.empty(), "a segment to prefill needs tokens");
  WM_CHECK(first_position >= 0, "first_position must be >= 0, got ", first_position);
  const int64_t n = static_cast<int64_t>(ids.size());
  LlmModelImpl& m = *model_;
  KvWindow w(m.kv_spec(m.device(), m.dtype()), {"segment"}, n);
  StepOptions so;
  so.region = "segment";
  so.segment = "segment";
  const at::Tensor all = at::tensor(ids, at::kLong);
  at::Tensor hidden_sum = at::zeros({m.config().hidden_size}, at::kFloat);
  for (int64_t b = 0; b < n; b += cfg_.prefill_chunk) {
    const int64_t c = std::min(cfg_.prefill_chunk, n - b);
    const StepResult r =
        m.step(all.narrow(0, b, c), at::arange(first_position + b, first_position + b + c, at::kLong), w, so);
    hidden_sum += r.hidden.sum(0).to(at::kCPU);
  }
  stats_.prefilled_tokens += n;
  ChunkKv kv;
  for (int l = 0; l < n_layers_; ++l) {
    LayerKv lk;
    lk.k = w.k(l).clone();
    lk.v = w.v(l).clone();
    lk.pos = w.pos(l).clone();
    lk.logw = at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(m.device()));
    kv.layers.push_back(std::move(lk));
  }
  kv.signature = hidden_sum / static_cast<double>(n);
  return kv;
}

void ChunkCache::put(ChunkKey key, const ChunkKv& kv, const std::string& kind) {
  WM_CHECK(static_cast<int>(kv.layers.size()) == n_layers_, "an entry needs ", n_layers_, " layers, got ",
           kv.layers.size());
  if (entries_.count(key)) erase(key), stats_.erased -= 1;  // a replacement, not an invalidation
  for (int l = 0; l < n_layers_; ++l) {
    Block b;
    b.id = block_id(key, l);
    b.layers.push_back(kv.layers[l]);
    b.meta.kind = kind;
    if (l == 0 && kv.signature.defined()) b.meta.embedding = kv.signature.to(at::kCPU);
    store_->put(std::move(b), cfg_.tier);
  }
  Info in;
  in.tokens = kv.n_tokens();
  in.first_position = kv.first_position();
  in.kind = kind;
  if (kv.signature.defined()) in.signature = kv.signature.to(at::kCPU);
  entries_[key] = std::move(in);
  stats_.stored += 1;
}

bool ChunkCache::from_remote(ChunkKey key) const {
  if (!cfg_.store.remote) return false;
  std::vector<std::string> ids;
  for (int l = 0; l < n_layers_; ++l) ids.push_back(block_id(key, l));
  if (!store_->import_remote(ids, cfg_.tier)) {
    stats_.remote_misses += 1;
    return false;
  }
  Info in;
  try {
    const Block b0 = store_->peek(ids[0]);
    WM_CHECK(b0.layers.size() == 1, "a chunk cache block holds one layer, got ", b0.layers.size());
    for (int l = 1; l < n_layers_; ++l) {
      const BlockMeta m = store_->meta(ids[l]);
      WM_CHECK(m.kind == b0.meta.kind, "layer ", l, " is of kind '", m.kind, "', layer 0 of '", b0.meta.kind, "'");
    }
    in.tokens = b0.layers[0].n_tokens();
    in.first_position = in.tokens > 0 ? b0.layers[0].pos[0][0].item<int64_t>() : 0;
    in.kind = b0.meta.kind;
    if (b0.meta.embedding.defined()) in.signature = b0.meta.embedding.to(at::kCPU);
  } catch (const Error& e) {  // sound values that do not make an entry of this cache: not used
    for (const auto& id : ids) store_->erase(id);
    stats_.remote_misses += 1;
    stats_.corrupt += 1;
    return false;
  }
  entries_[key] = std::move(in);
  stats_.remote_hits += 1;
  return true;
}

bool ChunkCache::lookup(ChunkKey key) {
  const bool found = contains(key);
  (found ? stats_.hits : stats_.misses) += 1;
  return found;
}

bool ChunkCache::contains(ChunkKey key) const { return entries_.count(key) != 0 || from_remote(key); }

const ChunkCache::Info& ChunkCache::info(ChunkKey key) const {
  auto it = entries_.find(key);
  WM_CHECK(it != entries_.end(), "no entry ", key_hex(key), " in the chunk cache");
  return it->second;
}

int64_t ChunkCache::tokens(ChunkKey key) const { return info(key).tokens; }
const std::string& ChunkCache::kind(ChunkKey key) const { return info(key).kind; }
at::Tensor ChunkCache::signature(ChunkKey key) const { return info(key).signature; }
int64_t ChunkCache::first_position(ChunkKey key) const { return info(key).first_position; }

std::string ChunkCache::block_id(ChunkKey key, int l) const { return str_cat("kv:", key_hex(key), ":", l); }

Tier ChunkCache::tier_of(ChunkKey key, int l) const {
  info(key);
  return store_->tier_of(block_id(key, l));
}

LayerKv ChunkCache::layer(ChunkKey key, int l) {
  info(key);
  WM_CHECK(l >= 0 && l < n_layers_, "layer ", l, " out of range [0, ", n_layers_, ")");
  try {
    Block b = store_->get(block_id(key, l));
    return std::move(b.layers.at(0));
  } catch (const CorruptData& e) {
    report_corrupt(key, e.what());
    throw;
  }
}

ChunkKv ChunkCache::get(ChunkKey key) {
  ChunkKv kv;
  for (int l = 0; l < n_layers_; ++l) kv.layers.push_back(layer(key, l));
  kv.signature = signature(key);
  return kv;
}

bool ChunkCache::erase(ChunkKey key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  for (int l = 0; l < n_layers_; ++l) store_->erase(block_id(key, l));
  entries_.erase(it);
  stats_.erased += 1;
  return true;
}

void ChunkCache::report_corrupt(ChunkKey key, const std::string& what) {
  if (erase(key)) stats_.erased -= 1;  // counted as corrupt, not as invalidated
  stats_.corrupt += 1;
  reports_.push_back(str_cat("entry ", key_hex(key), ": ", what));
}

std::vector<ChunkKey> ChunkCache::keys() const {
  std::vector<ChunkKey> out;
  out.reserve(entries_.size());
  for (const auto& [k, in] : entries_) out.push_back(k);
  return out;
}

}  // namespace wm::llm
