#include "runtime/attention.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "runtime/error.h"
#include "runtime/onednn.h"

namespace wm {
namespace {

// Which keys the queries see. Keys are [window (n_window) | current (n_cur)]; query r of the
// call is current token q0 + r and sees every window key and current keys [0, visible(q0 + r)).
struct MaskGeometry {
  int64_t n_window = 0, n_cur = 0, q0 = 0;
  int64_t block = 0;  // 0: no mask; Causal is block 1
  int64_t visible(int64_t x) const { return block == 0 ? n_cur : std::min(n_cur, (x / block + 1) * block); }
};

// Queries [q_begin, q_begin + n_rows) of kv heads [kh0, kh0 + nkh) of batch elements [b0, b0 +
// nb) (whole batch elements, or a part of one: nb == 1 when nkh < KH) over keys [0, n_keys). Keys
// before diag_begin are seen by every query of the chunk; keys [diag_begin, diag_begin +
// diag_width) by some (the diagonal tile, see diag_tile()); later keys by none.
struct Chunk {
  int64_t q_begin, n_rows, n_keys, diag_begin, diag_width, phase;
  int64_t b0, nb, kh0, nkh;
};
constexpr int64_t kChunkInts = 10;

// The shapes of one call: q [B, KH * G, nq, d], k/v [B, KH, nk, d], and its query chunks.
struct Geometry {
  int64_t B, KH, G, nq, nk, d;
  std::vector<Chunk> chunks;
};

constexpr int64_t kMinRows = 8;  // fewer query rows per chunk cost more in calls than they save

// Query rows per head that make a chunk's two products efficient: with fewer, each product
// reads its heads' keys for little arithmetic (bound by memory), so a chunk that would cover every
// head with fewer rows covers fewer heads instead. LingBot-World-Fast's self-attention at 480 x
// 832 (40 heads, 4,680 queries over 28,080 keys, float32, 2 threads): 8 rows over the 40 heads
// 18 GFLOP/s; one head at 64 rows 74, at 256 rows 100, at 1,170 rows 82.
constexpr int64_t kHeadRows = 256;

// Score elements per chunk when the caller leaves it to us. On the CPU a chunk's scores (4 MiB
// in float32) come from the allocator's free lists rather than fresh pages (first-touch page
// faults cost more than the arithmetic of a T x T score matrix) and stay mostly in cache, unless
// one kv head's kHeadRows query rows over all keys need more (up to 128 MiB of float32 scores);
// on an accelerator fewer, larger launches win.
int64_t default_chunk_elems(const at::Device& dev, int64_t G, int64_t nk) {
  return dev.is_cpu() ? std::clamp(G * kHeadRows * nk, int64_t{1} << 20, int64_t{1} << 25) : (int64_t{1} << 28);
}

// Splits the queries so that heads x rows x keys stays near `budget`. A masked chunk reads only
// the keys its last query may see, so with a causal mask the chunks cover about half of the
// score matrix. With a block-causal mask every query of a block sees the same keys: a chunk
// stays inside one block (no mask to add, no hidden score computed) unless blocks are smaller
// than kMinRows, when its end moves on to a block boundary.
void plan_queries(const MaskGeometry& m, int64_t nq, int64_t nk, int64_t batch_heads, int64_t budget,
                  const Chunk& heads, std::vector<Chunk>& chunks) {
  const double per_row =
      std::max(1.0, static_cast<double>(budget) / static_cast<double>(std::max<int64_t>(1, batch_heads)));
  for (int64_t a = 0; a < nq;) {
    const int64_t s = m.q0 + a;  // current index of the chunk's first query
    int64_t c;
    if (m.block == 0) {
      c = static_cast<int64_t>(per_row / static_cast<double>(std::max<int64_t>(1, nk)));
    } else {  // rows c with c * (keys before the chunk + c) <= per_row
      const double base = static_cast<double>(m.n_window + s);
      c = static_cast<int64_t>((std::sqrt(base * base + 4.0 * per_row) - base) / 2.0);
    }
    c = std::min(std::max(c, kMinRows), nq - a);
    if (m.block > 1) {
      const int64_t block_end = (s / m.block + 1) * m.block - s;  // rows to the end of s's block
      c = m.block >= kMinRows ? std::min(c, block_end) : ((s + c + m.block - 1) / m.block) * m.block - s;
      c = std::min(c, nq - a);
    }
    Chunk ch = heads;
    ch.q_begin = a;
    ch.n_rows = c;
    ch.n_keys = nk;
    ch.diag_begin = nk;
    ch.diag_width = ch.phase = 0;
    if (m.block > 0) {
      const int64_t f = m.visible(s), e = m.visible(s + c - 1);
      ch.n_keys = m.n_window + e;
      ch.diag_begin = m.n_window + f;
      ch.diag_width = e - f;
      ch.phase = s % m.block;
    }
    chunks.push_back(ch);
    a += c;
  }
}

// The chunks of a call: every head at once when the budget gives them kHeadRows query rows each,
// or all of the call's rows when it has fewer (a decoding step), or there is one kv head; else
// groups of kv heads within a batch element, each group's queries in turn (a group's keys are
// read while they are warm). No chunk for a call without queries or heads.
std::vector<Chunk> plan_chunks(const MaskGeometry& m, const Geometry& g, int64_t budget) {
  std::vector<Chunk> chunks;
  const int64_t nk = std::max<int64_t>(1, g.nk), BK = g.B * g.KH;
  if (BK * g.G == 0 || g.nq == 0) return chunks;
  if (BK == 1 || budget / (BK * g.G * nk) >= std::min(kHeadRows, g.nq)) {
    plan_queries(m, g.nq, g.nk, BK * g.G, budget, Chunk{0, 0, 0, 0, 0, 0, 0, g.B, 0, g.KH}, chunks);
    return chunks;
  }
  const int64_t hb = std::min(g.KH, std::max<int64_t>(1, budget / (g.G * kHeadRows * nk)));
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.KH; h += hb) {
      const int64_t n = std::min(hb, g.KH - h);
      plan_queries(m, g.nq, g.nk, n * g.G, budget, Chunk{0, 0, 0, 0, 0, 0, b, 1, h, n}, chunks);
    }
  return chunks;
}

// The additive mask of a chunk's diagonal keys, [rows, 1, width] (0 or -inf), for rows that
// start at `phase` within a mask block: row i sees tile column j iff j < block * floor((phase + i)
// / block). Cached per shape (a handful per sequence length), thread-safe.
at::Tensor diag_tile(int64_t rows, int64_t width, int64_t block, int64_t phase, at::ScalarType st, at::Device dev) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int, int, int>;
  static std::mutex mu;
  static std::map<Key, at::Tensor> cache;
  const Key key{rows, width, block, phase, static_cast<int>(st), static_cast<int>(dev.type()), dev.index()};
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  at::NoGradGuard no_grad;
  auto iopt = at::TensorOptions().dtype(at::kLong).device(dev);
  at::Tensor limit = at::arange(phase, phase + rows, iopt).div(block, "floor").mul(block).unsqueeze(1);  // [rows, 1]
  at::Tensor col = at::arange(0, width, iopt).unsqueeze(0);                                              // [1, width]
  at::Tensor tile = at::zeros({rows, width}, at::TensorOptions().dtype(st).device(dev))
                        .masked_fill_(col >= limit, -std::numeric_limits<double>::infinity())
                        .unsqueeze(1);
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= 512) cache.clear();
  cache.emplace(key, tile);
  return tile;
}

