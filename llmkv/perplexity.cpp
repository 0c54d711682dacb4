#include "llmkv/perplexity.h"

#include <cmath>

#include "runtime/error.h"
#include "runtime/window.h"

namespace wm::llm {

PerplexityResult perplexity(LlmModelImpl& model, const std::vector<int64_t>& ids, int64_t window,
                            const std::function<void(int64_t, int64_t)>& on_window) {
  if (window < 2) throw Error(str_cat("perplexity: a window of ", window, " tokens scores nothing (at least 2)"));
  const int64_t n_windows = static_cast<int64_t>(ids.size()) / window;
  if (n_windows == 0)
    throw Error(str_cat("perplexity: ", ids.size(), " tokens do not fill one window of ", window));
  PerplexityResult r;
  at::NoGradGuard no_grad;
  const at::Tensor all = at::tensor(ids, at::kLong);
  for (int64_t w = 0; w < n_windows; ++w) {
    KvWindow kv(model.kv_spec(model.device(), model.dtype()), {"recent"}, window);
    StepOptions so;
    so.all_logits = true;
    const at::Tensor tokens = all.slice(0, w * window, (w + 1) * window);
    const at::Tensor logits = model.step(tokens, at::arange(window, at::kLong), kv, so).logits;  // [window, V]
    const at::Tensor logp = at::log_softmax(logits.slice(0, 0, window - 1), 1);
    const at::Tensor next = tokens.slice(0, 1, window).to(logp.device()).unsqueeze(1);
    const double nll = -logp.gather(1, next).to(at::kDouble).sum().item<double>();
    r.window_nll.push_back(nll);
    r.scored += window - 1;
    if (on_window) on_window(w + 1, n_windows);
  }
  double total = 0;
  for (double x : r.window_nll) total += x;
  r.mean_nll = total / static_cast<double>(r.scored);
  r.perplexity = std::exp(r.mean_nll);
  return r;
}

}  // namespace wm::llm
