#include "runtime/attention.h"

#include <cmath>
#include <limits>

#include "runtime/error.h"

#include <torch/version.h>

namespace wm {

at::Tensor attention_bias(int64_t n_q, int64_t n_k, const at::Tensor& logw, const AttentionOptions& opt,
                          at::Device device) {
  auto fopt = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor bias = logw.defined() ? logw.to(device, at::kFloat).reshape({1, n_k}).expand({n_q, n_k}).clone()
                                   : at::zeros({n_q, n_k}, fopt);
  if (opt.mask.kind == AttentionMask::None) return bias;
  const int64_t n_cur = n_k - opt.n_window;
  WM_CHECK(n_cur >= n_q, "a masked attention needs the queries among the current keys: ", n_q, " queries, ", n_cur,
           " current keys");
  const int64_t b = opt.mask.kind == AttentionMask::Causal ? 1 : opt.mask.block;
  WM_CHECK(b > 0, "block size must be > 0, got ", b);
  auto iopt = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor qi = at::arange(n_cur - n_q, n_cur, iopt).div(b, "floor").unsqueeze(1);  // [n_q, 1]
  at::Tensor kj = at::arange(0, n_cur, iopt).div(b, "floor").unsqueeze(0);            // [1, n_cur]
  at::Tensor hidden = kj > qi;
  bias.narrow(1, opt.n_window, n_cur).masked_fill_(hidden, -std::numeric_limits<float>::infinity());
  return bias;
}

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
  WM_CHECK(H % KH == 0, "n_heads ", H, " is not a multiple of n_kv_heads ", KH);
  WM_CHECK(!logw.defined() || (logw.dim() == 1 && logw.size(0) == nk), "logw must be [", nk, "], got ",
           logw.sizes());
  WM_CHECK(opt.n_window >= 0 && opt.n_window <= nk, "n_window ", opt.n_window, " out of [0, ", nk, "]");
  const int64_t G = H / KH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  at::Tensor bias = attention_bias(nq, nk, logw, opt, q.device());

  // CPU kernels for half types are slow or missing: compute there in float32.
  const bool upcast = q.device().is_cpu() && (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16);
  const auto ct = upcast ? at::kFloat : q.scalar_type();

  AttentionResult res;
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
  if (opt.allow_fused && !opt.capture_mass) {
    at::Tensor ke = G == 1 ? k : k.unsqueeze(2).expand({B, KH, G, nk, d}).reshape({B, H, nk, d});
    at::Tensor ve = G == 1 ? v : v.unsqueeze(2).expand({B, KH, G, nk, d}).reshape({B, H, nk, d});
    at::Tensor o = at::scaled_dot_product_attention(q.to(ct), ke.to(ct), ve.to(ct), bias.to(ct), 0.0, false);
    o = o.to(q.scalar_type());
    res.out = batched ? o : o.squeeze(0);
    return res;
  }
#endif
  // Grouped form: [B, KH, G * nq, d] x [B, KH, d, nk] -> scores [B, KH, G, nq, nk].
  at::Tensor qg = q.to(ct).reshape({B, KH, G * nq, d});
  at::Tensor scores = at::matmul(qg, k.to(ct).transpose(-1, -2)).mul_(scale).to(at::kFloat).view({B, KH, G, nq, nk});
  scores = scores + bias;  // out of place: an in-place add on a view is slow under autograd
  at::Tensor p = at::softmax(scores, -1);
  at::Tensor o = at::matmul(p.to(ct).view({B, KH, G * nq, nk}), v.to(ct)).view({B, H, nq, d}).to(q.scalar_type());
  res.out = batched ? o : o.squeeze(0);
  if (opt.capture_mass) {
    at::Tensor m = p.sum({2, 3});  // [B, KH, nk]
    res.key_mass = batched ? m : m.squeeze(0);
  }
  return res;
}

}  // namespace wm