// The additive mask [n_q, n_k] (0 or -inf) of a masked call, built once per shape and cached
// (thread-safe; a few entries, as a handful of shapes recur; masks past 16M elements are not
// kept). Callers must not write to it.
at::Tensor mask_bias(int64_t nq, int64_t nk, int64_t n_window, int64_t block, at::ScalarType st, at::Device dev) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int, int, int>;
  static std::mutex mu;
  static std::map<Key, at::Tensor> cache;
  const Key key{nq, nk, n_window, block, static_cast<int>(st), static_cast<int>(dev.type()), dev.index()};
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  at::NoGradGuard no_grad;
  const int64_t n_cur = nk - n_window;
  auto iopt = at::TensorOptions().dtype(at::kLong).device(dev);
  at::Tensor qi = at::arange(n_cur - nq, n_cur, iopt).div(block, "floor").unsqueeze(1);  // [n_q, 1]
  at::Tensor kj = at::arange(0, n_cur, iopt).div(block, "floor").unsqueeze(0);           // [1, n_cur]
  at::Tensor m = at::zeros({nq, nk}, at::TensorOptions().dtype(st).device(dev));
  m.narrow(1, n_window, n_cur).masked_fill_(kj > qi, -std::numeric_limits<double>::infinity());
  if (m.numel() > (int64_t{1} << 24)) return m;
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= 8) cache.clear();
  cache.emplace(key, m);
  return m;
}

