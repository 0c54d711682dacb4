#pragma once
// Command-line options that every program rolling the model out along an episode shares
// (wm_render, wm_revisit_bench): where retrieved chunks go, how worldkv_c compresses, the
// sampler, and the bank's tiers (host memory, then spill files or a Redis server). Header-only so
// that only the programs, which link CLI11, see CLI11.
#include <CLI/CLI.hpp>
#include <ATen/ATen.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dit/sampler.h"
#include "runtime/error.h"
#include "runtime/hash.h"
#include "runtime/remote_store.h"
#include "tools/cli/kv_store_options.h"
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
  double shift = 1.0;
  bool renoise = false;
  double bank_host_mib = 0;
  std::string bank_tier = "disk", spill_dir;
  cli::KvStoreOptions kv_store;

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
    app.add_option("--shift", shift,
                   "timestep shift of the sampler's steps, t -> s t / (1 + (s - 1) t): below 1 moves them toward "
                   "t = 0 (the last step starts nearer the clean frame), above 1 toward t = 1")
        ->capture_default_str()
        ->check(wm::cli::FiniteRange(0.05, 20.0));
    app.add_flag("--renoise", renoise, "stochastic sampler: each step predicts x0 and re-noises it with fresh noise");
    app.add_option("--bank-host-mib", bank_host_mib,
                   "the bank's budget in host memory (MiB), beyond which its least recently used chunks go to "
                   "--bank-tier (0: no limit)")
        ->check(wm::cli::FiniteRange(0.0, 1e9));
    app.add_option("--bank-tier", bank_tier,
                   "where chunks beyond --bank-host-mib go: disk (spill files in --spill-dir) or redis (--kv-store)")
        ->capture_default_str()
        ->check(CLI::IsMember({"disk", "redis"}));
    app.add_option("--spill-dir", spill_dir, "--bank-tier disk: the folder of the bank's spill files (removed as "
                                             "their chunks leave the bank)");
    cli::add_kv_store_options(app, kv_store, "--bank-tier redis: the bank's chunks beyond host memory");
  }

  // What the options' own checks cannot see. Throws wm::Error.
  void validate() const {
    if (bank_tier == "redis" && kv_store.url.empty()) throw Error("--bank-tier redis needs --kv-store URL");
    if (!kv_store.url.empty() && bank_tier != "redis")
      throw Error("--kv-store is where the bank's chunks beyond --bank-host-mib go: give --bank-tier redis");
    if (bank_tier == "disk" && bank_host_mib > 0 && spill_dir.empty())
      throw Error("--bank-host-mib with --bank-tier disk needs --spill-dir (where the chunks beyond it go)");
  }

  // The remote tier for the model whose weights are at `model_path` (its namespace: an XXH64 of
  // the file), or null without --bank-tier redis.
  std::shared_ptr<RemoteStore> open_bank_store(const std::string& model_path) const {
    if (bank_tier != "redis") return nullptr;
    std::ifstream f(model_path, std::ios::binary);
    if (!f) throw Error("cannot read '" + model_path + "' to name the model in the kv store");
    Xxh64 h(0x6d6f64656cull);
    std::vector<char> buf(1 << 20);
    while (f) {
      f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      h.update(buf.data(), static_cast<size_t>(f.gcount()));
    }
    return cli::open_kv_store(kv_store, "video-" + hex64(h.digest()));
  }

  // Sets the bank's tiers: on the CPU the device tier is host memory, so with a host budget the
  // device tier's is 0 and chunks live in the host tier under it, the rest on disk or in Redis.
  void apply_bank(worldkv::SessionConfig& sc, at::Device dev, std::shared_ptr<RemoteStore> remote) const {
    if (bank_host_mib <= 0) return;
    if (dev.is_cpu()) sc.memory.bank.device_budget = 0;
    sc.memory.bank.host_budget = static_cast<size_t>(bank_host_mib * 1048576.0);
    if (bank_tier == "redis") {
      sc.memory.bank.disk_budget = 0;
      sc.memory.bank.remote = std::move(remote);
    } else {
      sc.memory.bank.spill_dir = spill_dir;
    }
  }

  // The options as JSON fields (what a results file records of the run).
  nlohmann::json to_json() const {
    return {{"placement", placement}, {"keep_ratio", keep_ratio}, {"per_frame", per_frame},
            {"fill_by_tokens", fill_by_tokens}, {"merge", merge}, {"steps", steps}, {"shift", shift}, {"renoise", renoise},
            {"bank_host_mib", bank_host_mib}, {"bank_tier", bank_tier}, {"kv_store", kv_store.url}};
  }

  // Sets sc's placement and compression (the policy and the seed stay the caller's).
  void apply(worldkv::SessionConfig& sc) const {
    sc.memory.placement = worldkv::parse_placement(placement);
    sc.memory.compression.keep_ratio = keep_ratio;
    sc.memory.compression.per_frame = per_frame;
    sc.memory.fill_by_tokens = fill_by_tokens;
    sc.memory.compression.merge = worldkv::parse_merge_mode(merge);
  }

  // The tiny DiT's sampler: --steps, --shift, --renoise.
  dit::SamplerConfig sampler() const {
    dit::SamplerConfig s = dit::sampler_with_steps(steps);
    s.shift = shift;
    s.method = renoise ? dit::SamplingMethod::Renoise : dit::SamplingMethod::Euler;
    return s;
  }
};

}  // namespace wm::rollout
