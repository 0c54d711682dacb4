// wm_plan_bench: an embodied planner that consults a long memory before every short action, its
// KV reused across prompts under recompute policies (llmkv/recompute/). An ALFRED-like episode
// loop in the `plan` task's text house (tools/llm_tasks/plan_world.h): at each step the prompt is
// the rules and a worked example (static), the object-state memory (one JSON line per thing, as the
// executed actions leave it), the goal and the steps so far, then "Step N:"; the model writes the
// next action (greedy) and the world executes it. Every policy runs the same held-out episodes,
// step by step in turn (interleaved, so that a busy machine slows them alike), each with its own
// world (the model drives) or one shared course (the oracle drives, the model's action scored),
// and its own chunk cache. Per policy: success rate (Wilson 95%), next-action agreement with the
// oracle, TTFT per step (mean, p50, p90), the share of the memory's K/V recomputed, tokens loaded
// per tier, the loader's idle time per layer and the model's wait for it, KV bytes, and against
// full_recompute on the same prompt the KL divergence and top-1 agreement of the first action
// token's distribution.
#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/grad_mode.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "llmkv/chat_template.h"
#include "llmkv/chunk_cache.h"
#include "runtime/remote_store.h"
#include "llmkv/config.h"
#include "llmkv/hf_folder.h"
#include "llmkv/model.h"
#include "llmkv/recompute/blend.h"
#include "llmkv/recompute/recompute_policy.h"
#include "llmkv/model_source.h"
#include "llmkv/tokenizer.h"
#include "llmkv/weight_shapes.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/distinct_outputs.h"
#include "tools/cli/error_text.h"
#include "tools/cli/kv_store_options.h"
#include "tools/cli/output_file.h"
#include "tools/cli/output_folder.h"
#include "tools/cli/progress.h"
#include "tools/cli/run_folder.h"
#include "tools/cli/shipped_path.h"
#include "tools/cli/stats.h"
#include "tools/cli/validators.h"
#include "tools/llm_tasks/plan_memory.h"
#include "tools/llm_tasks/plan_world.h"
#include "tools/llm_tasks/prose.h"
#include "tools/llm_tasks/sample.h"
#include "tools/rollout/plot.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_plan_bench {

namespace {

namespace fs = std::filesystem;
namespace lt = wm::llmtasks;
using wm::llm::PromptSegment;
using Clock = std::chrono::steady_clock;

const char* const kEmbeddedModel = "assets/models/tiny-llm";

// A number, or null for NaN (JSON has no NaN).
nlohmann::json num_or_null(double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); }

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double at = q * (v.size() - 1);
  const size_t i = static_cast<size_t>(at);
  return i + 1 < v.size() ? v[i] + (at - i) * (v[i + 1] - v[i]) : v[i];
}

double mean(const std::vector<double>& v) {
  return v.empty() ? std::nan("") : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

struct Options {
  std::string model = kEmbeddedModel, tokenizer, device = "auto", driver = "model";
  std::string json_out, csv_out, plot_dir, spill_dir, bank_tier = "host", layout = "long", memory_text = "objects";
  std::vector<std::string> policies = wm::llm::recompute_policy_names();
  std::vector<std::string> pair_with;
  int episodes = 8, first_episode = 0, max_steps = 24, layers = 0, threads = 0;
  int rooms = 4, locks = 3, objects = 3;
  int64_t memory_tokens = 2048, max_new_tokens = 16, prefill_chunk = 512;
  double bank_host_mib = 0, load_mib_per_s = 0;
  bool cold_disk = false, chat = false;
  uint64_t seed = 0;
  wm::llm::RecomputeConfig recompute;
  wm::cli::KvStoreOptions kv_store;
};

// The model, the episodes and the prompts.
void add_run_options(CLI::App& app, Options& o) {
  app.add_option("-m,--model", o.model,
                 "model folder or GGUF file, or a config.json for random weights at that shape (default: the embedded tiny model, "
                 "looked for in the working directory, then above this program's folder)")
      ->capture_default_str()
      ->check(CLI::ExistingPath);
  app.add_option("--tokenizer", o.tokenizer,
                 "tokenizer.json (default: the model folder's; for a config.json the embedded model's)")
      ->check(CLI::ExistingFile);
  app.add_option("--layers", o.layers, "random weights only: the config's layer count replaced by this")
      ->check(CLI::Range(1, 1024));
  app.add_option("--seed", o.seed, "random weights' seed")->capture_default_str()->check(wm::cli::Uint64());
  app.add_option("--policies", o.policies, "recompute policies, run in turn on every step")
      ->capture_default_str()
      ->check(CLI::IsMember(wm::llm::recompute_policy_names()));
  app.add_option("--pair-with", o.pair_with,
                 "policies of --policies to pair every other policy with, as with full_recompute (a table each: "
                 "outcomes right there and wrong here, the reverse, McNemar's p)")
      ->check(CLI::IsMember(wm::llm::recompute_policy_names()));
  app.add_option("--episodes", o.episodes, "held-out episodes")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--first-episode,--first-sample", o.first_episode,
                 "held-out index of the first episode: below 1000000 is the dev range (tune there), from 2000000 on "
                 "the test range (report there)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--max-steps", o.max_steps, "steps per episode at most (the oracle's plan, when shorter, ends it "
                                             "under --driver oracle)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  app.add_option("--driver", o.driver,
                 "who acts: the model (its action executed; success rate) or the oracle (the oracle's action "
                 "executed, the model's scored against it; every policy sees the same prompts)")
      ->capture_default_str()
      ->check(CLI::IsMember({"model", "oracle"}));
  app.add_option("--memory-tokens", o.memory_tokens,
                 "the memory's size in tokens: distractor objects fill the house's lines up to it")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 20));
  app.add_option("--memory-text", o.memory_text,
                 "what fills the memory up to --memory-tokens past the house's lines: objects (distractor objects' "
                 "JSON lines) or prose (paragraphs of the Debian Administrator's Handbook, package debian-handbook, "
                 "spread between the house's lines as notes; dev episodes read the handbook's dev files, test "
                 "episodes its test files)")
      ->capture_default_str()
      ->check(CLI::IsMember({"objects", "prose"}));
  app.add_flag("--chat", o.chat,
               "render each prompt as one user message of the model's chat template (a GGUF file's or a model "
               "folder's), the assistant's reply opening with the step's cue");
  app.add_option("--layout", o.layout,
                 "the prompt's static texts as the plan task writes them: long (the full rules and a worked "
                 "example, its layout from 1,024 tokens on) or short (the short rules, no example: its layout "
                 "below 768 tokens, the one a model trained at 128-256 tokens has seen)")
      ->capture_default_str()
      ->check(CLI::IsMember({"long", "short"}));
  app.add_option("--rooms", o.rooms, "rooms besides the hall")->capture_default_str()->check(CLI::Range(1, 16));
  app.add_option("--locks", o.locks, "locked doors and containers, each with a key")
      ->capture_default_str()
      ->check(CLI::Range(0, 14));
  app.add_option("--objects", o.objects, "portable objects (goal candidates)")
      ->capture_default_str()
      ->check(CLI::Range(1, 28));
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens of an action at most")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  app.add_option("--prefill-chunk", o.prefill_chunk, "tokens per forward pass of an ordinary prefill")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
}

// The recompute policies' settings.
void add_recompute_options(CLI::App& app, wm::llm::RecomputeConfig& r) {
  app.add_option("--ratio", r.ratio, "cacheblend, keep: share of the memory's tokens recomputed")
      ->capture_default_str()
      ->check(wm::cli::FiniteRange(1e-6, 1.0));
  app.add_option("--filter-layers", r.filter_layers, "cacheblend: layers over which 2x ratio shrinks to ratio")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  app.add_option("--check-layers", r.check_layers,
                 "keep: layers of the multi-hop selection (default 1)")
      ->check(CLI::Range(0, 1023));
  app.add_option("--check-ratios", r.check_ratios,
                 "keep: per check layer, the multiple of --ratio selected there (default 1 each)")
      ->check(wm::cli::FiniteRange(1e-6, 1e6));
  app.add_option("--static-after", r.static_after, "keep: steps unchanged after which a memory line is static")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--group-similarity", r.group_similarity,
                 "keep: a static line joins the group before it at this cosine of signatures or more")
      ->capture_default_str()
      ->check(wm::cli::FiniteRange(-1.0, 1.0));
  app.add_option("--max-group-tokens", r.max_group_tokens, "keep: tokens in one group at most")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--max-hops", r.max_hops, "keep: multi-hop rounds at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--head-tokens", r.head_tokens,
                 "keep: the first tokens of every memory line not selected, recomputed as well (0: KEEP as "
                 "published)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
}

