#include "tools/bench_llm/profile.h"

#include <ATen/record_function.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "runtime/error.h"

namespace wm::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The scopes model.cpp marks, and the kinds they are reported as (same order).
constexpr std::array<const char*, 6> kScopes = {"wm.llm.proj",    "wm.llm.attention", "wm.llm.norm",
                                                "wm.llm.rope",    "wm.llm.lm_head",   "wm.llm.window"};
constexpr std::array<const char*, 6> kKinds = {"projections", "attention", "norms", "rope", "lm_head", "window"};

// Seconds inside each scope since the observer started (the callbacks are plain functions).
std::mutex g_mu;
std::array<double, kScopes.size()> g_seconds{};

struct Started : at::ObserverContext {
  Clock::time_point t0 = Clock::now();
};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) { return std::make_unique<Started>(); }

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  const double s = std::chrono::duration<double>(Clock::now() - static_cast<Started*>(ctx)->t0).count();
  const char* name = fn.name();
  for (size_t i = 0; i < kScopes.size(); ++i)
    if (name && std::strcmp(name, kScopes[i]) == 0) {
      std::lock_guard<std::mutex> lock(g_mu);
      g_seconds[i] += s;
      return;
    }
}

// The observer, registered for the object's life.
class ScopeObserver {
 public:
  ScopeObserver() {
    g_seconds.fill(0);
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end).scopes({at::RecordScope::USER_SCOPE}));
  }
  ~ScopeObserver() { at::removeCallback(handle_); }
  ScopeObserver(const ScopeObserver&) = delete;
  ScopeObserver& operator=(const ScopeObserver&) = delete;

 private:
  at::CallbackHandle handle_;
};

// Bytes a decode step reads of the weights, by kind: the projections (with their biases), the
// norms' scales, and the LM head (the embedding matrix when tied; otherwise the embedding reads
// one row, not counted).
struct WeightBytes {
  double proj = 0, norms = 0, lm_head = 0;
};

WeightBytes weight_bytes(const llm::LlmModelImpl& model) {
  WeightBytes w;
  for (const auto& m : model.named_modules()) {
    const auto* lin = dynamic_cast<const llm::LlmLinearImpl*>(m.value().get());
    if (!lin || m.key() == "lm_head") continue;
    // int8 weights and GGUF blocks are not parameters
    w.proj += static_cast<double>(lin->weight.nbytes() + lin->q8.bytes() + (lin->qw.defined() ? lin->qw.bytes() : 0));
    if (lin->bias.defined()) w.proj += static_cast<double>(lin->bias.nbytes());
  }
  for (const auto& p : model.named_parameters())
    if (p.key().find("norm") != std::string::npos) w.norms += static_cast<double>(p.value().nbytes());
  w.lm_head = static_cast<double>(model.decode_weight_bytes()) - w.proj - w.norms;
  return w;
}

double gbps(double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0.0; }

}  // namespace

DecodeProfile profile_decode(llm::LlmModelImpl& model, KvWindow& window, int64_t pos, int64_t token, int steps) {
  WM_CHECK(model.device().is_cpu(), "--profile times the CPU path only; the model is on ", model.device());
  WM_CHECK(steps >= 1, "--profile needs at least one step, got ", steps);
  DecodeProfile p;
  p.context = pos;
  p.steps = steps;
  const llm::StepOptions so;
  auto decode = [&] {
    const at::Tensor logits =
        model.step(at::full({1}, token, at::kLong), at::full({1}, pos, at::kLong), window, so).logits;
    token = logits.argmax(-1).item<int64_t>();  // a decode step ends with its token on the host
    ++pos;
  };
  decode();  // warm-up
  double wall = 0, kv = 0;
  std::array<double, kScopes.size()> seconds{};
  {
    ScopeObserver observer;
    for (int i = 0; i < steps; ++i) {
      kv += static_cast<double>(window.bytes_used());  // the K/V attention reads (the current token's aside)
      const auto t0 = Clock::now();
      decode();
      wall += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    std::lock_guard<std::mutex> lock(g_mu);
    seconds = g_seconds;
  }
  const WeightBytes wb = weight_bytes(model);
  p.step_ms = 1000.0 * wall / steps;
  p.kv_bytes = kv / steps;
  p.weight_bytes = wb.proj + wb.norms + wb.lm_head;
  double inside = 0;
  for (size_t i = 0; i < kScopes.size(); ++i) {
    KindFigures k;
    k.kind = kKinds[i];
    k.ms = 1000.0 * seconds[i] / steps;
    inside += k.ms;
    if (k.kind == "projections") k.bytes = wb.proj;
    if (k.kind == "attention") k.bytes = p.kv_bytes;
    if (k.kind == "norms") k.bytes = wb.norms;
    if (k.kind == "lm_head") k.bytes = wb.lm_head;
    p.kinds.push_back(k);
  }
  p.kinds.push_back({"other", p.step_ms - inside, 0});
  return p;
}

std::string format_profile(const DecodeProfile& p, const std::string& model_name, const std::string& dtype,
                           const Bandwidth& bw) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "\nDecode step profile: %s, context %lld, %s, %d steps (mean)\n",
                model_name.c_str(), static_cast<long long>(p.context), dtype.c_str(), p.steps);
  out += line;
  std::snprintf(line, sizeof line, "%-14s %10s %8s %12s %10s\n", "op kind", "ms/step", "%", "MB read", "GB/s");
  out += line;
  for (const auto& k : p.kinds) {
    char rate[32] = "";
    if (k.bytes > 0) std::snprintf(rate, sizeof rate, "%.1f", gbps(k.bytes, k.ms));
    std::snprintf(line, sizeof line, "%-14s %10.2f %7.1f%% %12.1f %10s\n", k.kind.c_str(), k.ms,
                  p.step_ms > 0 ? 100.0 * k.ms / p.step_ms : 0.0, k.bytes / 1e6, rate);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-14s %10.2f %7.1f%% %12.1f %10.1f\n", "step", p.step_ms, 100.0,
                (p.weight_bytes + p.kv_bytes) / 1e6, gbps(p.weight_bytes + p.kv_bytes, p.step_ms));
  out += line;
  const double bound_ms = (p.weight_bytes + p.kv_bytes) / (bw.read_gbps * 1e9) * 1e3;
  std::snprintf(line, sizeof line,
                "weights %.1f MB + K/V %.1f MB read a step: %.1f GB/s effective; measured read %.1f, copy %.1f, "
                "triad %.1f GB/s (%d threads): %.1f ms a step at the read rate\n",
                p.weight_bytes / 1e6, p.kv_bytes / 1e6, gbps(p.weight_bytes + p.kv_bytes, p.step_ms), bw.read_gbps,
                bw.copy_gbps, bw.triad_gbps, bw.threads, bound_ms);
  out += line;
  return out;
}

nlohmann::json profile_json(const DecodeProfile& p, const std::string& model_name) {
  nlohmann::json kinds = nlohmann::json::array();
  for (const auto& k : p.kinds) kinds.push_back({{"kind", k.kind}, {"ms_per_step", k.ms}, {"bytes_read", k.bytes}});
  return {{"model", model_name},       {"context", p.context},       {"steps", p.steps},
          {"step_ms", p.step_ms},      {"weight_bytes", p.weight_bytes}, {"kv_bytes", p.kv_bytes},
          {"effective_gbps", gbps(p.weight_bytes + p.kv_bytes, p.step_ms)}, {"kinds", kinds}};
}

}  // namespace wm::bench
