#include "worldkv/compression.h"

#include <cmath>

#include "runtime/error.h"

namespace wm::worldkv {

namespace {
int64_t kept_of(double r, int64_t n) { return static_cast<int64_t>(std::ceil(r * n - 1e-9)); }

// One layer's K [n_kv_heads, n, head_dim] as one row per token, flattened over heads: [n, heads * d].
at::Tensor flat_keys(const at::Tensor& k) {
  WM_CHECK(k.dim() == 3, "K must be [n_kv_heads, n, head_dim], got ", k.sizes());
  return k.to(at::kFloat).permute({1, 0, 2}).reshape({k.size(1), -1});
}

at::Tensor keep_indices(const at::Tensor& flat, int64_t tpf, const CompressionConfig& cfg) {
  const int64_t n = flat.size(0);
  WM_CHECK(tpf > 0 && n % tpf == 0 && n >= tpf, "a chunk of ", n, " tokens is not whole frames of ", tpf);
  WM_CHECK(cfg.keep_ratio >= 0 && cfg.keep_ratio <= 1, "keep_ratio must be in [0, 1], got ", cfg.keep_ratio);
  const int64_t frames = n / tpf;
  at::Tensor anchor = flat.narrow(0, 0, tpf).mean(0, true);  // [1, heads * d]
  at::Tensor rest = flat.narrow(0, tpf, n - tpf);
  at::Tensor sim = at::cosine_similarity(rest, anchor.expand_as(rest), 1, 1e-8);  // [n - tpf]
  auto lopt = at::TensorOptions().dtype(at::kLong).device(flat.device());
  std::vector<at::Tensor> keep = {at::arange(tpf, lopt)};
  if (frames > 1) {
    if (cfg.per_frame) {
      const int64_t m = kept_of(cfg.keep_ratio, tpf);
      for (int64_t f = 1; f < frames; ++f) {
        at::Tensor s = sim.narrow(0, (f - 1) * tpf, tpf);
        keep.push_back(std::get<1>(s.topk(m, 0, /*largest=*/false, /*sorted=*/false)) + f * tpf);
      }
    } else {
      const int64_t m = kept_of(cfg.keep_ratio, n - tpf);
      keep.push_back(std::get<1>(sim.topk(m, 0, false, false)) + tpf);
    }
  }
  return std::get<0>(at::cat(keep).sort());
}

at::Tensor vote_targets_of(const at::Tensor& flat, const at::Tensor& keep) {
  WM_CHECK(keep.dim() == 1 && keep.numel() > 0, "vote targets need at least one kept token");
  const int64_t n = flat.size(0);
  at::Tensor unit = flat / flat.norm(2, 1, true).clamp_min(1e-8);
  auto lopt = at::TensorOptions().dtype(at::kLong).device(flat.device());
  // A kept token goes to itself; only the others are scored against the kept ones.
  at::Tensor target = at::empty({n}, lopt);
  target.index_put_({keep}, at::arange(keep.numel(), lopt));
  at::Tensor dropped_mask = at::ones({n}, lopt.dtype(at::kBool));
  dropped_mask.index_fill_(0, keep, false);
  at::Tensor dropped = dropped_mask.nonzero().squeeze(1);
  if (dropped.numel() == 0) return target;
  at::Tensor sim = at::matmul(unit.index_select(0, dropped), unit.index_select(0, keep).t());  // [dropped, kept]
  target.index_put_({dropped}, std::get<1>(sim.max(1)));
  return target;
}

}  // namespace

int64_t compressed_token_count(int64_t frames, int64_t tpf, const CompressionConfig& cfg) {
  WM_CHECK(frames > 0 && tpf > 0, "a chunk needs frames and tokens, got ", frames, " x ", tpf);
  if (frames == 1) return tpf;
  return tpf + (cfg.per_frame ? (frames - 1) * kept_of(cfg.keep_ratio, tpf) : kept_of(cfg.keep_ratio, (frames - 1) * tpf));
}

at::Tensor compression_keep_indices(const at::Tensor& k, int64_t tpf, const CompressionConfig& cfg) {
  return keep_indices(flat_keys(k), tpf, cfg);
}

MergeMode parse_merge_mode(const std::string& name) {
  if (name == "drop") return MergeMode::Drop;
  if (name == "votes") return MergeMode::Votes;
  if (name == "merge") return MergeMode::Merge;
  throw Error(str_cat("unknown merge mode '", name, "' (drop, votes, merge)"));
}

std::string merge_mode_name(MergeMode m) {
  return m == MergeMode::Drop ? "drop" : m == MergeMode::Votes ? "votes" : "merge";
}

at::Tensor vote_targets(const at::Tensor& k, const at::Tensor& keep) {
  at::Tensor flat = flat_keys(k);
  at::Tensor kp = keep.to(flat.device(), at::kLong);
  WM_CHECK(kp.dim() == 1 && kp.numel() > 0, "vote targets need at least one kept token");
  WM_CHECK(kp.min().item<int64_t>() >= 0 && kp.max().item<int64_t>() < flat.size(0) &&
               std::get<0>(at::_unique(kp)).numel() == kp.numel(),
           "kept token indices must be distinct and in [0, ", flat.size(0), ")");
  return vote_targets_of(flat, kp);
}

Block compress_chunk(const Block& chunk, int64_t tpf, const CompressionConfig& cfg) {
  Block out;
  out.id = chunk.id;
  out.meta = chunk.meta;
  out.stats = chunk.stats;
  for (auto& l : chunk.layers) {
    at::Tensor flat = flat_keys(l.k);
    at::Tensor idx = keep_indices(flat, tpf, cfg);
    at::Tensor cpu_idx = idx.to(at::kCPU);
    LayerKv kept{l.k.index_select(1, idx), l.v.index_select(1, idx), l.pos.index_select(0, cpu_idx),
                 l.logw.index_select(0, idx)};
    const int64_t m = idx.numel();
    if (cfg.merge != MergeMode::Drop && m < l.k.size(1)) {  // (nothing left out: nothing to merge)
      at::Tensor target = vote_targets_of(flat, idx);
      at::Tensor w = l.logw.to(at::kFloat).exp();  // [n]: how many tokens each stands for
      at::Tensor total = at::zeros({m}, w.options()).index_add_(0, target, w);  // [m]
      kept.logw = total.log().to(l.logw.scalar_type());
      if (cfg.merge == MergeMode::Merge) {
        at::Tensor wv = l.v.to(at::promote_types(l.v.scalar_type(), at::kFloat)) * w.view({1, -1, 1});  // [h, n, d]
        at::Tensor sum = at::zeros({l.v.size(0), m, l.v.size(2)}, wv.options()).index_add_(1, target, wv);
        // (A kept token of weight 0 with no voters keeps a zero value, not 0 / 0.)
        at::Tensor denom = total.to(sum.scalar_type()).clamp_min(1e-30).view({1, -1, 1});
        kept.v = (sum / denom).to(l.v.scalar_type());
      }
    }
    out.layers.push_back(std::move(kept));
  }
  return out;
}

}  // namespace wm::worldkv
