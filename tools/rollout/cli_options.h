#pragma once
// Command-line options that every program rolling the model out along an episode shares
// (wm_render, wm_revisit_bench): where retrieved chunks go, how worldkv_c compresses, and the
// sampler. Header-only so that only the programs, which link CLI11, see CLI11.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "dit/sampler.h"
#include "tools/cli/validators.h"
#include "worldkv/policy.h"
#include "worldkv/session.h"

namespace wm::rollout {

struct RolloutOptions {
  std::string placement = "original";
  double keep_ratio = 0.25;
  bool per_frame = false;
  bool fill_by_tokens = false;
  std::string merge = "merge";
  int steps = 4;
  bool renoise = false;

  void add_to(CLI::App& app) {
    app.add_option("--placement", placement, "retrieved chunks: original or reanchored positions")
        ->check(CLI::IsMember({"original", "reanchored"}));
    app.add_option("--keep-ratio", keep_ratio, "worldkv_c: fraction of non-anchor tokens kept")
        ->check(wm::cli::FiniteRange(0.0, 1.0));
    app.add_flag("--per-frame", per_frame,
                 "worldkv_c: rank tokens per frame instead of pooled over the non-anchor frames");
    app.add_flag("--fill-by-tokens", fill_by_tokens,
                 "worldkv_c: fill the retrieved region's token budget with compressed chunks (more chunks than worldkv)");
    app.add_option("--merge", merge,
                   "worldkv_c: what becomes of the tokens compression leaves out: merge (the kept token most like "
                   "each counts for it and takes the mean of their values), votes (counts only) or drop (WorldKV's rule)")
        ->check(CLI::IsMember({"drop", "votes", "merge"}));
    app.add_option("--steps", steps, "sampler steps")->check(CLI::Range(1, 50));
    app.add_flag("--renoise", renoise, "stochastic sampler: each step predicts x0 and re-noises it with fresh noise");
  }

  // The options as JSON fields (what a results file records of the run).
  nlohmann::json to_json() const {
    return {{"placement", placement}, {"keep_ratio", keep_ratio}, {"per_frame", per_frame},
            {"fill_by_tokens", fill_by_tokens}, {"merge", merge}, {"steps", steps}, {"renoise", renoise}};
  }

  // Sets sc's placement, compression and sampler (the policy and the seed stay the caller's).
  void apply(worldkv::SessionConfig& sc) const {
    sc.memory.placement = worldkv::parse_placement(placement);
    sc.memory.compression.keep_ratio = keep_ratio;
    sc.memory.compression.per_frame = per_frame;
    sc.memory.fill_by_tokens = fill_by_tokens;
    sc.memory.compression.merge = worldkv::parse_merge_mode(merge);
    sc.sampler = dit::sampler_with_steps(steps);
    sc.sampler.method = renoise ? dit::SamplingMethod::Renoise : dit::SamplingMethod::Euler;
  }
};

}  // namespace wm::rollout