// opt.bias as [Bb, 1, n_q, n_k] (Bb = 1 or B) in the score dtype on `dev`; undefined if none.
at::Tensor batch_bias(const at::Tensor& bias, int64_t B, int64_t nq, int64_t nk, at::ScalarType st, at::Device dev) {
  if (!bias.defined()) return bias;
  const bool flat = bias.dim() == 2 && bias.size(0) == nq && bias.size(1) == nk;
  const bool full = bias.dim() == 4 && (bias.size(0) == B || bias.size(0) == 1) && bias.size(1) == 1 &&
                    bias.size(2) == nq && bias.size(3) == nk;
  WM_CHECK(flat || full, "bias must be [", nq, ", ", nk, "] or [", B, ", 1, ", nq, ", ", nk, "], got ", bias.sizes());
  at::Tensor b = bias.to(dev, st);
  return flat ? b.view({1, 1, nq, nk}) : b;
}

// The dtype scores and softmax run in.
at::ScalarType score_type(at::ScalarType ct) { return ct == at::kDouble ? at::kDouble : at::kFloat; }

// A chunk's part of an output laid out [B, nq, KH, G, d]: [nb, rows, nkh, G, d].
at::Tensor chunk_rows(const at::Tensor& t5, const Chunk& c) {
  return t5.narrow(0, c.b0, c.nb).narrow(1, c.q_begin, c.n_rows).narrow(2, c.kh0, c.nkh);
}