// The cache's tiers, the outputs, the device.
void add_storage_and_output_options(CLI::App& app, Options& o) {
  app.add_option("--bank-tier", o.bank_tier,
                 "where cache entries live: host memory, or disk (spill files, loaded a layer at a time)")
      ->capture_default_str()
      ->check(CLI::IsMember({"host", "disk"}));
  app.add_option("--bank-host-mib", o.bank_host_mib,
                 "--bank-tier host: the host tier's budget in MiB, beyond which entries spill to disk (0: none)")
      ->capture_default_str()
      ->check(wm::cli::FiniteRange(0.0, 1e9));
  app.add_flag("--cold-disk", o.cold_disk,
               "drop spill files from the page cache once written, so that loading reads the disk");
  app.add_option("--load-mib-per-s", o.load_mib_per_s,
                 "cap on the loader's throughput in MiB/s, standing for a link slower than this machine's memory "
                 "and disk (a PCIe bus, a network store); 0: none, else at least 1")
      ->capture_default_str()
      ->check(wm::cli::FiniteRange(0.0, 1e9))
      ->check([](const std::string& v) -> std::string {
        const double x = std::strtod(v.c_str(), nullptr);
        return x == 0.0 || x >= 1.0 ? "" : "'" + v + "' MiB/s would take days per step: give 0 (no cap) or at least 1";
      });
  app.add_option("--spill-dir", o.spill_dir,
                 "where spill files go: a folder of this run's own inside it, removed at the end (default: $TMPDIR)");
  wm::cli::add_kv_store_options(app, o.kv_store,
                                "the chunk caches' entries (published as computed, looked for before computing)");
  app.add_option("--json", o.json_out, "write the summary and every step as JSON to this file");
  app.add_option("--csv", o.csv_out, "write the summary table as CSV to this file");
  app.add_option("--plots", o.plot_dir,
                 "write PNG charts to this folder: success and agreement with full_recompute against TTFT, TTFT "
                 "per step, the loader's idle time per layer");
  app.add_option("--device", o.device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
}

// Every option, in the order --help lists them.
void add_options(CLI::App& app, Options& o) {
  add_run_options(app, o);
  add_recompute_options(app, o.recompute);
  add_storage_and_output_options(app, o);
}

// The static texts of the `plan` task's prompts, exactly as its generator writes them: the rules,
// the worked example (empty in the short layout) and the memory header, read off a generated sample
// of a length that has that layout; under --chat, what the model's chat template writes before the
// prompt and between it and the cue (one user message, the assistant's turn opened), and the text
// that ends the assistant's reply.
struct PlanTexts {
  std::string rules, example, memory_header;
  std::string before_user, after_user, stop;
};

// --chat: the model's chat template around the prompt, into t. Throws wm::Error when the model
// has no template.
void add_chat_frame(PlanTexts& t, const wm::llm::LlmSource& src) {
  if (src.chat_template.empty())
    throw wm::Error("--chat: the model has no chat template (a GGUF file's tokenizer.chat_template or a model "
                    "folder's tokenizer_config.json)");
  const wm::llm::ChatTemplate tmpl =
      wm::llm::ChatTemplate::from_source(src.chat_template, src.bos_token, src.eos_token);
  std::tie(t.before_user, t.after_user) = wm::llm::user_message_frame(tmpl);
  t.stop = tmpl.eos_token();
}

PlanTexts plan_texts(const std::string& layout) {
  const bool long_layout = layout == "long";
  for (uint64_t i = 0; i < 64; ++i) {
    lt::GenOptions go;
    go.target_tokens = long_layout ? 4096 : 256;
    const lt::Sample s = lt::make_plan(lt::training_seed(i), go);
    const size_t r = s.find("system"), e = s.find("example"), m = s.find("memory");
    const bool has_example = e < s.segments.size();
    if (r < s.segments.size() && m < s.segments.size() && has_example == long_layout)
      return {s.segments[r].text, has_example ? s.segments[e].text : "", s.segments[m].text};
  }
  throw wm::Error(wm::str_cat("the plan generator wrote no sample of the ", layout, " layout"));
}

// One held-out episode: a house whose memory holds about memory_tokens tokens, and its goal.
struct Episode {
  uint64_t seed = 0;
  lt::World world;
  lt::Goal goal;
  std::vector<std::string> solution;  // the oracle's plan from the start
  lt::ProseNotes notes;               // --memory-text prose: the handbook's paragraphs in the memory
  int64_t memory_tokens = 0;
};

// The episode of held-out index `index`. Its memory is filled up to --memory-tokens by distractor
// objects, or under --memory-text prose by notes from `prose` (null otherwise).
Episode make_episode(int index, const Options& o, const wm::llm::Tokenizer& tok, const lt::ProseCorpus* prose) {
  Episode ep;
  ep.seed = lt::heldout_seed(static_cast<uint64_t>(index));
  lt::WorldSpec spec;
  spec.rooms = o.rooms;
  spec.containers = o.rooms + 1;
  spec.furniture = o.rooms;
  spec.locks = std::min(o.locks, std::min(14, spec.rooms + spec.containers));
  spec.objects = o.objects;
  auto tokens_of = [&](const lt::World& w) {
    int64_t n = 0;
    for (const auto& s : w.memory_lines()) n += static_cast<int64_t>(tok.encode(s.text).size());
    return n;
  };
  // Distractor lines fill the memory: the house with n of them is the one with n - 1 plus a line.
  lt::World base = lt::World::generate(ep.seed, spec, &ep.goal);
  int64_t n = tokens_of(base);
  const auto count = [&](const std::string& text) { return static_cast<int64_t>(tok.encode(text).size()); };
  if (prose != nullptr) ep.notes = lt::make_prose_notes(ep.seed, o.memory_tokens - n, count, *prose);
  if (prose == nullptr && n < o.memory_tokens) {
    lt::WorldSpec wide = spec;
    wide.distractors = static_cast<int>((o.memory_tokens - n) / 8) + 16;
    const lt::World big = lt::World::generate(ep.seed, wide);
    for (const std::string& name : big.distractor_names()) {
      if (n >= o.memory_tokens) break;
      n += static_cast<int64_t>(tok.encode(big.memory_line(name) + "\n").size());
      ++spec.distractors;
    }
  }
  ep.world = lt::World::generate(ep.seed, spec, &ep.goal);
  ep.memory_tokens = tokens_of(ep.world) + ep.notes.tokens;
  ep.solution = ep.world.solve(ep.goal, 500);
  return ep;
}

// The prompt of step `step` (1-based): the plan task's layout, segment by segment, the episode's
// notes (if any) between the memory's lines, in the chat template's frame under --chat.
std::vector<PromptSegment> make_prompt(const PlanTexts& t, const lt::World& w, const Episode& ep,
                                       const std::vector<std::string>& past, const wm::llm::Tokenizer& tok) {
  const lt::Goal& goal = ep.goal;
  std::vector<PromptSegment> p;
  p.push_back({"rules", tok.encode(t.before_user + t.rules), true});
  if (!t.example.empty()) p.push_back({"example", tok.encode(t.example), true});
  p.push_back({"memory", tok.encode(t.memory_header), true});
  for (const auto& m : lt::memory_with_notes(w.memory_lines(), ep.notes)) p.push_back({m.id, tok.encode(m.text), true});
  p.push_back({"goal", tok.encode("Goal: " + goal.text() + ".\n"), false});
  for (size_t i = 0; i < past.size(); ++i)
    p.push_back({wm::str_cat("step:", i + 1), tok.encode(wm::str_cat("Step ", i + 1, ": ", past[i], "\n")), false});
  p.push_back({"cue", tok.encode(wm::str_cat(t.after_user, "Step ", past.size() + 1, ":")), false});
  return p;
}

// The log-probabilities over the tokenizer's ids of logits [vocab].
at::Tensor log_probs(const at::Tensor& logits, int64_t vocab) {
  return at::log_softmax(logits.narrow(0, 0, std::min<int64_t>(vocab, logits.size(0))).to(at::kDouble), 0);
}

// Greedy decoding of an action after the prompt: the first token from the prompt's logits, the
// rest one step at a time over the window, until a newline or `stop` (when not empty: the chat
// template's end of a turn). Returns the action's text.
std::string decode_action(wm::llm::LlmModelImpl& model, const wm::llm::Tokenizer& tok, wm::KvWindow& window,
                          at::Tensor logits, int64_t next_pos, int64_t max_new, const std::string& stop) {
  const int64_t vocab = std::min<int64_t>(tok.vocab_size(), logits.size(0));
  std::vector<int64_t> out;
  std::string text;
  wm::llm::StepOptions so;
  so.region = "recent";
  so.segment = "tail";
  for (int64_t i = 0; i < max_new; ++i) {
    const int64_t t = logits.narrow(0, 0, vocab).argmax().item<int64_t>();
    out.push_back(t);
    text = tok.decode(out);
    const size_t end = stop.empty() ? std::string::npos : text.find(stop);
    if (end != std::string::npos) {
      text.resize(end);
      break;
    }
    if (text.find('\n') != std::string::npos || i + 1 == max_new) break;
    logits = model.step(at::full({1}, t, at::kLong), at::full({1}, next_pos + i, at::kLong), window, so)
                 .logits.select(0, 0)
                 .to(at::kCPU);
  }
  text = text.substr(0, text.find('\n'));
  const size_t b = text.find_first_not_of(' '), e = text.find_last_not_of(' ');
  return b == std::string::npos ? "" : text.substr(b, e - b + 1);
}

// One step of one policy, as recorded.
struct StepRecord {
  int episode = 0, step = 0;
  std::string policy, action, oracle;
  bool valid = false, match = false;
  double ttft_ms = 0, store_ms = 0, decode_ms = 0, recomputed = 0;
  int64_t prompt_tokens = 0, memory_tokens = 0, prefilled_tokens = 0, units = 0, misses = 0, corrupt = 0;
  std::array<double, 3> loaded{};  // tokens (token-layers over layers) per tier
  std::vector<double> idle_ms, stall_ms;
  double busy_ms = 0;
  double kl = std::nan(""), agree = std::nan("");
  double same_action = std::nan("");  // 1: the whole action is full_recompute's on the same prompt, 0: not
};

// What runs one policy: its cache, policy object, and per episode its world and past actions.
struct Runner {
  std::string name;
  std::unique_ptr<wm::llm::ChunkCache> cache;
  std::unique_ptr<wm::llm::RecomputePolicy> policy;
  std::unique_ptr<wm::KvWindow> window;
  lt::World world;
  std::vector<std::string> past;
  bool done = false, success = false;
  at::Tensor logits;
  std::vector<int64_t> prompt_ids;
  // Totals.
  int64_t episodes = 0, successes = 0;
  std::vector<bool> outcomes;  // per episode, success (--driver model)
  std::vector<StepRecord> steps;
  std::array<size_t, 3> peak_bytes{};
  size_t window_bytes = 0;
};

struct PolicySummary {
  std::string policy;
  int64_t episodes = 0, successes = 0, steps = 0, valid = 0, match = 0, compared = 0, agree = 0;
  double success = 0, lo = 0, hi = 0, agree_lo = 0, agree_hi = 0, ttft_mean = 0, ttft_p50 = 0, ttft_p90 = 0, ttft_vs_full = std::nan("");
  double warm_mean = std::nan(""), warm_p50 = std::nan(""), warm_vs_full = std::nan("");  // steps 2..
  double recomputed = 0, prefilled = 0, kl = std::nan(""), agreement = std::nan(""), store_ms = 0, decode_ms = 0;
  // The greedy action (all its tokens) equal to full_recompute's on the same prompt: steps compared,
  // equal, the share and its Wilson 95% interval.
  int64_t actions_compared = 0, actions_same = 0;
  double action_agreement = std::nan(""), action_lo = std::nan(""), action_hi = std::nan("");
  double memory_tokens = 0, prompt_tokens = 0, idle_early_ms = 0, idle_ms = 0, stall_ms = 0, stall_late_ms = 0;
  double busy_ms = 0;
  std::array<double, 3> loaded{};
  std::vector<double> idle_per_layer, stall_per_layer;
  std::array<size_t, 3> cache_bytes{};
  size_t window_bytes = 0;
  int64_t corrupt = 0;
  // Paired against full_recompute (same episodes; under --driver oracle the same prompts): outcomes
  // it got right and this policy wrong (lost), the reverse (won), McNemar's exact two-sided p.
  int64_t lost = -1, won = -1;
  double mcnemar_p = std::nan("");
  // The same against each policy of --pair-with (not against itself).
  struct Pairing {
    int64_t lost = 0, won = 0;
    double p = 1.0;
  };
  std::map<std::string, Pairing> paired_with;
};

// McNemar's exact test: two-sided p of b against c discordant pairs (binomial, n = b + c, 1/2).
double mcnemar_exact(int64_t b, int64_t c) {
  const int64_t n = b + c, k = std::min(b, c);
  if (n == 0) return 1.0;
  double tail = 0;
  for (int64_t i = 0; i <= k; ++i)
    tail += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) - n * std::log(2.0));
  return std::min(1.0, 2 * tail);
}

