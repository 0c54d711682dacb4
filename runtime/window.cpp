#include "runtime/window.h"

#include <cmath>
#include <cstring>

#include "runtime/error.h"
#include "runtime/rope.h"

namespace wm {

KvWindow::KvWindow(KvSpec spec, std::vector<std::string> regions, int64_t initial_capacity, WindowGrowth growth)
    : spec_(std::move(spec)), layout_(std::move(regions), spec_.n_layers), growth_(growth) {
  spec_.validate();
  WM_CHECK(growth_.factor >= 1.0 && growth_.stagger >= 0 && growth_.granule > 0, "bad growth policy");
  const int L = spec_.n_layers;
  k_.resize(L);
  v_.resize(L);
  logw_.resize(L);
  pos_.resize(L);
  hlogw_.resize(L);
  cap_.assign(L, 0);
  reallocs_.assign(L, 0);
  for (int l = 0; l < L; ++l) {
    const int64_t cap = initial_capacity > 0 ? staggered_capacity(l, initial_capacity, 1.0) : 0;
    k_[l] = kv_buffer(cap);
    v_[l] = kv_buffer(cap);
    logw_[l] = at::empty({cap}, spec_.options().dtype(at::kFloat));
    pos_[l] = at::empty({cap, spec_.rope.n_axes()}, at::TensorOptions().dtype(at::kLong));
    cap_[l] = cap;
  }
}

at::Tensor KvWindow::kv_buffer(int64_t cap) const {
  if (!storage_) return at::empty({spec_.n_kv_heads, cap, spec_.head_dim}, spec_.options());
  return storage_->empty({spec_.n_kv_heads, cap, spec_.head_dim}, spec_.dtype);
}

void KvWindow::use_storage(std::shared_ptr<const MappedStorage> storage) {
  WM_CHECK(!storage || spec_.device.is_cpu(), "a window on ", spec_.device, " cannot keep its K/V in files");
  std::shared_ptr<const MappedStorage> before = std::move(storage_);
  storage_ = std::move(storage);
  std::vector<at::Tensor> k(k_.size()), v(v_.size());
  try {
    for (size_t l = 0; l < k_.size(); ++l) {
      k[l] = kv_buffer(cap_[l]);
      v[l] = kv_buffer(cap_[l]);
      const int64_t used = layout_.size(static_cast<int>(l));
      if (used > 0) {
        k[l].narrow(1, 0, used).copy_(k_[l].narrow(1, 0, used));
        v[l].narrow(1, 0, used).copy_(v_[l].narrow(1, 0, used));
      }
    }
  } catch (...) {
    storage_ = std::move(before);
    throw;
  }
  k_ = std::move(k);
  v_ = std::move(v);
}

int64_t KvWindow::staggered_capacity(int l, int64_t need, double factor) const {
  // Layer l takes need * factor * (1 + stagger * l / L), rounded up to the granule, plus l
  // granules: capacities differ from layer to layer even where the rounding would merge them,
  // so the layers fill up, and reallocate, on different steps.
  const double f = factor * (1.0 + growth_.stagger * l / spec_.n_layers);
  const int64_t g = growth_.granule;
  const int64_t want = static_cast<int64_t>(std::ceil(need * f));
  const int64_t extra = growth_.stagger > 0 ? l * g : 0;
  return std::max<int64_t>(need, (want + g - 1) / g * g + extra);
}

void KvWindow::ensure(int l, int64_t need, double factor) {
  if (need <= cap_[l]) return;
  // factor <= 1 is an explicit reserve: exactly what was asked.
  const int64_t cap = factor <= 1.0 ? need : staggered_capacity(l, need, factor);
  const int64_t used = layout_.size(l);
  at::Tensor k = kv_buffer(cap);
  at::Tensor v = kv_buffer(cap);
  at::Tensor w = at::empty({cap}, spec_.options().dtype(at::kFloat));
  at::Tensor p = at::empty({cap, spec_.rope.n_axes()}, at::TensorOptions().dtype(at::kLong));
  if (used > 0) {
    k.narrow(1, 0, used).copy_(k_[l].narrow(1, 0, used));
    v.narrow(1, 0, used).copy_(v_[l].narrow(1, 0, used));
    w.narrow(0, 0, used).copy_(logw_[l].narrow(0, 0, used));
    p.narrow(0, 0, used).copy_(pos_[l].narrow(0, 0, used));
  }
  if (hlogw_[l].defined()) {
    at::Tensor h = at::zeros({spec_.n_kv_heads, cap}, spec_.options().dtype(at::kFloat));
    if (used > 0) h.narrow(1, 0, used).copy_(hlogw_[l].narrow(1, 0, used));
    hlogw_[l] = h;
  }
  k_[l] = k;
  v_[l] = v;
  logw_[l] = w;
  pos_[l] = p;
  cap_[l] = cap;
  ++reallocs_[l];
}

void KvWindow::reserve(int64_t tokens) {
  for (int l = 0; l < spec_.n_layers; ++l)
    if (cap_[l] < tokens) ensure(l, tokens, 1.0);
}

void KvWindow::insert_at(int l, int64_t at, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos,
                         const at::Tensor& logw) {
  const int64_t n = k.size(1);
  const int64_t used = layout_.size(l);
  ensure(l, used + n, growth_.factor);
  const int64_t tail = used - at;
  if (tail > 0) {  // shift the tail right by n; a temporary because the ranges overlap
    k_[l].narrow(1, at + n, tail).copy_(k_[l].narrow(1, at, tail).clone());
    v_[l].narrow(1, at + n, tail).copy_(v_[l].narrow(1, at, tail).clone());
    logw_[l].narrow(0, at + n, tail).copy_(logw_[l].narrow(0, at, tail).clone());
    pos_[l].narrow(0, at + n, tail).copy_(pos_[l].narrow(0, at, tail).clone());
    if (hlogw_[l].defined()) hlogw_[l].narrow(1, at + n, tail).copy_(hlogw_[l].narrow(1, at, tail).clone());
  }
  if (hlogw_[l].defined()) hlogw_[l].narrow(1, at, n).zero_();  // new tokens: every head sees them
  k_[l].narrow(1, at, n).copy_(k);
  v_[l].narrow(1, at, n).copy_(v);
  if (logw.defined()) logw_[l].narrow(0, at, n).copy_(logw);
  else logw_[l].narrow(0, at, n).zero_();
  pos_[l].narrow(0, at, n).copy_(pos);
}

void KvWindow::erase_at(int l, int64_t at, int64_t n) {
  const int64_t used = layout_.size(l);
  const int64_t tail = used - at - n;
  if (n == 0 || tail <= 0) return;
  k_[l].narrow(1, at, tail).copy_(k_[l].narrow(1, at + n, tail).clone());
  v_[l].narrow(1, at, tail).copy_(v_[l].narrow(1, at + n, tail).clone());
  logw_[l].narrow(0, at, tail).copy_(logw_[l].narrow(0, at + n, tail).clone());
  pos_[l].narrow(0, at, tail).copy_(pos_[l].narrow(0, at + n, tail).clone());
  if (hlogw_[l].defined()) hlogw_[l].narrow(1, at, tail).copy_(hlogw_[l].narrow(1, at + n, tail).clone());
}

int64_t KvWindow::segment_end(const std::string& region, const std::string& id, int l) {
  const int r = layout_.region(region);
  auto [rr, idx] = layout_.find(id);
  if (rr < 0) {
    layout_.add_segment(r, id);
    info_[id] = Info{};
  } else WM_CHECK(rr == r, "segment '", id, "' is in region '", layout_.region_names()[rr], "', not '", region, "'");
  return layout_.segment_begin(l, id) + layout_.segment_len(l, id);
}

void KvWindow::append(const std::string& region, const std::string& id, int l, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& pos, const at::Tensor& logw) {
  WM_CHECK(l >= 0 && l < spec_.n_layers, "layer ", l, " out of range [0, ", spec_.n_layers, ")");
  WM_CHECK(k.dim() == 3 && k.size(0) == spec_.n_kv_heads && k.size(2) == spec_.head_dim, "segment '", id,
           "' layer ", l, ": K must be [", spec_.n_kv_heads, ", n, ", spec_.head_dim, "], got ", k.sizes());
  WM_CHECK(v.sizes() == k.sizes(), "segment '", id, "' layer ", l, ": V ", v.sizes(), " differs from K ", k.sizes());
  const int64_t n = k.size(1);
  WM_CHECK(pos.dim() == 2 && pos.size(0) == n && pos.size(1) == spec_.rope.n_axes(), "segment '", id, "' layer ",
           l, ": positions must be [", n, ", ", spec_.rope.n_axes(), "], got ", pos.sizes());
  WM_CHECK(!logw.defined() || (logw.dim() == 1 && logw.size(0) == n), "segment '", id, "' layer ", l,
           ": log-weights must be [", n, "], got ", logw.sizes());
  const int64_t at = segment_end(region, id, l);
  insert_at(l, at, k, v, pos.to(at::kCPU, at::kLong), logw);
  layout_.grow(l, id, n);
}

void KvWindow::commit_staged(const std::string& region, const std::string& id, int l, int64_t c,
                             const at::Tensor& pos) {
  WM_CHECK(pos.dim() == 2 && pos.size(0) == c && pos.size(1) == spec_.rope.n_axes(), "segment '", id, "' layer ", l,
           ": positions must be [", c, ", ", spec_.rope.n_axes(), "], got ", pos.sizes());
  const at::Tensor p = pos.to(at::kCPU, at::kLong).contiguous();
  commit_staged(region, id, l, c, p.data_ptr<int64_t>());
}

void KvWindow::commit_staged(const std::string& region, const std::string& id, int l, int64_t c,
                             const int64_t* pos) {
  WM_CHECK(l >= 0 && l < spec_.n_layers, "layer ", l, " out of range [0, ", spec_.n_layers, ")");
  const int64_t used = layout_.size(l);
  WM_CHECK(c > 0 && used + c <= cap_[l], "commit_staged: ", c, " tokens were not staged in layer ", l);
  const int64_t at = segment_end(region, id, l), axes = spec_.rope.n_axes();
  if (at == used) {
    // stage() wrote K and V there and zeroed the log-weights.
    std::memcpy(pos_[l].data_ptr<int64_t>() + at * axes, pos, sizeof(int64_t) * c * axes);
  } else {
    // The staged rows move in among the others (insert_at shifts what follows them first).
    insert_at(l, at, k_[l].narrow(1, used, c).clone(), v_[l].narrow(1, used, c).clone(),
              at::from_blob(const_cast<int64_t*>(pos), {c, axes}, at::kLong).clone(), at::Tensor());
  }
  layout_.grow(l, id, c);
}

KvWindow::RawStage KvWindow::stage_raw(int l, int64_t c) {
  WM_CHECK(l >= 0 && l < spec_.n_layers, "layer ", l, " out of range [0, ", spec_.n_layers, ")");
  WM_CHECK(!hlogw_[l].defined(), "stage_raw: layer ", l, " has per-head log-weights");
  WM_CHECK(spec_.device.is_cpu(), "stage_raw: the window is on ", spec_.device);
  const int64_t n = size(l);
  ensure(l, n + c, growth_.factor);
  float* w = logw_[l].data_ptr<float>();
  for (int64_t i = 0; i < c; ++i) w[n + i] = 0.f;
  return {k_[l].data_ptr(), v_[l].data_ptr(), cap_[l] * spec_.head_dim, w, n};
}

void KvWindow::place(const std::string& region, const Block& block, std::optional<Reanchor> re) {
  WM_CHECK(block.n_layers() == spec_.n_layers, "block '", block.id, "' has ", block.n_layers(), " layers, window ",
           spec_.n_layers);
  WM_CHECK(layout_.find(block.id).first < 0, "block '", block.id, "' is already in the window");
  for (int l = 0; l < spec_.n_layers; ++l) {
    const LayerKv& kv = block.layers[l];
    if (re && re->delta != 0) {
      at::Tensor pos = kv.pos.clone();
      pos.select(1, re->axis).add_(re->delta);
      append(region, block.id, l, reanchor(kv.k, spec_.rope, re->axis, re->delta), kv.v, pos, kv.logw);
    } else {
      append(region, block.id, l, kv.k, kv.v, kv.pos, kv.logw);
    }
  }
  Info& info = info_.at(block.id);
  info.meta = block.meta;
  info.stats = block.stats;
}

Block KvWindow::extract(const std::string& id) const {
  for (int l = 0; l < spec_.n_layers; ++l) {
    if (!hlogw_[l].defined()) continue;
    const int64_t s = layout_.segment_begin(l, id), n = layout_.segment_len(l, id);
    WM_CHECK(n == 0 || hlogw_[l].narrow(1, s, n).eq(0).all().item<bool>(), "segment '", id, "' layer ", l,
             " holds tokens that some kv heads do not see (per-head selection); a block cannot carry that");
  }
  Block b;
  b.id = id;
  b.meta = meta(id);
  b.stats = stats(id);
  for (int l = 0; l < spec_.n_layers; ++l) {
    const int64_t s = layout_.segment_begin(l, id), n = layout_.segment_len(l, id);
    LayerKv kv;
    kv.k = k_[l].narrow(1, s, n).clone();
    kv.v = v_[l].narrow(1, s, n).clone();
    kv.logw = logw_[l].narrow(0, s, n).clone();
    kv.pos = pos_[l].narrow(0, s, n).clone();
    b.layers.push_back(std::move(kv));
  }
  return b;
}

Block KvWindow::remove(const std::string& id) {
  Block b = extract(id);
  drop(id);
  return b;
}

void KvWindow::drop(const std::string& id) {
  for (int l = 0; l < spec_.n_layers; ++l) erase_at(l, layout_.segment_begin(l, id), layout_.segment_len(l, id));
  layout_.remove(id);
  info_.erase(id);
}

void KvWindow::drop_region(const std::string& region) {
  const int r = layout_.region(region);
  for (int l = 0; l < spec_.n_layers; ++l) erase_at(l, layout_.region_begin(l, r), layout_.region_size(l, r));
  for (auto& s : layout_.clear_region(r)) info_.erase(s.id);
}

void KvWindow::drop_tokens(const std::string& region, int l, int64_t begin, int64_t n) {
  const int r = layout_.region(region);
  WM_CHECK(begin >= 0 && n >= 0 && begin + n <= layout_.region_size(l, r), "tokens [", begin, ", ", begin + n,
           ") leave region '", region, "' (", layout_.region_size(l, r), " tokens) in layer ", l);
  erase_at(l, layout_.region_begin(l, r) + begin, n);
  layout_.drop_tokens(l, r, begin, n);
}

void KvWindow::keep_tokens(int l, const std::vector<int64_t>& keep) {
  const int64_t used = layout_.size(l);
  layout_.keep_tokens(l, keep);  // validates
  const int64_t m = static_cast<int64_t>(keep.size());
  if (m == used) return;  // strictly increasing and in range: every token
  const at::Tensor idx = at::tensor(keep, at::TensorOptions().dtype(at::kLong));
  const at::Tensor idx_dev = idx.to(k_[l].device());
  // index_select makes new tensors, so the ranges may overlap.
  k_[l].narrow(1, 0, m).copy_(k_[l].narrow(1, 0, used).index_select(1, idx_dev));
  v_[l].narrow(1, 0, m).copy_(v_[l].narrow(1, 0, used).index_select(1, idx_dev));
  logw_[l].narrow(0, 0, m).copy_(logw_[l].narrow(0, 0, used).index_select(0, idx_dev));
  pos_[l].narrow(0, 0, m).copy_(pos_[l].narrow(0, 0, used).index_select(0, idx));
  if (hlogw_[l].defined())
    hlogw_[l].narrow(1, 0, m).copy_(hlogw_[l].narrow(1, 0, used).index_select(1, idx_dev));
}

void KvWindow::keep_tokens_per_head(int l, const std::vector<std::vector<int64_t>>& keep) {
  WM_CHECK(l >= 0 && l < spec_.n_layers, "layer ", l, " out of range [0, ", spec_.n_layers, ")");
  const int64_t KH = spec_.n_kv_heads, used = size(l);
  WM_CHECK(static_cast<int64_t>(keep.size()) == KH, "per-head selection of layer ", l, ": ", keep.size(),
           " token lists for ", KH, " kv heads");
  std::vector<char> listed(static_cast<size_t>(KH * used), 0), in_union(static_cast<size_t>(used), 0);
  for (int64_t h = 0; h < KH; ++h) {
    int64_t last = -1;
    for (int64_t i : keep[h]) {
      WM_CHECK(i > last && i < used, "per-head selection of layer ", l, ", kv head ", h, ": token ", i,
               " is out of range [0, ", used, ") or out of order");
      last = i;
      listed[h * used + i] = 1;
      in_union[i] = 1;
    }
  }
  std::vector<int64_t> uni;
  for (int64_t i = 0; i < used; ++i)
    if (in_union[i]) uni.push_back(i);
  const int64_t m = static_cast<int64_t>(uni.size());
  // What each head hides among the union's tokens, [KH, m].
  at::Tensor hide = at::zeros({KH, m}, at::TensorOptions().dtype(at::kFloat));
  float* hp = hide.data_ptr<float>();
  bool any = false;
  for (int64_t h = 0; h < KH; ++h)
    for (int64_t j = 0; j < m; ++j)
      if (!listed[h * used + uni[j]]) hp[h * m + j] = kHiddenLogw, any = true;
  keep_tokens(l, uni);
  if (!any) return;
  if (!hlogw_[l].defined()) hlogw_[l] = at::zeros({KH, cap_[l]}, spec_.options().dtype(at::kFloat));
  at::Tensor h = hlogw_[l].narrow(1, 0, m);
  h.add_(hide.to(h.device())).clamp_min_(kHiddenLogw);
}

void KvWindow::check_written(int l, const std::vector<int64_t>& idx) const {
  WM_CHECK(l >= 0 && l < spec_.n_layers, "layer ", l, " out of range [0, ", spec_.n_layers, ")");
  const int64_t used = size(l);
  std::vector<bool> seen(used, false);
  for (int64_t i : idx) {
    WM_CHECK(i >= 0 && i < used, "token ", i, " is outside layer ", l, " (", used, " tokens)");
    WM_CHECK(!seen[i], "token ", i, " is written twice");
    seen[i] = true;
  }
}

void KvWindow::write_tokens(int l, const std::vector<int64_t>& idx, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& logw, const at::Tensor& pos) {
  check_written(l, idx);
  const int64_t m = static_cast<int64_t>(idx.size());
  const std::vector<int64_t> want{spec_.n_kv_heads, m, spec_.head_dim};
  WM_CHECK(k.sizes() == at::IntArrayRef(want) && v.sizes() == at::IntArrayRef(want), "k and v must be ", want,
           ", got ", k.sizes(), " and ", v.sizes());
  WM_CHECK(logw.dim() == 1 && logw.size(0) == m, "logw must be [", m, "], got ", logw.sizes());
  WM_CHECK(!pos.defined() || (pos.dim() == 2 && pos.size(0) == m && pos.size(1) == spec_.rope.n_axes()),
           "positions must be [", m, ", ", spec_.rope.n_axes(), "], got ", pos.sizes());
  if (m == 0) return;
  if (pos.defined())
    pos_[l].index_copy_(0, at::tensor(idx, at::TensorOptions().dtype(at::kLong)), pos.to(at::kCPU, at::kLong));
  const at::Tensor at_idx = at::tensor(idx, at::TensorOptions().dtype(at::kLong)).to(k_[l].device());
  k_[l].index_copy_(1, at_idx, k.to(k_[l].device(), k_[l].scalar_type()));
  v_[l].index_copy_(1, at_idx, v.to(v_[l].device(), v_[l].scalar_type()));
  logw_[l].index_copy_(0, at_idx, logw.to(logw_[l].device(), logw_[l].scalar_type()));
}

void KvWindow::write_head_tokens(int l, int h, const std::vector<int64_t>& idx, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& logw) {
  WM_CHECK(h >= 0 && h < spec_.n_kv_heads, "kv head ", h, " out of range [0, ", spec_.n_kv_heads, ")");
  check_written(l, idx);
  const int64_t m = static_cast<int64_t>(idx.size());
  const std::vector<int64_t> want{1, m, spec_.head_dim};
  WM_CHECK(k.sizes() == at::IntArrayRef(want) && v.sizes() == at::IntArrayRef(want), "k and v must be ", want,
           ", got ", k.sizes(), " and ", v.sizes());
  WM_CHECK(logw.dim() == 1 && logw.size(0) == m, "logw must be [", m, "], got ", logw.sizes());
  if (m == 0) return;
  if (!hlogw_[l].defined()) hlogw_[l] = at::zeros({spec_.n_kv_heads, cap_[l]}, spec_.options().dtype(at::kFloat));
  const at::Tensor at_idx = at::tensor(idx, at::TensorOptions().dtype(at::kLong)).to(k_[l].device());
  k_[l].select(0, h).index_copy_(0, at_idx, k.select(0, 0).to(k_[l].device(), k_[l].scalar_type()));
  v_[l].select(0, h).index_copy_(0, at_idx, v.select(0, 0).to(v_[l].device(), v_[l].scalar_type()));
  const at::Tensor row = logw.to(hlogw_[l].device(), at::kFloat) - logw_[l].index_select(0, at_idx);
  hlogw_[l].select(0, h).index_copy_(0, at_idx, row);
}

void KvWindow::shift_tokens(int l, int64_t begin, int64_t n, Reanchor re) {
  WM_CHECK(l >= 0 && l < spec_.n_layers, "layer ", l, " out of range [0, ", spec_.n_layers, ")");
  WM_CHECK(begin >= 0 && n >= 0 && begin + n <= size(l), "tokens [", begin, ", ", begin + n, ") leave layer ", l,
           " (", size(l), " tokens)");
  WM_CHECK(re.axis >= 0 && re.axis < spec_.rope.n_axes(), "RoPE axis ", re.axis, " out of range [0, ",
           spec_.rope.n_axes(), ")");
  if (n == 0 || re.delta == 0) return;
  at::Tensor k = k_[l].narrow(1, begin, n);
  k.copy_(reanchor(k, spec_.rope, re.axis, re.delta));
  pos_[l].narrow(0, begin, n).select(1, re.axis).add_(re.delta);
}

void KvWindow::clear() {
  for (int r = 0; r < layout_.n_regions(); ++r) layout_.clear_region(r);
  for (auto& h : hlogw_) h = at::Tensor();
  info_.clear();
}

const BlockMeta& KvWindow::meta(const std::string& id) const {
  auto it = info_.find(id);
  WM_CHECK(it != info_.end(), "no segment '", id, "' in the window");
  return it->second.meta;
}

void KvWindow::set_meta(const std::string& id, BlockMeta meta, const std::string& region) {
  auto it = info_.find(id);
  if (it == info_.end() && !region.empty()) {
    layout_.add_segment(layout_.region(region), id);
    it = info_.emplace(id, Info{}).first;
  }
  WM_CHECK(it != info_.end(), "no segment '", id, "' in the window");
  it->second.meta = std::move(meta);
}

const BlockStats& KvWindow::stats(const std::string& id) const {
  auto it = info_.find(id);
  WM_CHECK(it != info_.end(), "no segment '", id, "' in the window");
  return it->second.stats;
}

at::Tensor KvWindow::k(int l) const { return k_.at(l).narrow(1, 0, size(l)); }
at::Tensor KvWindow::v(int l) const { return v_.at(l).narrow(1, 0, size(l)); }
at::Tensor KvWindow::logw(int l) const { return logw_.at(l).narrow(0, 0, size(l)); }
at::Tensor KvWindow::pos(int l) const { return pos_.at(l).narrow(0, 0, size(l)); }
at::Tensor KvWindow::head_logw(int l) const {
  return hlogw_.at(l).defined() ? hlogw_[l].narrow(1, 0, size(l)) : at::Tensor();
}
int64_t KvWindow::visible(int l, int h) const {
  WM_CHECK(h >= 0 && h < spec_.n_kv_heads, "kv head ", h, " out of range [0, ", spec_.n_kv_heads, ")");
  if (!hlogw_.at(l).defined()) return size(l);
  return hlogw_[l].narrow(1, 0, size(l)).select(0, h).gt(kHiddenLogw / 2).sum().item<int64_t>();
}

KvWindow::Staged KvWindow::stage(int l, const at::Tensor& k_cur, const at::Tensor& v_cur) {
  WM_CHECK(k_cur.dim() == 3 && k_cur.size(0) == spec_.n_kv_heads && k_cur.size(2) == spec_.head_dim,
           "current K must be [", spec_.n_kv_heads, ", c, ", spec_.head_dim, "], got ", k_cur.sizes());
  WM_CHECK(v_cur.sizes() == k_cur.sizes(), "current V ", v_cur.sizes(), " differs from K ", k_cur.sizes());
  const int64_t n = size(l), c = k_cur.size(1);
  ensure(l, n + c, growth_.factor);
  k_[l].narrow(1, n, c).copy_(k_cur);
  v_[l].narrow(1, n, c).copy_(v_cur);
  logw_[l].narrow(0, n, c).zero_();
  at::Tensor head;
  if (hlogw_[l].defined()) {
    hlogw_[l].narrow(1, n, c).zero_();
    head = hlogw_[l].narrow(1, 0, n + c);
  }
  return {k_[l].narrow(1, 0, n + c), v_[l].narrow(1, 0, n + c), logw_[l].narrow(0, 0, n + c), n, head};
}

size_t KvWindow::bytes_allocated() const {
  size_t b = 0;
  for (int l = 0; l < spec_.n_layers; ++l) {
    b += cap_[l] * (spec_.bytes_per_token_layer() + sizeof(float));
    if (hlogw_[l].defined()) b += cap_[l] * spec_.n_kv_heads * sizeof(float);
  }
  return b;
}

size_t KvWindow::bytes_used() const {
  size_t b = 0;
  for (int l = 0; l < spec_.n_layers; ++l) {
    b += size(l) * (spec_.bytes_per_token_layer() + sizeof(float));
    if (hlogw_[l].defined()) b += size(l) * spec_.n_kv_heads * sizeof(float);
  }
  return b;
}

}  // namespace wm