// Forward over the chunks, without autograd. qs [B*KH, nq*G, d]: the queries already scaled by
// 1/sqrt(d), rows ordered (query, group) so that a chunk is a slice; k3, v3 [B*KH, nk, d];
// logw [nk] or undefined; bias4 [1 or B, 1, nq, nk] in the score dtype or undefined. Writes out
// [B, nq, KH*G, d]; keeps each chunk's probabilities [B*KH, rows*G, keys] in keep_p if given;
// adds the key mass of queries mass_from.. into mass [B*KH, nk] if defined. With native_scale
// > 0 (bfloat16 CPU tensors, onednn::native_bf16()) the queries are not scaled yet: the products
// run on the CPU's bfloat16 units, the scores in float32 times native_scale, the probabilities
// rounded to bfloat16 for the second product (as flash attention does).
void forward_chunks(const Geometry& g, const MaskGeometry& m, const at::Tensor& qs, const at::Tensor& k3,
                    const at::Tensor& v3, const at::Tensor& logw, const at::Tensor& bias4, const at::Tensor& out,
                    std::vector<at::Tensor>* keep_p, const at::Tensor& mass, int64_t mass_from = 0,
                    double native_scale = 0) {
  const at::ScalarType ct = qs.scalar_type(), st = score_type(ct);
  const bool native = native_scale > 0;
  at::Tensor lw = logw.defined() ? logw.to(qs.device(), st) : at::Tensor();
  at::Tensor out5 = out.view({g.B, g.nq, g.KH, g.G, g.d});
  for (const Chunk& c : g.chunks) {
    const int64_t h0 = c.b0 * g.KH + c.kh0, hc = c.nb * c.nkh;  // the chunk's rows of the B*KH
    at::Tensor kc = k3.narrow(0, h0, hc).narrow(1, 0, c.n_keys), vc = v3.narrow(0, h0, hc).narrow(1, 0, c.n_keys);
    at::Tensor qc = qs.narrow(0, h0, hc).narrow(1, c.q_begin * g.G, c.n_rows * g.G), s;
    if (native) {
      s = at::empty({hc, c.n_rows * g.G, c.n_keys}, qs.options().dtype(st));
      onednn::bmm_into(qc, kc.transpose(1, 2), s, static_cast<float>(native_scale));
    } else {
      s = at::bmm(qc, kc.transpose(1, 2));
      if (s.scalar_type() != st) s = s.to(st);
    }
    if (lw.defined()) s.add_(lw.narrow(0, 0, c.n_keys));
    if (bias4.defined())  // rows (query, group): the bias of query r reaches its G rows
      s.view({c.nb, c.nkh, c.n_rows, g.G, c.n_keys})
          .add_((bias4.size(0) == 1 ? bias4 : bias4.narrow(0, c.b0, c.nb))
                    .narrow(2, c.q_begin, c.n_rows)
                    .narrow(3, 0, c.n_keys)
                    .unsqueeze(3));
    if (c.diag_width > 0)
      s.view({hc, c.n_rows, g.G, c.n_keys})
          .narrow(3, c.diag_begin, c.diag_width)
          .add_(diag_tile(c.n_rows, c.diag_width, m.block, c.phase, st, s.device()));
    at::Tensor p;  // the probabilities in the products' dtype
    if (native) {  // s holds the float32 probabilities afterwards too
      p = at::empty(s.sizes(), qs.options());
      onednn::softmax_into(s, p);
    } else {
      at::_softmax_out(s, s, -1, false);  // in place: s holds the probabilities from here on
      p = st == ct ? s : s.to(ct);
    }
    if (mass.defined()) {
      const int64_t from = std::max(mass_from, c.q_begin), to = c.q_begin + c.n_rows;
      if (to > from)
        mass.narrow(0, h0, hc)
            .narrow(1, 0, c.n_keys)
            .add_(s.narrow(1, (from - c.q_begin) * g.G, (to - from) * g.G).sum(1));
    }
    at::Tensor o;  // [hc, rows*G, d]
    if (native) {
      o = at::empty({hc, c.n_rows * g.G, g.d}, qs.options());
      onednn::bmm_into(p, vc, o);
    } else {
      o = at::bmm(p, vc);
    }
    chunk_rows(out5, c).copy_(o.view({c.nb, c.nkh, c.n_rows, g.G, g.d}).permute({0, 2, 1, 3, 4}));
    if (keep_p) keep_p->push_back(s);
  }
}

// q [B, KH*G, nq, d] -> [B*KH, nq*G, d] scaled, rows ordered (query, group); a new tensor.
at::Tensor grouped_queries(const Geometry& g, const at::Tensor& q, double scale) {
  at::Tensor qs = at::empty({g.B, g.KH, g.nq, g.G, g.d}, q.options());
  qs.copy_(q.view({g.B, g.KH, g.G, g.nq, g.d}).permute({0, 1, 3, 2, 4}));
  if (scale != 1.0) qs.mul_(scale);
  return qs.view({g.B * g.KH, g.nq * g.G, g.d});
}

std::vector<int64_t> pack(const Geometry& g) {
  std::vector<int64_t> v{g.B, g.KH, g.G, g.nq, g.nk, g.d};
  for (const Chunk& c : g.chunks)
    v.insert(v.end(), {c.q_begin, c.n_rows, c.n_keys, c.diag_begin, c.diag_width, c.phase, c.b0, c.nb, c.kh0, c.nkh});
  return v;
}

Geometry unpack(const std::vector<int64_t>& v) {
  Geometry g{v[0], v[1], v[2], v[3], v[4], v[5], {}};
  for (size_t i = 6; i + kChunkInts <= v.size(); i += kChunkInts)
    g.chunks.push_back({v[i], v[i + 1], v[i + 2], v[i + 3], v[i + 4], v[i + 5], v[i + 6], v[i + 7], v[i + 8], v[i + 9]});
  return g;
}