// A runner's outcomes: per step (episode, step) when the oracle drives, per episode when the
// model does.
using Outcomes = std::map<std::pair<int, int>, bool>;
Outcomes outcomes_of(const Runner& r, bool model_driven) {
  Outcomes out;
  if (model_driven)
    for (size_t e = 0; e < r.outcomes.size(); ++e) out[{static_cast<int>(e), 0}] = r.outcomes[e];
  else
    for (const auto& st : r.steps) out[{st.episode, st.step}] = st.match;
  return out;
}

// `mine` against `theirs`: right there and wrong here (lost), the reverse (won), McNemar's p.
PolicySummary::Pairing pair_outcomes(const Outcomes& theirs, const Outcomes& mine) {
  PolicySummary::Pairing pr;
  for (const auto& [key, ok] : theirs) {
    const auto it = mine.find(key);
    if (it == mine.end()) continue;
    pr.lost += ok && !it->second;
    pr.won += !ok && it->second;
  }
  pr.p = mcnemar_exact(pr.lost, pr.won);
  return pr;
}

// Fills lost, won and mcnemar_p of every row against the full_recompute runner, and paired_with
// against each runner `pair_with` names.
void pair_rows(std::vector<PolicySummary>& rows, const std::vector<Runner>& runners, bool model_driven,
               const std::vector<std::string>& pair_with) {
  std::vector<Outcomes> out;
  for (const auto& r : runners) out.push_back(outcomes_of(r, model_driven));
  for (size_t f = 0; f < runners.size(); ++f) {
    const std::string& ref = runners[f].name;
    const bool full = ref == "full_recompute";
    const bool asked = std::find(pair_with.begin(), pair_with.end(), ref) != pair_with.end();
    if (!full && !asked) continue;
    for (size_t i = 0; i < rows.size() && i < runners.size(); ++i) {
      const PolicySummary::Pairing pr = pair_outcomes(out[f], out[i]);
      if (full) rows[i].lost = pr.lost, rows[i].won = pr.won, rows[i].mcnemar_p = pr.p;
      if (asked && i != f) rows[i].paired_with[ref] = pr;
    }
  }
}

// full_ttft, full_warm: full_recompute's mean TTFT over all steps and over steps 2.. (0: none).
PolicySummary summarize(const Runner& r, int n_layers, double full_ttft, double full_warm) {
  PolicySummary s;
  s.policy = r.name;
  s.episodes = r.episodes;
  s.successes = r.successes;
  s.success = r.episodes ? static_cast<double>(r.successes) / r.episodes : 0.0;
  std::tie(s.lo, s.hi) = wm::cli::wilson95(r.successes, r.episodes);
  std::vector<double> ttft, warm, rec, pre, kl, store, dec, mem, prompt;
  s.idle_per_layer.assign(n_layers, 0.0);
  s.stall_per_layer.assign(n_layers, 0.0);
  for (const auto& st : r.steps) {
    ++s.steps;
    s.valid += st.valid;
    s.match += st.match;
    if (st.step > 1) warm.push_back(st.ttft_ms);
    ttft.push_back(st.ttft_ms), rec.push_back(st.recomputed), pre.push_back(static_cast<double>(st.prefilled_tokens));
    store.push_back(st.store_ms), dec.push_back(st.decode_ms);
    mem.push_back(static_cast<double>(st.memory_tokens)), prompt.push_back(static_cast<double>(st.prompt_tokens));
    for (int t = 0; t < 3; ++t) s.loaded[t] += st.loaded[t];
    s.busy_ms += st.busy_ms;
    for (size_t l = 0; l < st.idle_ms.size() && l < static_cast<size_t>(n_layers); ++l) {
      s.idle_per_layer[l] += st.idle_ms[l];
      s.stall_per_layer[l] += st.stall_ms[l];
    }
    if (!std::isnan(st.kl)) {
      kl.push_back(st.kl);
      ++s.compared;
      s.agree += st.agree > 0.5;
    }
    if (!std::isnan(st.same_action)) ++s.actions_compared, s.actions_same += st.same_action > 0.5;
    s.corrupt += st.corrupt;
  }
  std::tie(s.agree_lo, s.agree_hi) = wm::cli::wilson95(s.match, s.steps);  // oracle agreement
  const double n = std::max<int64_t>(1, s.steps);
  for (int t = 0; t < 3; ++t) s.loaded[t] /= n;
  s.busy_ms /= n;
  for (int l = 0; l < n_layers; ++l) {
    s.idle_per_layer[l] /= n;
    s.stall_per_layer[l] /= n;
    s.idle_ms += s.idle_per_layer[l];
    s.stall_ms += s.stall_per_layer[l];
    if (l < (n_layers + 1) / 2) s.idle_early_ms += s.idle_per_layer[l];
    else s.stall_late_ms += s.stall_per_layer[l];
  }
  s.ttft_mean = mean(ttft), s.ttft_p50 = quantile(ttft, 0.5), s.ttft_p90 = quantile(ttft, 0.9);
  if (full_ttft > 0) s.ttft_vs_full = s.ttft_mean / full_ttft;
  if (!warm.empty()) s.warm_mean = mean(warm), s.warm_p50 = quantile(warm, 0.5);
  if (full_warm > 0) s.warm_vs_full = s.warm_mean / full_warm;
  s.recomputed = mean(rec), s.prefilled = mean(pre), s.store_ms = mean(store), s.decode_ms = mean(dec);
  s.memory_tokens = mean(mem), s.prompt_tokens = mean(prompt);
  if (!kl.empty()) s.kl = mean(kl), s.agreement = static_cast<double>(s.agree) / s.compared;
  if (s.actions_compared > 0) {
    s.action_agreement = static_cast<double>(s.actions_same) / s.actions_compared;
    std::tie(s.action_lo, s.action_hi) = wm::cli::wilson95(s.actions_same, s.actions_compared);
  }
  for (int t = 0; t < 3; ++t) s.cache_bytes[t] = r.peak_bytes[t];
  s.window_bytes = r.window_bytes;
  return s;
}

