#include "llmkv/merge.h"


#include <algorithm>
#include <limits>

#include "runtime/error.h"

namespace wm::llm {

const char* merge_rule_name(MergeRule r) {
  switch (r) {
    case MergeRule::Zip: return "zip";
    case MergeRule::Votes: return "votes";
    case MergeRule::Average: return "average";
  }
  return "?";
}

namespace {

// Per group, the log of the sum of exp(x) over its members: x [rows, n], idx [n] -> [rows, groups].
at::Tensor group_logsumexp(const at::Tensor& x, const at::Tensor& idx, int64_t groups) {
  const int64_t rows = x.size(0), n = x.size(1);
  // Per group maxima (for a stable exp), on the CPU: groups are few and small.
  const at::Tensor xc = x.to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor ic = idx.to(at::kCPU, at::kLong).contiguous();
  at::Tensor mc = at::full({rows, groups}, -std::numeric_limits<double>::infinity(), at::kDouble);
  const double* px = xc.data_ptr<double>();
  const int64_t* pi = ic.data_ptr<int64_t>();
  double* pm = mc.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) pm[r * groups + pi[i]] = std::max(pm[r * groups + pi[i]], px[r * n + i]);
  const at::Tensor mx = mc.to(x.device());
  const at::Tensor e = (x - mx.index_select(1, idx)).exp();
  return at::zeros({rows, groups}, x.options()).index_add_(1, idx, e).log() + mx;
}

}  // namespace

MergedKv merge_groups(const at::Tensor& k, const at::Tensor& v, const at::Tensor& logw,
                      const std::vector<int64_t>& group, int64_t groups, const at::Tensor& q, double scale,
                      MergeRule rule) {
  WM_CHECK(k.dim() == 3 && v.sizes() == k.sizes(), "k and v must be the same [n_kv_heads, n, head_dim], got ",
           k.sizes(), " and ", v.sizes());
  const int64_t KH = k.size(0), n = k.size(1), d = k.size(2);
  WM_CHECK(logw.dim() == 1 && logw.size(0) == n, "logw must be [", n, "], got ", logw.sizes());
  WM_CHECK(static_cast<int64_t>(group.size()) == n, "one group per entry: ", group.size(), " for ", n);
  WM_CHECK(q.dim() == 2 && q.size(0) == KH && q.size(1) == d, "q must be [", KH, ", ", d, "], got ", q.sizes());
  std::vector<int64_t> count(groups, 0);
  for (int64_t g : group) {
    WM_CHECK(g >= 0 && g < groups, "group ", g, " outside [0, ", groups, ")");
    ++count[g];
  }
  std::vector<int64_t> first(groups, -1);
  for (int64_t i = 0; i < n; ++i)
    if (first[group[i]] < 0) first[group[i]] = i;
  for (int64_t g = 0; g < groups; ++g) WM_CHECK(count[g] > 0, "group ", g, " has no entry");

  const at::Device dev = k.device();
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(dev);
  const at::Tensor idx = at::tensor(group, at::kLong).to(dev);
  const at::Tensor K = k.to(at::kDouble), V = v.to(at::kDouble), lw = logw.to(f64);
  at::Tensor alpha;      // [KH, n] each entry's share of its group, per kv head
  at::Tensor logw_out;   // [groups]
  at::Tensor target;     // Zip: [KH, groups] the merged entry's q.k * scale
  const at::Tensor lw_group = group_logsumexp(lw.unsqueeze(0), idx, groups).squeeze(0);
  switch (rule) {
    case MergeRule::Zip: {
      const at::Tensor Q = q.to(at::kDouble);
      const at::Tensor a = lw.unsqueeze(0) + scale * (K * Q.unsqueeze(1)).sum(-1);  // [KH, n]
      const at::Tensor A = group_logsumexp(a, idx, groups);             // [KH, groups]
      alpha = (a - A.index_select(1, idx)).exp();
      logw_out = lw_group;
      target = A - logw_out.unsqueeze(0);
      break;
    }
    case MergeRule::Votes:
      alpha = (lw - lw_group.index_select(0, idx)).exp().unsqueeze(0).expand({KH, n});
      logw_out = lw_group;
      break;
    case MergeRule::Average: {
      at::Tensor cnt = at::tensor(count, at::kLong).to(f64);
      alpha = (1.0 / cnt.index_select(0, idx)).unsqueeze(0).expand({KH, n});
      logw_out = lw.index_select(0, at::tensor(first, at::kLong).to(dev));
      break;
    }
  }
  at::Tensor Km = at::zeros({KH, groups, d}, f64).index_add_(1, idx, K * alpha.unsqueeze(-1));
  at::Tensor Vm = at::zeros({KH, groups, d}, f64).index_add_(1, idx, V * alpha.unsqueeze(-1));
  if (rule == MergeRule::Zip) {
    // Move the weighted mean key along q so that scale * q.k hits the target exactly.
    const at::Tensor Q = q.to(at::kDouble).unsqueeze(1);                       // [KH, 1, d]
    const at::Tensor qq = (Q * Q).sum(-1).clamp_min(1e-300);                    // [KH, 1]
    const at::Tensor t = target / scale - (Km * Q).sum(-1);                     // [KH, groups]
    Km = Km + (t / qq).unsqueeze(-1) * Q;
  }
  MergedKv out;
  out.k = Km.to(k.scalar_type());
  out.v = Vm.to(v.scalar_type());
  out.logw = logw_out.to(at::kFloat);
  // Groups of one: exactly what went in.
  std::vector<int64_t> single_groups, single_entries;
  for (int64_t g = 0; g < groups; ++g)
    if (count[g] == 1) single_groups.push_back(g), single_entries.push_back(first[g]);
  if (!single_groups.empty()) {
    const at::Tensor gi = at::tensor(single_groups, at::kLong).to(dev);
    const at::Tensor ei = at::tensor(single_entries, at::kLong).to(dev);
    out.k.index_copy_(1, gi, k.index_select(1, ei));
    out.v.index_copy_(1, gi, v.index_select(1, ei));
    out.logw.index_copy_(0, gi, logw.index_select(0, ei).to(at::kFloat));
  }
  return out;
}

}  // namespace wm::llm