// One autograd node for a whole call: the forward keeps each chunk's probabilities, the
// backward walks the same chunks and accumulates dK, dV in place. No gradient for logw or the
// bias (calls where either requires grad take the plain path).
struct ChunkedAttention : torch::autograd::Function<ChunkedAttention> {
  // q [B, H, nq, d], k/v [B, KH, nk, d] in the compute dtype, logw [nk] or undefined, bias4 as
  // forward_chunks' (both passed by pointer: not inputs of the node) -> {out [B, nq, H, d], mass
  // [B*KH, nk] in the score dtype (or [0] when not captured)}.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, const at::Tensor* logw,
                                                const at::Tensor* bias4, const Geometry& g, const MaskGeometry& m,
                                                double scale, bool capture, int64_t mass_from) {
    at::Tensor qs = grouped_queries(g, q, scale);
    at::Tensor k3 = k.reshape({g.B * g.KH, g.nk, g.d}), v3 = v.reshape({g.B * g.KH, g.nk, g.d});
    at::Tensor out = at::empty({g.B, g.nq, g.KH * g.G, g.d}, q.options());
    at::Tensor mass = capture ? at::zeros({g.B * g.KH, g.nk}, q.options().dtype(score_type(q.scalar_type())))
                              : at::empty({0}, q.options());
    std::vector<at::Tensor> probs;
    forward_chunks(g, m, qs, k3, v3, *logw, *bias4, out, &probs, capture ? mass : at::Tensor(), mass_from);
    torch::autograd::variable_list saved{qs, k3, v3, out};
    saved.insert(saved.end(), probs.begin(), probs.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["geometry"] = pack(g);
    ctx->saved_data["scale"] = scale;
    ctx->mark_non_differentiable({mass});
    return {out, mass};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const Geometry g = unpack(ctx->saved_data["geometry"].toIntVector());
    const double scale = ctx->saved_data["scale"].toDouble();
    torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &qs = saved[0], &k3 = saved[1], &v3 = saved[2], &out = saved[3];
    const int64_t BK = g.B * g.KH, H = g.KH * g.G;
    const at::ScalarType ct = qs.scalar_type(), st = score_type(ct);
    at::Tensor dout5 = grads[0].to(ct).reshape({g.B, g.nq, g.KH, g.G, g.d});
    at::Tensor dO = dout5.permute({0, 2, 1, 3, 4}).contiguous().view({BK, g.nq * g.G, g.d});
    // Softmax backward: dS = P * (dP - rowsum(dP * P)) and rowsum(dP * P) = dO . O per row.
    at::Tensor rowdot = (dout5 * out.view({g.B, g.nq, g.KH, g.G, g.d}))
                            .sum(-1)
                            .to(st)
                            .permute({0, 2, 1, 3})
                            .contiguous()
                            .view({BK, g.nq * g.G, 1});
    at::Tensor dq = at::empty({g.B, g.nq, H, g.d}, qs.options());
    at::Tensor dq5 = dq.view({g.B, g.nq, g.KH, g.G, g.d});
    at::Tensor dk = at::zeros({BK, g.nk, g.d}, qs.options()), dv = at::zeros({BK, g.nk, g.d}, qs.options());
    for (size_t i = 0; i < g.chunks.size(); ++i) {
      const Chunk& c = g.chunks[i];
      const at::Tensor& p = saved[4 + i];  // [hc, rows*G, keys]
      const int64_t h0 = c.b0 * g.KH + c.kh0, hc = c.nb * c.nkh, r0 = c.q_begin * g.G, nr = c.n_rows * g.G;
      at::Tensor pc = st == ct ? p : p.to(ct);
      at::Tensor qc = qs.narrow(0, h0, hc).narrow(1, r0, nr), dOc = dO.narrow(0, h0, hc).narrow(1, r0, nr);
      at::Tensor kc = k3.narrow(0, h0, hc).narrow(1, 0, c.n_keys), vc = v3.narrow(0, h0, hc).narrow(1, 0, c.n_keys);
      // bmm then add: an in-place baddbmm_ on the narrowed accumulator runs batch by batch.
      dv.narrow(0, h0, hc).narrow(1, 0, c.n_keys).add_(at::bmm(pc.transpose(1, 2), dOc));
      at::Tensor ds = at::bmm(dOc, vc.transpose(1, 2));
      if (ds.scalar_type() != st) ds = ds.to(st);
      ds.sub_(rowdot.narrow(0, h0, hc).narrow(1, r0, nr)).mul_(p);
      if (st != ct) ds = ds.to(ct);
      dk.narrow(0, h0, hc).narrow(1, 0, c.n_keys).add_(at::bmm(ds.transpose(1, 2), qc));
      chunk_rows(dq5, c).copy_(at::bmm(ds, kc).view({c.nb, c.nkh, c.n_rows, g.G, g.d}).permute({0, 2, 1, 3, 4}));
    }
    dq.mul_(scale);
    // One entry per forward argument after ctx: q, k, v, then none for logw, bias4, g, m, scale,
    // capture, mass_from.
    torch::autograd::variable_list res(10);
    res[0] = dq.transpose(1, 2);
    res[1] = dk.view({g.B, g.KH, g.nk, g.d});
    res[2] = dv.view({g.B, g.KH, g.nk, g.d});
    return res;
  }
};

}  // namespace