nlohmann::json paired_json(const PolicySummary& s) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, pr] : s.paired_with) j[name] = {{"lost", pr.lost}, {"won", pr.won}, {"mcnemar_p", pr.p}};
  return j;
}

nlohmann::json to_json(const PolicySummary& s, bool model_driven) {
  return {{"policy", s.policy},
          {"episodes", s.episodes},
          {"successes", s.successes},
          {"success_rate", model_driven ? nlohmann::json(s.success) : nlohmann::json(nullptr)},
          {"wilson95", model_driven ? nlohmann::json({s.lo, s.hi}) : nlohmann::json(nullptr)},
          {"steps", s.steps},
          {"valid_actions", s.steps ? static_cast<double>(s.valid) / s.steps : 0.0},
          {"oracle_agreement", s.steps ? static_cast<double>(s.match) / s.steps : 0.0},
          {"oracle_agreement_wilson95", {s.agree_lo, s.agree_hi}},
          {"vs_full_recompute",
           s.lost < 0 ? nlohmann::json(nullptr)
                      : nlohmann::json({{"lost", s.lost}, {"won", s.won}, {"mcnemar_p", s.mcnemar_p}})},
          {"paired_with", paired_json(s)},
          {"ttft_ms", {{"mean", s.ttft_mean}, {"p50", s.ttft_p50}, {"p90", s.ttft_p90}}},
          {"ttft_vs_full_recompute", num_or_null(s.ttft_vs_full)},
          {"warm_ttft_ms", {{"mean", num_or_null(s.warm_mean)}, {"p50", num_or_null(s.warm_p50)}}},
          {"warm_ttft_vs_full_recompute", num_or_null(s.warm_vs_full)},
          {"recomputed_fraction", s.recomputed},
          {"prefilled_tokens_per_step", s.prefilled},
          {"loaded_tokens_per_step", {{"device", s.loaded[0]}, {"host", s.loaded[1]}, {"disk", s.loaded[2]}}},
          {"loader_idle_ms_per_layer", s.idle_per_layer},
          {"loader_stall_ms_per_layer", s.stall_per_layer},
          {"loader_idle_early_ms", s.idle_early_ms},
          {"loader_stall_late_ms", s.stall_late_ms},
          {"loader_busy_ms", s.busy_ms},
          {"cache_bytes", {{"device", s.cache_bytes[0]}, {"host", s.cache_bytes[1]}, {"disk", s.cache_bytes[2]}}},
          {"prompt_kv_bytes", s.window_bytes},
          {"memory_tokens", s.memory_tokens},
          {"prompt_tokens", s.prompt_tokens},
          {"store_ms", s.store_ms},
          {"decode_ms", s.decode_ms},
          {"compared_with_full", s.compared},
          {"kl_from_full", num_or_null(s.kl)},
          {"top1_agreement_with_full", num_or_null(s.agreement)},
          {"action_agreement_with_full", num_or_null(s.action_agreement)},
          {"action_agreement_with_full_wilson95",
           s.actions_compared ? nlohmann::json({s.action_lo, s.action_hi}) : nlohmann::json(nullptr)},
          {"corrupt_entries", s.corrupt}};
}

nlohmann::json to_json(const StepRecord& r) {
  return {{"episode", r.episode},
          {"step", r.step},
          {"policy", r.policy},
          {"action", r.action},
          {"oracle", r.oracle},
          {"valid", r.valid},
          {"match", r.match},
          {"ttft_ms", r.ttft_ms},
          {"store_ms", r.store_ms},
          {"decode_ms", r.decode_ms},
          {"recomputed_fraction", r.recomputed},
          {"prompt_tokens", r.prompt_tokens},
          {"memory_tokens", r.memory_tokens},
          {"prefilled_tokens", r.prefilled_tokens},
          {"units", r.units},
          {"misses", r.misses},
          {"corrupt", r.corrupt},
          {"loaded_tokens", {r.loaded[0], r.loaded[1], r.loaded[2]}},
          {"loader_idle_ms", r.idle_ms},
          {"loader_stall_ms", r.stall_ms},
          {"loader_busy_ms", r.busy_ms},
          {"kl_from_full", num_or_null(r.kl)},
          {"top1_agrees_with_full", std::isnan(r.agree) ? nlohmann::json(nullptr) : nlohmann::json(r.agree > 0.5)},
          {"action_same_as_full",
           std::isnan(r.same_action) ? nlohmann::json(nullptr) : nlohmann::json(r.same_action > 0.5)}};
}

