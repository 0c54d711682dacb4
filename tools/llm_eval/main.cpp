// wm_llm_eval: accuracy of a model on the text tasks, held-out seeds, with the full KV cache:
// per task and context length, the fraction of answers that greedy decoding reproduces exactly.
#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "llmkv/hf_folder.h"
#include "llmkv/model.h"
#include "llmkv/tokenizer.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/window.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/progress.h"
#include "tools/llm_tasks/sample.h"
#include "tools/llm_train/data.h"

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_llm_eval: task accuracy of a model on held-out seeds with the full KV cache"};
  std::string model_dir = kEmbeddedModel, json_out, device = "auto";
  std::vector<std::string> tasks;
  std::vector<int64_t> contexts = {128, 256};  // the embedded model's training range (its model card)
  int64_t samples = 50, prefill_chunk = 512;
  int threads = 0;
  app.add_option("-m,--model", model_dir, "model folder")->capture_default_str();
  app.add_option("--tasks", tasks, "tasks (default: all)")->check(CLI::IsMember(wm::llmtasks::task_names()));
  app.add_option("--contexts", contexts, "context lengths in tokens")->capture_default_str()
      ->check(CLI::Range(wm::llmtasks::kMinTargetTokens, int64_t{1} << 20));
  app.add_option("--samples", samples, "held-out samples per task and context")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  app.add_option("--prefill-chunk", prefill_chunk, "tokens per forward pass")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--json", json_out, "write the results as JSON to this file");
  app.add_option("--device", device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();

  try {
    std::unique_ptr<wm::cli::OutputFile> json_file;  // opened first: a bad path fails before the work
    if (!json_out.empty()) json_file = std::make_unique<wm::cli::OutputFile>(json_out);
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
    auto counter = wm::llmdata::token_counter(tok);
    torch::NoGradGuard ng;

    nlohmann::json results = nlohmann::json::array();
    wm::cli::ProgressLine progress(15);
    const int64_t total = static_cast<int64_t>(tasks.size() * contexts.size()) * samples;
    int64_t done = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t ctx : contexts) {
      for (const auto& task : tasks) {
        int64_t correct = 0, answers = 0, tokens = 0, samples_right = 0;
        for (int64_t i = 0; i < samples; ++i) {
          wm::llmtasks::GenOptions go;
          go.target_tokens = ctx;
          go.count = counter;
          const auto s = wm::llmdata::tokenize(
              wm::llmtasks::make_sample(task, wm::llmtasks::heldout_seed(static_cast<uint64_t>(i)), go), tok);
          // The full cache: the whole sample prefilled through the window in chunks, every
          // position's logits kept; an answer is right when greedy decoding reproduces it.
          wm::KvWindow window(model->kv_spec(dev), {"recent"}, static_cast<int64_t>(s.ids.size()));
          std::vector<int64_t> arg;
          at::Tensor ids = at::tensor(s.ids, at::kLong);
          const int64_t n = ids.size(0);
          wm::llm::StepOptions so;
          so.all_logits = true;
          for (int64_t b = 0; b < n; b += prefill_chunk) {
            const int64_t c = std::min(prefill_chunk, n - b);
            at::Tensor am = model->step(ids.narrow(0, b, c).to(dev), at::arange(b, b + c, at::kLong), window, so)
                                .logits.argmax(-1).to(at::kCPU);
            arg.insert(arg.end(), am.data_ptr<int64_t>(), am.data_ptr<int64_t>() + am.numel());
          }
          bool all = true;
          for (const auto& a : s.answers) {
            const bool ok = wm::llmdata::answer_correct(s.ids, arg, a);
            correct += ok;
            all = all && ok;
            ++answers;
          }
          samples_right += all;
          tokens += n;
          ++done;
          const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          progress.show(done == total, "wm_llm_eval: %lld/%lld samples (%s at %lld tokens), %.0f s",
                        static_cast<long long>(done), static_cast<long long>(total), task.c_str(),
                        static_cast<long long>(ctx), el);
        }
        const auto [lo, hi] = wilson(correct, answers);
        results.push_back({{"task", task},
                           {"context", ctx},
                           {"samples", samples},
                           {"answers", answers},
                           {"accuracy", answers ? static_cast<double>(correct) / answers : 0.0},
                           {"wilson95", {lo, hi}},
                           {"samples_all_right", static_cast<double>(samples_right) / samples},
                           {"mean_tokens", static_cast<double>(tokens) / samples}});
      }
    }
    progress.finish();
    std::printf("%-10s %8s %8s %9s %17s %10s\n", "task", "context", "answers", "accuracy", "Wilson 95%", "tokens");
    for (const auto& r : results)
      std::printf("%-10s %8lld %8lld %8.1f%% %7.1f - %5.1f%% %10.0f\n", r["task"].get<std::string>().c_str(),
                  static_cast<long long>(r["context"].get<int64_t>()), static_cast<long long>(r["answers"].get<int64_t>()),
                  100 * r["accuracy"].get<double>(), 100 * r["wilson95"][0].get<double>(),
                  100 * r["wilson95"][1].get<double>(), r["mean_tokens"].get<double>());
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