at::Tensor attention_bias(int64_t n_q, int64_t n_k, const at::Tensor& logw, const AttentionOptions& opt,
                          at::Device device) {
  at::Tensor bias = at::zeros({n_q, n_k}, at::TensorOptions().dtype(at::kFloat).device(device));
  if (opt.mask.kind != AttentionMask::None) {
    const int64_t n_cur = n_k - opt.n_window;
    WM_CHECK(n_cur >= n_q, "a masked attention needs the queries among the current keys: ", n_q, " queries, ", n_cur,
             " current keys");
    const int64_t b = opt.mask.kind == AttentionMask::Causal ? 1 : opt.mask.block;
    WM_CHECK(b > 0, "block size must be > 0, got ", b);
    bias.add_(mask_bias(n_q, n_k, opt.n_window, b, at::kFloat, device));
  }
  if (logw.defined()) bias.add_(logw.to(device, at::kFloat).reshape({1, n_k}));
  if (opt.bias.defined()) {
    const int64_t bb = opt.bias.dim() == 4 ? opt.bias.size(0) : 1;
    at::Tensor ob = batch_bias(opt.bias, bb, n_q, n_k, at::kFloat, device);
    bias = opt.bias.dim() == 2 ? bias.add_(ob.view({n_q, n_k})) : bias + ob;
  }
  return bias;
}