std::string fmt(double v, const char* f = "%.2f") {
  if (std::isnan(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

void print_table(const std::vector<PolicySummary>& rows, bool model_driven, int n_layers,
                 const std::vector<std::string>& pair_with) {
  std::printf("\n%-17s %8s %16s %6s %9s %9s %9s %8s %9s %8s %7s %9s %9s %8s %9s %8s %8s %7s\n", "policy",
              model_driven ? "success" : "oracle", "Wilson 95%", "steps",
              "TTFT ms", "p50", "p90", "vs full", "warm ms", "vs full", "recomp", "host tok", "disk tok", "prefill",
              "KL full", "top-1", "same act", "KV MiB");
  for (const auto& s : rows) {
    const double kv_mib = (s.cache_bytes[0] + s.cache_bytes[1] + s.cache_bytes[2]) / 1048576.0;
    const std::string ok = model_driven ? fmt(100 * s.success, "%.1f%%")
                                        : fmt(s.steps ? 100.0 * s.match / s.steps : 0.0, "%.1f%%");
    const std::string ci = model_driven ? fmt(100 * s.lo, "%.1f") + " - " + fmt(100 * s.hi, "%.1f%%")
                                        : fmt(100 * s.agree_lo, "%.1f") + " - " + fmt(100 * s.agree_hi, "%.1f%%");
    std::printf("%-17s %8s %16s %6lld %9.1f %9.1f %9.1f %8s %9s %8s %6.1f%% %9.0f %9.0f %8.1f %9s %8s %8s %7.1f\n",
                s.policy.c_str(), ok.c_str(), ci.c_str(), static_cast<long long>(s.steps), s.ttft_mean, s.ttft_p50,
                s.ttft_p90, fmt(s.ttft_vs_full, "%.3fx").c_str(), fmt(s.warm_mean, "%.1f").c_str(),
                fmt(s.warm_vs_full, "%.3fx").c_str(), 100 * s.recomputed, s.loaded[1], s.loaded[2],
                s.prefilled, fmt(s.kl, "%.4f").c_str(), fmt(100 * s.agreement, "%.1f%%").c_str(),
                fmt(100 * s.action_agreement, "%.1f%%").c_str(), kv_mib);
  }
  std::printf("\n(warm: steps after each episode's first, whose cache starts empty; tokens loaded per step: token-layers over the layers; prefill: tokens of missing entries "
              "prefilled alone per step; KL and top-1: the first action token's distribution against "
              "full_recompute's on the same prompt; same act: the whole greedy action equal to full_recompute's "
              "on the same prompt; KV MiB: the cache's entries at the end, all tiers)\n");
  bool paired = false;
  for (const auto& s : rows) paired = paired || (s.lost >= 0 && s.policy != "full_recompute");
  if (paired) {
    std::printf("\nPaired with full_recompute (%s): right there and wrong here (lost), the reverse (won), "
                "McNemar's exact p\n",
                model_driven ? "per episode, success" : "per step, the oracle's action; the same prompts");
    std::printf("%-17s %7s %7s %9s\n", "policy", "lost", "won", "p");
    for (const auto& s : rows)
      if (s.lost >= 0 && s.policy != "full_recompute")
        std::printf("%-17s %7lld %7lld %9.3g\n", s.policy.c_str(), static_cast<long long>(s.lost),
                    static_cast<long long>(s.won), s.mcnemar_p);
  }
  for (const std::string& ref : pair_with) {
    if (ref == "full_recompute") continue;  // the table above
    std::printf("\nPaired with %s (%s): right there and wrong here (lost), the reverse (won), McNemar's exact p\n",
                ref.c_str(), model_driven ? "per episode, success" : "per step, the oracle's action; the same prompts");
    std::printf("%-17s %7s %7s %9s\n", "policy", "lost", "won", "p");
    for (const auto& s : rows) {
      const auto it = s.paired_with.find(ref);
      if (it == s.paired_with.end()) continue;
      std::printf("%-17s %7lld %7lld %9.3g\n", s.policy.c_str(), static_cast<long long>(it->second.lost),
                  static_cast<long long>(it->second.won), it->second.p);
    }
  }
  std::printf("\nLoader per layer (ms per step): idle while the model computes the layer / the model waiting\n");
  std::printf("%-17s", "policy");
  for (int l = 0; l < n_layers; ++l) std::printf(" %13s", wm::str_cat("layer ", l).c_str());
  std::printf(" %11s %11s %11s %11s\n", "idle early", "wait total", "wait late", "busy total");
  for (const auto& s : rows) {
    if (s.idle_per_layer.empty() || s.idle_ms + s.stall_ms == 0) continue;
    std::printf("%-17s", s.policy.c_str());
    for (int l = 0; l < n_layers; ++l) std::printf(" %6.2f/%6.2f", s.idle_per_layer[l], s.stall_per_layer[l]);
    std::printf(" %11.2f %11.2f %11.2f %11.2f\n", s.idle_early_ms, s.stall_ms, s.stall_late_ms, s.busy_ms);
  }
}

void write_csv(std::ostream& o, const std::vector<PolicySummary>& rows, bool model_driven) {
  o << "policy,episodes,successes,success_rate,wilson_lo,wilson_hi,steps,valid_actions,oracle_agreement,ttft_mean_ms,"
       "ttft_p50_ms,ttft_p90_ms,ttft_vs_full,warm_ttft_mean_ms,warm_ttft_vs_full,recomputed_fraction,prefilled_tokens_per_step,loaded_device,loaded_host,"
       "loaded_disk,loader_idle_early_ms,loader_idle_ms,loader_stall_ms,loader_stall_late_ms,loader_busy_ms,"
       "cache_bytes_device,"
       "cache_bytes_host,cache_bytes_disk,prompt_kv_bytes,kl_from_full,top1_agreement_with_full,memory_tokens,"
       "prompt_tokens,lost_vs_full,won_vs_full,mcnemar_p,action_agreement_with_full\n";
  auto num = [](double v) { return std::isnan(v) ? std::string() : wm::str_cat(v); };
  for (const auto& s : rows) {
    o << s.policy << "," << s.episodes << "," << s.successes << ","
      << (model_driven ? num(s.success) : "") << "," << (model_driven ? num(s.lo) : "") << ","
      << (model_driven ? num(s.hi) : "") << "," << s.steps << "," << (s.steps ? 1.0 * s.valid / s.steps : 0) << ","
      << (s.steps ? 1.0 * s.match / s.steps : 0) << "," << s.ttft_mean << "," << s.ttft_p50 << "," << s.ttft_p90
      << "," << num(s.ttft_vs_full) << "," << num(s.warm_mean) << "," << num(s.warm_vs_full) << "," << s.recomputed << "," << s.prefilled << "," << s.loaded[0] << ","
      << s.loaded[1] << "," << s.loaded[2] << "," << s.idle_early_ms << "," << s.idle_ms << "," << s.stall_ms << ","
      << s.stall_late_ms << "," << s.busy_ms << "," << s.cache_bytes[0] << "," << s.cache_bytes[1] << "," << s.cache_bytes[2] << ","
      << s.window_bytes << "," << num(s.kl) << "," << num(s.agreement) << "," << s.memory_tokens << ","
      << s.prompt_tokens << "," << (s.lost < 0 ? "" : wm::str_cat(s.lost)) << ","
      << (s.won < 0 ? "" : wm::str_cat(s.won)) << "," << num(s.mcnemar_p) << "," << num(s.action_agreement) << "\n";
  }
}

void write_plots(const std::string& dir, const std::vector<PolicySummary>& rows, const std::vector<Runner>& runners,
                 bool model_driven, int n_layers) {
  {
    std::vector<wm::rollout::Series> pts;
    for (const auto& s : rows) {
      const double y = model_driven ? 100 * s.success : (s.steps ? 100.0 * s.match / s.steps : 0.0);
      pts.push_back({s.policy, {{s.ttft_mean, y}}});  // one point: the chart draws it as a dot
    }
    wm::rollout::line_chart(dir + "/success_vs_ttft.png",
                            model_driven ? "success rate against TTFT, per policy"
                                         : "next-action agreement with the oracle against TTFT, per policy",
                            "mean TTFT per step (ms)", model_driven ? "success (%)" : "agreement (%)", pts);
  }
  {
    std::vector<wm::rollout::Series> pts;
    for (const auto& s : rows) {  // full_recompute agrees with itself (and keeps its colour in every chart)
      if (s.policy == "full_recompute") pts.push_back({s.policy, {{s.ttft_mean, 100.0}}});
      else if (!std::isnan(s.agreement)) pts.push_back({s.policy, {{s.ttft_mean, 100 * s.agreement}}});
    }
    if (pts.size() > 1)
      wm::rollout::line_chart(dir + "/agreement_vs_ttft.png",
                              "first action token: top-1 agreement with full_recompute against TTFT",
                              "mean TTFT per step (ms)", "top-1 agreement (%)", pts);
  }
  {
    std::vector<wm::rollout::Series> lines;
    for (const auto& r : runners) {
      std::map<int, std::vector<double>> by_step;
      for (const auto& st : r.steps) by_step[st.step].push_back(st.ttft_ms);
      wm::rollout::Series s{r.name, {}};
      for (const auto& [step, v] : by_step) s.points.push_back({static_cast<double>(step), mean(v)});
      lines.push_back(s);
    }
    wm::rollout::line_chart(dir + "/ttft_per_step.png", "TTFT per planning step (mean over episodes)",
                            "step", "TTFT (ms)", lines, /*log_y=*/true);
  }
  {
    std::vector<wm::rollout::Series> lines;
    for (const auto& s : rows) {
      if (s.idle_ms + s.stall_ms == 0) continue;
      wm::rollout::Series idle{s.policy + " idle", {}}, stall{s.policy + " wait", {}};
      for (int l = 0; l < n_layers; ++l) {
        idle.points.push_back({static_cast<double>(l), s.idle_per_layer[l]});
        stall.points.push_back({static_cast<double>(l), s.stall_per_layer[l]});
      }
      if (s.policy.rfind("keep", 0) == 0 || s.policy == "cacheblend") lines.push_back(idle), lines.push_back(stall);
    }
    if (!lines.empty() && n_layers > 1)
      wm::rollout::line_chart(dir + "/loader_per_layer.png",
                              "loader idle time and the model's wait for it, per layer (ms per step)", "layer",
                              "ms per step", lines);
  }
}

// A random-weight model from a config, or a model folder or GGUF file; under --chat, its chat
// template's frame into *texts.
wm::llm::LlmModel load_model(const Options& o, at::Device dev, std::string* name, PlanTexts* texts) {
  if (fs::is_directory(o.model) || wm::llm::is_gguf_file(o.model)) {
    if (o.layers > 0) throw wm::Error("--layers applies to a config.json (random weights), not a model folder or GGUF file");
    wm::llm::LlmSource src = wm::llm::open_llm(o.model, dev, at::kFloat);
    *name = src.name;
    if (o.chat) add_chat_frame(*texts, src);
    return src.model;
  }
  if (o.chat) throw wm::Error("--chat needs a model with a chat template: a GGUF file or a model folder, not a config.json");
  wm::llm::LlmConfig cfg = wm::llm::LlmConfig::load(o.model);
  if (o.layers > 0) cfg.num_hidden_layers = o.layers;
  wm::llm::check_fits_in_memory(static_cast<uint64_t>(wm::llm::llm_parameter_count(cfg)) * 4,
                                wm::str_cat("a model of ", o.model, " in float32"),
                                wm::str_cat(o.model, ": ", wm::llm::llm_size_fields(cfg),
                                            o.layers > 0 ? wm::str_cat("; --layers ", o.layers) : std::string()));
  // Drawn once, by init_weights (not first by the modules' own start as well).
  wm::llm::LlmModel m(cfg, wm::llm::ParamAlloc{wm::llm::ParamInit::Uninitialised, at::kFloat});
  m->init_weights(o.seed);
  m->to(dev, at::kFloat);
  *name = wm::str_cat(fs::path(o.model).stem().string(), " (random weights, ", cfg.num_hidden_layers, " layers)");
  return m;
}


// The embedded tiny model, looked for in the working directory, then above this program's folder.
std::string shipped_model() {
  std::string tried;
  const std::string model = wm::cli::find_shipped(kEmbeddedModel, &tried);
  if (model.empty())
    throw wm::Error(wm::str_cat("the embedded tiny LLM (", kEmbeddedModel, ") was not found; tried ", tried,
                                ": give --model"));
  return model;
}

// The output files and folder, opened before the work so that a bad path fails first; each is
// written whole or not at all.
struct Outputs {
  std::unique_ptr<wm::cli::OutputFile> json, csv;
  std::unique_ptr<wm::cli::OutputFolder> plots;
};

// Refuses outputs that name one another or one of the model's files, then opens them.
Outputs open_outputs(const Options& o) {
  const std::string model_files = fs::is_directory(o.model) ? o.model + "/" : "";
  wm::cli::require_distinct_outputs({{"--json", o.json_out}, {"--csv", o.csv_out}, {"--plots", o.plot_dir}},
                                    {{"--model", model_files.empty() ? o.model : ""},
                                     {"--tokenizer", o.tokenizer},
                                     {"the model's config.json", model_files.empty() ? "" : model_files + "config.json"},
                                     {"the model's tokenizer.json", model_files.empty() ? "" : model_files + "tokenizer.json"},
                                     {"the model's model.safetensors",
                                      model_files.empty() ? "" : model_files + "model.safetensors"}});
  Outputs out;
  if (!o.json_out.empty()) out.json = std::make_unique<wm::cli::OutputFile>(o.json_out);
  if (!o.csv_out.empty()) out.csv = std::make_unique<wm::cli::OutputFile>(o.csv_out);
  if (!o.plot_dir.empty()) out.plots = std::make_unique<wm::cli::OutputFolder>(o.plot_dir);
  return out;
}

// What the options' own checks cannot see: a policy named twice, --pair-with outside --policies,
// a host budget with the disk tier, the recompute settings together. Throws wm::Error.
void validate_options(const Options& o) {
  std::vector<std::string> seen;
  for (const auto& p : o.policies) {
    if (std::find(seen.begin(), seen.end(), p) != seen.end())
      throw wm::Error(wm::str_cat("--policies names '", p, "' twice"));
    seen.push_back(p);
  }
  for (const auto& p : o.pair_with)
    if (std::find(o.policies.begin(), o.policies.end(), p) == o.policies.end())
      throw wm::Error(wm::str_cat("--pair-with names '", p, "', which --policies does not run"));
  if (o.bank_host_mib > 0 && o.bank_tier == "disk")
    throw wm::Error("--bank-host-mib is for --bank-tier host (with disk every entry goes to spill files)");
  o.recompute.validate();
}

// The tokenizer: --tokenizer, else the model folder's, else (a config.json) the embedded model's,
// its path written back to o.tokenizer. Throws wm::Error when it has more ids than the model.
wm::llm::Tokenizer load_tokenizer(Options& o, const wm::llm::LlmModelImpl& model) {
  if (o.tokenizer.empty() && wm::llm::is_gguf_file(o.model)) {
    o.tokenizer = o.model;
    return wm::llm::open_llm_tokenizer(o.model);
  }
  if (o.tokenizer.empty()) {
    std::string tried;
    o.tokenizer = fs::is_directory(o.model) ? o.model + "/tokenizer.json"
                                            : wm::cli::find_shipped(std::string(kEmbeddedModel) + "/tokenizer.json", &tried);
    if (o.tokenizer.empty())
      throw wm::Error(wm::str_cat("the embedded model's tokenizer (for a config.json) was not found; tried ", tried,
                                  ": give --tokenizer"));
  }
  wm::llm::Tokenizer tok = wm::llm::Tokenizer::load(o.tokenizer);
  if (tok.vocab_size() > model.config().vocab_size)
    throw wm::Error(wm::str_cat("the tokenizer has ", tok.vocab_size(), " ids, the model's vocabulary ",
                                model.config().vocab_size));
  return tok;
}

// Every --check-layers layer has a layer after it in a model of n_layers layers.
void check_layers_fit(const Options& o, int n_layers) {
  for (int c : o.recompute.check_layers)
    if (c >= n_layers - 1)
      throw wm::Error(wm::str_cat("--check-layers ", c, ": the model has ", n_layers,
                                  " layers, and a check layer is one of 0..", n_layers - 2,
                                  " (the last layer has none after it to recompute)"));
}

// This run's own spill folder inside --spill-dir (or $TMPDIR), after a warning about what earlier
// runs left in --spill-dir.
std::unique_ptr<wm::cli::RunFolder> make_spill_folder(const Options& o) {
  const std::string parent = o.spill_dir.empty() ? fs::temp_directory_path().string() : o.spill_dir;
  if (!o.spill_dir.empty()) {
    const std::string stale = wm::cli::leftover_report(parent, "wm_plan_bench");
    if (!stale.empty()) std::fprintf(stderr, "wm_plan_bench: warning: --spill-dir %s\n", stale.c_str());
  }
  return std::make_unique<wm::cli::RunFolder>(parent, "wm_plan_bench", "--spill-dir");
}

// Appends a runner per --policies name: its chunk cache (spilling to a folder of its own in
// `spill`: the store names files by block id), its policy and its KV window.
void add_runners(std::vector<Runner>& runners, const Options& o, const wm::llm::LlmModel& model, uint64_t model_key,
                 at::Device dev, wm::cli::RunFolder& spill, const std::shared_ptr<wm::RemoteStore>& remote) {
  for (const auto& name : o.policies) {
    Runner r;
    r.name = name;
    wm::llm::ChunkCacheConfig cc;
    cc.model_key = model_key;
    cc.prefill_chunk = o.prefill_chunk;
    cc.store.device_budget = 0;  // on the CPU the device is the host: entries sit in the host tier
    cc.store.host_budget = o.bank_tier == "disk" ? 0
                           : o.bank_host_mib > 0 ? static_cast<size_t>(o.bank_host_mib * 1048576.0)
                                                 : std::numeric_limits<size_t>::max();
    cc.store.spill_dir = spill.subfolder(name);
    cc.store.drop_spill_pages = o.cold_disk;
    cc.store.remote = remote;
    r.cache = std::make_unique<wm::llm::ChunkCache>(model, cc);
    wm::llm::RecomputeConfig rcfg = o.recompute;
    rcfg.policy = name;
    r.policy = wm::llm::make_recompute_policy(rcfg);
    r.window = std::make_unique<wm::KvWindow>(model->kv_spec(dev, at::kFloat), std::vector<std::string>{"recent"});
    runners.push_back(std::move(r));
  }
}

// What every step of a run shares.
struct Bench {
  const Options& o;
  wm::llm::LlmModelImpl& model;
  const wm::llm::Tokenizer& tok;
  PlanTexts texts;
  wm::llm::ReuseOptions reuse;
  int n_layers = 0;
  bool model_driven = true;
  std::string model_name;
  int threads = 0;
  std::shared_ptr<const lt::ProseCorpus> prose;  // --memory-text prose; else null
};

// The progress line and the counts it shows.
struct Progress {
  wm::cli::ProgressLine line{15};
  Clock::time_point t_start = Clock::now();
  int64_t step_total = 0;
};

// full_recompute's answer at the current step: the first action token's log-probabilities and the
// prompt they came from (undefined until it has run).
struct Reference {
  at::Tensor lp;
  std::vector<int64_t> ids;
  std::string action;  // its greedy action
};

// The order in which the policies take step `step`: full_recompute first when present (its answer
// is the reference), the others rotating so that none is always first.
std::vector<size_t> turn_order(const std::vector<Runner>& runners, int step) {
  std::vector<size_t> order;
  for (size_t i = 0; i < runners.size(); ++i)
    if (runners[i].name == "full_recompute") order.push_back(i);
  for (size_t i = 0; i < runners.size(); ++i) {
    const size_t j = (i + static_cast<size_t>(step)) % runners.size();
    if (runners[j].name != "full_recompute") order.push_back(j);
  }
  return order;
}

// A step's record as the prefill's statistics leave it (the action, oracle and fidelity unset).
StepRecord record_of(const wm::llm::ReuseResult& res, int n_layers) {
  StepRecord rec;
  rec.ttft_ms = 1000 * res.stats.ttft_s;
  rec.store_ms = 1000 * res.stats.store_s;
  rec.recomputed = res.stats.recomputed_fraction();
  rec.prompt_tokens = res.stats.prompt_tokens;
  rec.memory_tokens = res.stats.memory_tokens;
  rec.prefilled_tokens = res.stats.prefilled_tokens;
  rec.units = res.stats.units;
  rec.misses = res.stats.misses;
  rec.corrupt = res.stats.corrupt;
  for (int t = 0; t < 3; ++t) rec.loaded[t] = static_cast<double>(res.stats.loaded_token_layers[t]) / n_layers;
  for (double v : res.stats.loader_idle_s) rec.idle_ms.push_back(1000 * v);
  for (double v : res.stats.loader_stall_s) rec.stall_ms.push_back(1000 * v);
  for (double v : res.stats.loader_busy_s) rec.busy_ms += 1000 * v;
  if (rec.idle_ms.empty()) rec.idle_ms.assign(n_layers, 0.0), rec.stall_ms.assign(n_layers, 0.0);
  return rec;
}

// One policy's turn at step `step` of episode `episode`: the prompt from its own world and past
// (--driver model) or the oracle's course, the prefill with reuse, the first action token against
// full_recompute's (`full`, which full_recompute's turn sets), the greedy action scored against the
// oracle's and, under --driver model, executed in the policy's world. Appends the step's record.
void take_turn(const Bench& b, Runner& r, const Episode& ep, int episode, int step, const lt::World& course,
               const std::vector<std::string>& course_past, Reference& full) {
  const lt::World& state = b.model_driven ? r.world : course;
  const std::vector<std::string>& past = b.model_driven ? r.past : course_past;
  const std::vector<PromptSegment> prompt = make_prompt(b.texts, state, ep, past, b.tok);
  std::vector<int64_t> ids;
  for (const auto& s : prompt) ids.insert(ids.end(), s.ids.begin(), s.ids.end());
  const wm::llm::ReuseResult res = wm::llm::prefill_with_reuse(*r.cache, *r.policy, prompt, *r.window, b.reuse);
  StepRecord rec = record_of(res, b.n_layers);
  rec.episode = episode;
  rec.step = step;
  rec.policy = r.name;
  const at::Tensor lp = log_probs(res.logits, b.tok.vocab_size());
  const bool is_full = r.name == "full_recompute", vs_full = !is_full && full.lp.defined() && full.ids == ids;
  if (is_full) {
    full.lp = lp;
    full.ids = ids;
  } else if (vs_full) {
    rec.kl = (full.lp.exp() * (full.lp - lp)).sum().item<double>();
    rec.agree = full.lp.argmax().item<int64_t>() == lp.argmax().item<int64_t>() ? 1.0 : 0.0;
  }
  r.window_bytes = std::max(r.window_bytes, r.window->bytes_used());
  const auto t_dec = Clock::now();
  rec.action = decode_action(b.model, b.tok, *r.window, res.logits, res.stats.prompt_tokens, b.o.max_new_tokens,
                             b.texts.stop);
  rec.decode_ms = 1000 * since(t_dec);
  if (is_full) full.action = rec.action;
  if (vs_full) rec.same_action = rec.action == full.action ? 1.0 : 0.0;
  rec.oracle = state.oracle_next_action(ep.goal);
  rec.match = rec.action == rec.oracle;
  lt::World probe = state;
  rec.valid = probe.execute(rec.action);
  if (b.model_driven) {
    if (rec.valid) r.world = std::move(probe);
    r.past.push_back(rec.action);
    if (r.world.goal_done(ep.goal)) r.done = r.success = true;
    if (step == b.o.max_steps) r.done = true;
  }
  for (int t = 0; t < 3; ++t) r.peak_bytes[t] = std::max(r.peak_bytes[t], r.cache->bytes(static_cast<wm::Tier>(t)));
  r.steps.push_back(std::move(rec));
}

// Held-out episode e (counted from --first-episode) with every policy, step by step in turn, each
// in its own world (--driver model) or all on the oracle's course. Returns the episode's
// description for the JSON.
nlohmann::json run_episode(const Bench& b, std::vector<Runner>& runners, int e, Progress& progress) {
  const Options& o = b.o;
  const Episode ep = make_episode(o.first_episode + e, o, b.tok, b.prose.get());
  nlohmann::json description = {{"index", o.first_episode + e},
                                {"seed", ep.seed},
                                {"goal", ep.goal.text()},
                                {"oracle_steps", ep.solution.size()},
                                {"memory_lines", ep.world.names().size()},
                                {"memory_tokens", ep.memory_tokens}};
  if (b.prose)
    description["notes"] = {{"split", lt::prose_split_name(ep.notes.split)},
                            {"first_paragraph", ep.notes.first},
                            {"paragraphs", ep.notes.paragraphs.size()},
                            {"tokens", ep.notes.tokens}};
  lt::World course = ep.world;  // the oracle's course (driver oracle)
  std::vector<std::string> course_past;
  for (auto& r : runners) {
    r.world = ep.world;
    r.past.clear();
    r.done = r.success = false;
    r.policy->reset();
    r.episodes += 1;
  }
  for (int step = 1; step <= o.max_steps; ++step) {
    const std::string oracle_course = b.model_driven ? "" : course.oracle_next_action(ep.goal);
    if (!b.model_driven && oracle_course.empty()) break;  // the oracle's plan is done
    Reference full;
    for (size_t idx : turn_order(runners, step)) {
      Runner& r = runners[idx];
      if (r.done) continue;
      take_turn(b, r, ep, o.first_episode + e, step, course, course_past, full);
      ++progress.step_total;
      progress.line.show(false, "wm_plan_bench: episode %d/%d, step %d, %s; %lld prompts, %.0f s", e + 1, o.episodes,
                         step, r.name.c_str(), static_cast<long long>(progress.step_total), since(progress.t_start));
    }
    if (!b.model_driven) {
      std::string err;
      WM_CHECK(course.execute(oracle_course, &err), "the oracle's action '", oracle_course, "' failed: ", err);
      course_past.push_back(oracle_course);
    }
    bool all_done = true;
    for (const auto& r : runners) all_done = all_done && r.done;
    if (b.model_driven && all_done) break;
  }
  if (b.model_driven)
    for (auto& r : runners) r.successes += r.success, r.outcomes.push_back(r.success);
  return description;
}

// Every episode, with a progress line on stderr. Returns the episodes' descriptions.
nlohmann::json run_episodes(const Bench& b, std::vector<Runner>& runners) {
  Progress progress;
  nlohmann::json episodes = nlohmann::json::array();
  for (int e = 0; e < b.o.episodes; ++e) episodes.push_back(run_episode(b, runners, e, progress));
  progress.line.show(true, "wm_plan_bench: %d episodes, %lld prompts, %.0f s", b.o.episodes,
                     static_cast<long long>(progress.step_total), since(progress.t_start));
  progress.line.finish();
  return episodes;
}

// A summary row per runner, TTFT against full_recompute's when it ran, paired with full_recompute
// and with --pair-with's policies.
std::vector<PolicySummary> summarize_all(const std::vector<Runner>& runners, int n_layers, bool model_driven,
                                         const std::vector<std::string>& pair_with) {
  double full_ttft = 0, full_warm = 0;
  for (const auto& r : runners)
    if (r.name == "full_recompute") {
      const PolicySummary f = summarize(r, n_layers, 0, 0);
      full_ttft = f.ttft_mean;
      full_warm = std::isnan(f.warm_mean) ? 0.0 : f.warm_mean;
    }
  std::vector<PolicySummary> rows;
  for (const auto& r : runners) rows.push_back(summarize(r, n_layers, full_ttft, full_warm));
  pair_rows(rows, runners, model_driven, pair_with);
  return rows;
}

// The report on stdout: a title line, the tables, and the damaged cache entries found.
void print_report(const Bench& b, const std::vector<PolicySummary>& rows, const std::vector<Runner>& runners,
                  const wm::RemoteStore* remote) {
  const Options& o = b.o;
  std::printf("wm_plan_bench: %s, %d held-out episodes from %d (%s split), driver %s, memory %.0f tokens on average, "
              "bank %s%s\n",
              b.model_name.c_str(), o.episodes, o.first_episode,
              lt::heldout_split(static_cast<uint64_t>(o.first_episode), static_cast<uint64_t>(o.episodes)),
              o.driver.c_str(),
              rows.empty() ? 0.0 : rows[0].memory_tokens, o.bank_tier.c_str(), o.cold_disk ? " (cold)" : "");
  if (b.prose)
    std::printf("memory: the house's lines and paragraphs of %s (%s files) between them%s\n", b.prose->source().c_str(),
                lt::prose_split_name(lt::prose_split_of(lt::heldout_seed(static_cast<uint64_t>(o.first_episode)))),
                o.chat ? "; prompts in the model's chat template" : "");
  else if (o.chat)
    std::printf("prompts in the model's chat template\n");
  print_table(rows, b.model_driven, b.n_layers, o.pair_with);
  for (const auto& r : runners)
    for (const auto& msg : r.cache->corrupt_reports())
      std::printf("%s: damaged cache entry reported and recomputed: %s\n", r.name.c_str(), msg.c_str());
  if (remote != nullptr) {
    const wm::RemoteStats s = remote->stats();
    int64_t hits = 0, misses = 0;
    for (const auto& r : runners) hits += r.cache->stats().remote_hits, misses += r.cache->stats().remote_misses;
    std::printf("kv store %s: %lld entries brought in, %lld looked for and not found; %lld values read (%.1f MiB), "
                "%lld written (%.1f MiB), %lld writes failed or dropped; %lld damaged and %lld foreign values not used; "
                "%lld outages, %lld operations past the deadline\n",
                remote->endpoint().url.c_str(), static_cast<long long>(hits), static_cast<long long>(misses),
                static_cast<long long>(s.hits), s.get_bytes / 1048576.0, static_cast<long long>(s.puts),
                s.put_bytes / 1048576.0, static_cast<long long>(s.put_failed + s.dropped),
                static_cast<long long>(s.corrupt), static_cast<long long>(s.foreign), static_cast<long long>(s.outages),
                static_cast<long long>(s.deadline));
  }
}

// The run's settings, as the JSON's "config".
nlohmann::json config_json(const Bench& b) {
  const Options& o = b.o;
  return {{"model", o.model},
          {"model_name", b.model_name},
          {"layers", b.n_layers},
          {"tokenizer", o.tokenizer},
          {"driver", o.driver},
          {"episodes", o.episodes},
          {"first_episode", o.first_episode},
          {"split", lt::heldout_split(static_cast<uint64_t>(o.first_episode), static_cast<uint64_t>(o.episodes))},
          {"max_steps", o.max_steps},
          {"memory_tokens", o.memory_tokens},
          {"memory_text", o.memory_text},
          {"prose_source", b.prose ? nlohmann::json(b.prose->source()) : nlohmann::json(nullptr)},
          {"chat", o.chat},
          {"layout", o.layout},
          {"rooms", o.rooms},
          {"locks", o.locks},
          {"objects", o.objects},
          {"ratio", o.recompute.ratio},
          {"static_after", o.recompute.static_after},
          {"group_similarity", o.recompute.group_similarity},
          {"bank_tier", o.bank_tier},
          {"cold_disk", o.cold_disk},
          {"load_mib_per_s", o.load_mib_per_s},
          {"check_layers", o.recompute.check_layers},
          {"check_ratios", o.recompute.check_ratios},
          {"head_tokens", o.recompute.head_tokens},
          {"pair_with", o.pair_with},
          {"kv_store", o.kv_store.url},
          {"threads", b.threads}};
}

// Writes and commits the outputs asked for: the CSV table, the charts, the JSON (settings,
// episodes, summary, every step).
void write_outputs(Outputs& out, const Bench& b, const std::vector<PolicySummary>& rows,
                   const std::vector<Runner>& runners, const nlohmann::json& episodes, const wm::RemoteStore* remote) {
  if (out.csv) {
    write_csv(out.csv->stream(), rows, b.model_driven);
    out.csv->commit();
  }
  if (out.plots) {
    write_plots(out.plots->staging(), rows, runners, b.model_driven, b.n_layers);
    out.plots->commit();
  }
  if (out.json) {
    nlohmann::json summary = nlohmann::json::array(), steps = nlohmann::json::array();
    for (const auto& s : rows) summary.push_back(to_json(s, b.model_driven));
    for (const auto& r : runners)
      for (const auto& st : r.steps) steps.push_back(to_json(st));
    nlohmann::json caches = nlohmann::json::object();
    for (const auto& r : runners) {
      const auto& cs = r.cache->stats();
      caches[r.name] = {{"hits", cs.hits},       {"misses", cs.misses},           {"stored", cs.stored},
                        {"prefilled_tokens", cs.prefilled_tokens}, {"corrupt", cs.corrupt},
                        {"remote_hits", cs.remote_hits}, {"remote_misses", cs.remote_misses}};
    }
    nlohmann::json doc{{"config", config_json(b)}, {"episodes", episodes}, {"summary", summary},
                       {"caches", caches},         {"steps", steps}};
    if (remote != nullptr) doc["kv_store"] = remote->stats_json();
    out.json->stream() << doc
                              .dump(1, ' ', false, nlohmann::json::error_handler_t::replace)
                       << "\n";
    out.json->commit();
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_plan_bench: an embodied planner reusing its memory's KV across prompts under recompute policies "
               "(full_recompute, prefix_cache, full_reuse, cacheblend, keep and keep's ablations): success, TTFT, "
               "recomputed share, loading per tier and per layer, KV bytes, fidelity to full_recompute"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  const bool model_given = app.count("--model") > 0;

  // Spill files live in a folder this run makes for itself (never a folder the user named: a
  // cleanup removes what is in it), declared before the runners so that their stores are gone
  // first.
  std::unique_ptr<wm::cli::RunFolder> spill;
  std::shared_ptr<wm::RemoteStore> remote;
  std::vector<Runner> runners;
  int rc = 0;
  try {
    if (!model_given) o.model = shipped_model();
    Outputs out = open_outputs(o);
    validate_options(o);
    const std::shared_ptr<const lt::ProseCorpus> prose =
        o.memory_text == "prose" ? lt::default_prose_corpus() : nullptr;  // a missing handbook fails first
    const int threads = wm::init_threads(o.threads);
    const at::Device dev = wm::parse_device(o.device);
    std::string model_name;
    PlanTexts texts = plan_texts(o.layout);
    wm::llm::LlmModel model = load_model(o, dev, &model_name, &texts);
    model->eval();
    const wm::llm::Tokenizer tok = load_tokenizer(o, *model);
    torch::NoGradGuard ng;
    const int L = static_cast<int>(model->config().num_hidden_layers);
    check_layers_fit(o, L);
    const uint64_t model_key = wm::llm::model_fingerprint(*model);
    spill = make_spill_folder(o);
    remote = wm::cli::open_kv_store(o.kv_store, wm::llm::key_hex(model_key));
    add_runners(runners, o, model, model_key, dev, *spill, remote);
    wm::llm::ReuseOptions reuse;
    reuse.load_bytes_per_s = o.load_mib_per_s * 1048576.0;
    const Bench b{o, *model, tok, std::move(texts), reuse, L, o.driver == "model", model_name, threads, prose};

    std::fprintf(stderr, "wm_plan_bench: %s on %s, %d threads; %zu policies, %d episodes (driver %s), memory ~%lld "
                 "tokens, bank %s%s\n",
                 model_name.c_str(), wm::describe_device(dev).c_str(), threads, runners.size(), o.episodes,
                 o.driver.c_str(), static_cast<long long>(o.memory_tokens), o.bank_tier.c_str(),
                 o.cold_disk ? " (cold)" : "");
    const nlohmann::json episodes = run_episodes(b, runners);
    const std::vector<PolicySummary> rows = summarize_all(runners, L, b.model_driven, o.pair_with);
    if (remote) remote->flush(remote->config().flush_ms);  // the counters include every write
    print_report(b, rows, runners, remote.get());
    write_outputs(out, b, rows, runners, episodes, remote.get());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_plan_bench: error: %s\n", wm::cli::error_text(e).c_str());
    rc = 1;
  } catch (...) {
    std::fprintf(stderr, "wm_plan_bench: error: an unknown failure\n");
    rc = 1;
  }
  runners.clear();  // the caches' stores remove their spill files
  spill.reset();    // then this run's spill folder, and the parents it made
  return rc;
}

}  // namespace wm_tool_plan_bench
