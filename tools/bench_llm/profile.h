// wm_bench_llm --profile: where a decode step's wall time goes. While a Profile runs, an observer
// of libtorch's RecordFunction user scopes times the parts llmkv/model.cpp marks ("wm.llm.proj",
// "wm.llm.attention", "wm.llm.norm", "wm.llm.rope", "wm.llm.lm_head", "wm.llm.window"); the
// rest of a step's wall time (embedding, residual adds, the MLP's activation, dispatch, the
// token brought to the host) is "other". CPU only: on a device the scopes would time launches.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmkv/model.h"
#include "runtime/window.h"
#include "tools/bench_llm/bandwidth.h"

namespace wm::bench {

// One op kind of a decode step: its time and, where it reads a known amount, its bytes.
struct KindFigures {
  std::string kind;    // "projections", "attention", "norms", "rope", "lm_head", "window", "other"
  double ms = 0;       // per step (mean over the profiled steps)
  double bytes = 0;    // read per step (weights or K/V); 0 where not counted
};

struct DecodeProfile {
  int64_t context = 0;  // tokens in the window before the first profiled step
  int steps = 0;
  double step_ms = 0;                 // mean wall time of a step (step() and the token on the host)
  double weight_bytes = 0, kv_bytes = 0;  // read per step (mean)
  std::vector<KindFigures> kinds;     // in the table's order, "other" last
};

// `steps` decode steps (after one untimed warm-up) continuing `window` from position `pos`
// with token `token` (then greedy), timed with the observer on; the window grows by steps + 1.
// Throws wm::Error if the model is not on the CPU or steps < 1 (and what step() throws).
DecodeProfile profile_decode(llm::LlmModelImpl& model, KvWindow& window, int64_t pos, int64_t token, int steps);

// The table for one (context, dtype), against the measured bandwidth (lines end with '\n').
std::string format_profile(const DecodeProfile& p, const std::string& model_name, const std::string& dtype,
                           const Bandwidth& bw);
nlohmann::json profile_json(const DecodeProfile& p, const std::string& model_name);

}  // namespace wm::bench