#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
// attention() through libtorch's fused scaled_dot_product_attention (no key mass): q [B, H, nq, d],
// k, v [B, KH, nk, d] computed in ct; returns the output [B, H, nq, d] in q's dtype.
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& logw,
                           const at::Tensor& bias4, const MaskGeometry& mask, at::ScalarType ct) {
  const int64_t B = q.size(0), H = q.size(1), nq = q.size(2), d = q.size(3);
  const int64_t KH = k.size(1), nk = k.size(2), G = H / KH;
  at::Tensor qc = q.to(ct), kc = k.to(ct), vc = v.to(ct);
  // The mask's block, 0 when it hides nothing from these queries (one decoding step).
  const int64_t block = mask.block > 0 && mask.visible(mask.q0) < mask.n_cur ? mask.block : 0;
  // A plain causal self-attention (queries = keys, no log-weights, no bias) needs no bias tensor.
  const bool is_causal = block == 1 && nq == nk && !logw.defined() && !bias4.defined();
  // Without a mask or bias every query row sees the keys alike: the G query heads of a kv head
  // fold into the query length (K/V used as they are) and log-weights are one broadcast row.
  const bool same_rows = block == 0 && !bias4.defined();
  c10::optional<at::Tensor> bias;
  if (same_rows) {
    if (logw.defined()) bias = logw.to(q.device(), ct).view({1, nk}).expand({G * nq, nk});
  } else if (!is_causal) {
    at::Tensor b;
    if (block > 0) b = mask_bias(nq, nk, mask.n_window, block, ct, q.device());  // cached, read only
    if (logw.defined()) {
      at::Tensor lw = logw.to(q.device(), ct).view({1, nk});
      b = b.defined() ? b + lw : lw.expand({nq, nk});
    }
    if (bias4.defined()) b = b.defined() ? b + bias4.to(ct) : bias4.to(ct);
    bias = b;
  }
  at::Tensor o;
  if (G == 1) {
    o = at::scaled_dot_product_attention(qc, kc, vc, bias, 0.0, is_causal);
  } else if (same_rows) {
    o = at::scaled_dot_product_attention(qc.reshape({B, KH, G * nq, d}), kc, vc, bias, 0.0, false)
            .reshape({B, H, nq, d});
  } else {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
    o = at::scaled_dot_product_attention(qc, kc, vc, bias, 0.0, is_causal, c10::nullopt, /*enable_gqa=*/true);
#else
    // No enable_gqa before libtorch 2.5: K/V repeated per query head.
    at::Tensor ke = kc.unsqueeze(2).expand({B, KH, G, nk, d}).reshape({B, H, nk, d});
    at::Tensor ve = vc.unsqueeze(2).expand({B, KH, G, nk, d}).reshape({B, H, nk, d});
    o = at::scaled_dot_product_attention(qc, ke, ve, bias, 0.0, is_causal);
#endif
  }
  return o.to(q.scalar_type());
}
#endif

AttentionResult attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                          const at::Tensor& logw, const AttentionOptions& opt) {
  const bool batched = q_in.dim() == 4;
  WM_CHECK(q_in.dim() == 3 || batched, "q must be [n_heads, n_q, d] or [B, n_heads, n_q, d], got ", q_in.sizes());
  WM_CHECK(k_in.dim() == q_in.dim() && v_in.sizes() == k_in.sizes(), "k ", k_in.sizes(), " and v ", v_in.sizes(),
           " must match q's rank ", q_in.dim(), " and each other");
  at::Tensor q = batched ? q_in : q_in.unsqueeze(0);
  at::Tensor k = batched ? k_in : k_in.unsqueeze(0);
  at::Tensor v = batched ? v_in : v_in.unsqueeze(0);
  const int64_t B = q.size(0), H = q.size(1), nq = q.size(2), d = q.size(3);
  const int64_t KH = k.size(1), nk = k.size(2);
  WM_CHECK(k.size(0) == B && k.size(3) == d, "k ", k.sizes(), " does not fit q ", q.sizes());
  WM_CHECK(KH > 0 && H % KH == 0, "n_heads ", H, " is not a multiple of n_kv_heads ", KH);
  WM_CHECK(!logw.defined() || (logw.dim() == 1 && logw.size(0) == nk), "logw must be [", nk, "], got ", logw.sizes());
  WM_CHECK(opt.n_window >= 0 && opt.n_window <= nk, "n_window ", opt.n_window, " out of [0, ", nk, "]");
  const int64_t G = H / KH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  WM_CHECK(opt.mass_queries >= 0, "mass_queries must be >= 0, got ", opt.mass_queries);
  const int64_t mass_from = opt.mass_queries > 0 ? std::max<int64_t>(0, nq - opt.mass_queries) : 0;
  MaskGeometry mask;
  mask.n_window = opt.n_window;
  mask.n_cur = nk - opt.n_window;
  if (opt.mask.kind != AttentionMask::None) {
    WM_CHECK(mask.n_cur >= nq, "a masked attention needs the queries among the current keys: ", nq, " queries, ",
             mask.n_cur, " current keys");
    mask.block = opt.mask.kind == AttentionMask::Causal ? 1 : opt.mask.block;
    WM_CHECK(mask.block > 0, "block size must be > 0, got ", mask.block);
    mask.q0 = mask.n_cur - nq;
  }

  // CPU kernels for half types are slow or missing: compute there in float32, except bfloat16's
  // two products where the CPU has bfloat16 units (the no-grad chunked path, onednn.h).
  const bool upcast = q.device().is_cpu() && (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16);
  const auto ct = upcast ? at::kFloat : q.scalar_type();
  const bool native = upcast && q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
                      v.scalar_type() == at::kBFloat16 && opt.cpu_bf16_products && onednn::native_bf16();

  // The caller's dense bias as [1 or B, 1, nq, nk] in the score dtype (undefined if none).
  const at::Tensor bias4 = batch_bias(opt.bias, B, nq, nk, score_type(ct), q.device());

  AttentionResult res;
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
  if (opt.allow_fused && !opt.capture_mass) {
    const at::Tensor o = fused_attention(q, k, v, logw, bias4, mask, ct);
    res.out = batched ? o : o.squeeze(0);
    return res;
  }
#endif
  const bool grad = at::GradMode::is_enabled();
  if (grad && ((logw.defined() && logw.requires_grad()) || (opt.bias.defined() && opt.bias.requires_grad()))) {
    // Plain path (gradients reach logw and the bias). Grouped form: [B, KH, G * nq, d] x [B, KH, d, nk].
    at::Tensor bias = attention_bias(nq, nk, logw, opt, q.device());
    if (bias.dim() == 4) bias = bias.unsqueeze(2);  // [1 or B, 1, 1, nq, nk]
    at::Tensor qg = (q.to(ct) * scale).reshape({B, KH, G * nq, d});
    at::Tensor scores = at::matmul(qg, k.to(ct).transpose(-1, -2)).to(score_type(ct)).view({B, KH, G, nq, nk}) + bias;
    at::Tensor p = at::softmax(scores, -1);
    at::Tensor o = at::matmul(p.to(ct).view({B, KH, G * nq, nk}), v.to(ct)).view({B, H, nq, d}).to(q.scalar_type());
    res.out = batched ? o : o.squeeze(0);
    if (opt.capture_mass) {
      at::Tensor m = p.detach().narrow(3, mass_from, nq - mass_from).sum({2, 3});  // [B, KH, nk]
      res.key_mass = batched ? m : m.squeeze(0);
    }
    return res;
  }

  Geometry g{B, KH, G, nq, nk, d, {}};
  const int64_t budget = opt.chunk_elems > 0 ? opt.chunk_elems : default_chunk_elems(q.device(), G, nk);
  g.chunks = plan_chunks(mask, g, budget);
  at::Tensor out, mass;
  if (grad && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    torch::autograd::variable_list r =
        ChunkedAttention::apply(q.to(ct), k.to(ct), v.to(ct), &logw, &bias4, g, mask, scale, opt.capture_mass,
                                mass_from);
    out = r[0];
    mass = r[1];
  } else {
    at::NoGradGuard no_grad;
    const auto pt = native ? at::kBFloat16 : ct;  // the products' dtype
    at::Tensor qc = q.to(pt);
    out = at::empty({B, nq, H, d}, qc.options());
    if (opt.capture_mass) mass = at::zeros({B * KH, nk}, qc.options().dtype(score_type(ct)));
    forward_chunks(g, mask, grouped_queries(g, qc, native ? 1.0 : scale), k.to(pt).reshape({B * KH, nk, d}),
                   v.to(pt).reshape({B * KH, nk, d}), logw, bias4, out, nullptr, mass, mass_from,
                   native ? scale : 0.0);
  }
  at::Tensor o = out.transpose(1, 2).to(q.scalar_type());  // [B, H, nq, d]
  res.out = batched ? o : o.squeeze(0);
  if (opt.capture_mass) {
    at::Tensor m = mass.to(at::kFloat).view({B, KH, nk});
    res.key_mass = batched ? m : m.squeeze(0);
  }
  return res;
}

}  // namespace wm
