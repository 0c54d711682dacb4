// wm_bench_llm: prefill and decode throughput of decoders over the KV window, and the window's
// bytes, at several context lengths. A model is a folder (its weights) or a config.json (random
// weights at that shape, e.g. configs/qwen2-0.5b.json). Then, per model, EVOKE's trade: a block
// of --bank-block tokens moved out of the window into the bank (host memory, and disk) and
// spliced back re-anchored, against computing it again.
//   wm_bench_llm --model assets/models/tiny-llm --model configs/qwen2-0.5b.json --contexts 1024 4096 16384
// --profile: where a decode step's time goes, by op kind, against a STREAM-like bandwidth figure.
// --kernels: the linear layers' kernels alone on SmolLM2-135M's shapes (GGUF blocks, float32, int8).
#include <CLI/CLI.hpp>
#include <unistd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <map>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmkv/config.h"
#include "llmkv/gemv.h"
#include "llmkv/hf_folder.h"
#include "llmkv/model.h"
#include "llmkv/model_source.h"
#include "llmkv/quant_gemv.h"
#include "llmkv/session.h"
#include "llmkv/tokenizer.h"
#include "runtime/block_store.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/window.h"
#include "llmkv/weight_shapes.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/distinct_outputs.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/run_folder.h"
#include "tools/cli/shipped_path.h"
#include "tools/cli/validators.h"
#include "tools/bench_llm/bandwidth.h"
#include "tools/bench_llm/kernels.h"
#include "tools/bench_llm/profile.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_bench_llm {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
void sync(const at::Tensor& t) { (void)t.sum().item<double>(); }  // waits for queued device work

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct BankFigures {
  double save_ms = 0, load_ms = 0, recompute_ms = 0;  // medians over the repetitions
  size_t block_bytes = 0;
};

// Runs the prompt ids [n] through the model into `window` in forward passes of `chunk` tokens at
// positions 0..n-1; returns the last pass's logits (not waited for).
at::Tensor prefill(wm::llm::LlmModelImpl& model, const at::Tensor& ids, int64_t chunk, at::Device dev,
                   wm::KvWindow& window, const wm::llm::StepOptions& so) {
  const int64_t n = ids.size(0);
  at::Tensor logits;
  for (int64_t b = 0; b < n; b += chunk) {
    const int64_t c = std::min(chunk, n - b);
    logits = model.step(ids.narrow(0, b, c).to(dev), at::arange(b, b + c, at::kLong), window, so).logits;
  }
  return logits;
}

// A block of n tokens: computed into the window (in prefill chunks, nothing before it: the
// cheapest recompute there is), moved out into a bank tier (save), brought back into the window
// moved by n positions, keys rotated (load). Repetitions interleave the three; the first is a
// warm-up and not counted.
BankFigures bench_bank(wm::llm::LlmModelImpl& model, at::Device dev, at::ScalarType dt, int64_t n,
                       int64_t prefill_chunk, wm::Tier tier, int reps, uint64_t seed) {
  const auto& cfg = model.config();
  at::manual_seed(seed);
  const at::Tensor ids = at::randint(0, cfg.vocab_size, {n}, at::kLong);
  wm::StoreConfig sc;
  sc.device = dev;
  sc.device_budget = 0;
  // Disk: spill files in a folder of this run's own under $TMPDIR, gone at the end and on a signal.
  std::unique_ptr<wm::cli::RunFolder> spill;
  if (tier == wm::Tier::Disk) {
    sc.host_budget = 0;
    spill = std::make_unique<wm::cli::RunFolder>(std::filesystem::temp_directory_path().string(), "wm_bench_llm_bank",
                                                 "the bank's spill folder");
    sc.spill_dir = spill->path();
  }
  std::vector<double> save, load, recompute;
  size_t bytes = 0;
  {
    wm::BlockStore bank(sc);
    wm::KvWindow window(model.kv_spec(dev, dt), {"blocks"}, 2 * n);
    wm::llm::StepOptions so;
    so.region = "blocks";
    so.segment = "file:block#0";
    for (int r = 0; r <= reps; ++r) {
      window.clear();
      auto t0 = Clock::now();
      sync(prefill(model, ids, prefill_chunk, dev, window, so));
      const double rc = 1000.0 * seconds_since(t0);
      t0 = Clock::now();
      wm::Block blk = window.remove(so.segment);
      bytes = blk.nbytes();
      bank.put(std::move(blk), tier);
      const double sv = 1000.0 * seconds_since(t0);
      t0 = Clock::now();
      window.place("blocks", bank.get(so.segment), wm::Reanchor{0, n});
      sync(window.k(cfg.num_hidden_layers - 1));
      const double ld = 1000.0 * seconds_since(t0);
      bank.erase(so.segment);
      if (r > 0) recompute.push_back(rc), save.push_back(sv), load.push_back(ld);
    }
  }
  return {median(save), median(load), median(recompute), bytes};
}

// The command line's settings, with their defaults.
struct Options {
  std::vector<std::string> models = {"assets/models/tiny-llm", "configs/qwen2-0.5b.json"};
  std::vector<int64_t> contexts = {1024, 4096, 16384};
  int64_t decode_tokens = 32, prefill_chunk = 512, bank_block = 1280;
  int bank_reps = 3;
  std::vector<std::string> policies;
  double policy_share = 0.1;
  int64_t evict_slack = 0;
  std::string device = "auto", dtype = "float32", json_out;
  std::string kv_dtype;          // --kv-dtype (empty: --dtype)
  std::string weights = "float";  // --weights: float (in --dtype), int8, or stored (GGUF blocks)
  std::string quant_acts = "q8";  // --quant-activations
  std::string gemv = "auto";      // --gemv: the decode kernels
  int threads = 0;
  uint64_t seed = 0;
  bool bandwidth = false, profile = false;  // --bandwidth, --profile
  int profile_steps = 4;
  bool models_given = false, budget_given = false;  // --model, --policy-budget on the command line
  std::vector<int64_t> streams;   // --streams: parallel decoding figures (empty: none)
  int64_t stream_context = 256;   // each stream's prompt
  int stream_reps = 3;
  bool kernels = false;           // --kernels: the kernel figures instead of the models'
  wm::bench::KernelBenchOptions kernel;
};

// Every option, in the order --help lists them.
void add_options(CLI::App& app, Options& o) {
  app.add_option("-m,--model", o.models,
                 "model folder, or a config.json for random weights (repeatable; the defaults are "
                 "looked for in the working directory, then above this program's folder)")
      ->capture_default_str()
      ->check(CLI::ExistingPath);
  app.add_option("--contexts", o.contexts, "context lengths (prompt tokens)")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 22));
  app.add_option("--decode-tokens", o.decode_tokens, "tokens decoded after each prefill")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--prefill-chunk", o.prefill_chunk, "prompt tokens per forward pass")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 22));
  app.add_option("--bank-block", o.bank_block,
                 "tokens of the block saved to the bank and loaded back against recomputing it (0: skip)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 22));
  app.add_option("--bank-reps", o.bank_reps, "repetitions of the bank figures (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--policies", o.policies,
                 "also decode under these memory policies, each against the full cache in the same run (models "
                 "with a tokenizer.json only)")
      ->check(CLI::IsMember(wm::llm::text_policy_names()));
  app.add_option("--streams", o.streams,
                 "also decode this many streams together (continuous batching's step), e.g. 1 4 8: aggregate "
                 "tokens/s against one stream")
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--stream-context", o.stream_context, "each stream's prompt (tokens) for --streams")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--stream-reps", o.stream_reps, "rounds of the --streams figures (after one warm-up round)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--policy-budget", o.policy_share, "the policies' KV budget as a share of the context")
      ->capture_default_str()
      ->check(wm::cli::FiniteRange(1e-3, 1.0));
  app.add_option("--evict-slack", o.evict_slack,
                 "the policies cut a layer over budget to budget - slack (eviction every slack + 1 steps)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 22));
  app.add_option("--device", o.device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  app.add_option("--dtype", o.dtype, "float32, bfloat16, float16")->capture_default_str();
  app.add_option("--kv-dtype", o.kv_dtype, "K/V cache dtype: float32, bfloat16, float16 (default: --dtype); attention accumulates in float32")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  app.add_option("--weights", o.weights,
                 "float: the projections in --dtype (a GGUF file's decoded); int8: quantised at load (a float32 scale "
                 "per 32 inputs; CPU); stored: a GGUF file's quantized blocks as stored (CPU, float32; llmkv/quant_gemv.h)")
      ->capture_default_str()
      ->check(CLI::IsMember({"float", "int8", "stored"}));
  app.add_option("--quant-activations", o.quant_acts,
                 "--weights stored: q8 (activations rounded to 8 bits as llama.cpp does) or float")
      ->capture_default_str()
      ->check(CLI::IsMember({"q8", "float"}));
  app.add_option("--gemv", o.gemv, "decode-sized products: auto (the best the CPU has), avx512, avx2, scalar, or libtorch (at::linear)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "avx512", "avx2", "scalar", "libtorch"}));
  app.add_option("--seed", o.seed, "random weights and token ids")->capture_default_str()->check(wm::cli::Uint64());
  app.add_option("--json", o.json_out, "also write the figures as JSON to this file");
  app.add_option("--threads", o.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--bandwidth", o.bandwidth, "measure the host memory bandwidth first (STREAM-like read, copy and triad)");
  app.add_flag("--profile", o.profile,
               "after each context's decode, time --profile-steps more steps by op kind against the bandwidth "
               "(CPU only; implies --bandwidth)");
  app.add_option("--profile-steps", o.profile_steps, "decode steps --profile times (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_flag("--kernels", o.kernels,
               "instead of models: time the linear-layer kernels on SmolLM2-135M's shapes (GGUF Q4_1/Q8_0 blocks "
               "with 8-bit and float activations, float32, int8 weights), ms and GB/s a product (llmkv/README.md)");
  app.add_option("--kernel-rows", o.kernel.rows, "--kernels: rows of x a product")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--kernel-threads", o.kernel.threads, "--kernels: thread counts")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--kernel-rounds", o.kernel.rounds, "--kernels: timed rounds (medians; after one warm-up round)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--kernel-shapes", o.kernel.shapes,
                 "--kernels: smollm2 (SmolLM2-135M's shapes, Q4_1 and the Q8_0 head) or qwen2-0.5b (Qwen2-0.5B's, Q8_0)")
      ->check(CLI::IsMember({"smollm2", "qwen2-0.5b"}))
      ->capture_default_str();
  app.add_option("--gguf", o.kernel.gguf, "--kernels: SmolLM2-135M's GGUF file, for its own blocks (default: random blocks)")
      ->check(CLI::ExistingFile);
}

// The default models (when no --model is given), each looked for where it ships. Throws
// wm::Error naming what was tried.
void find_default_models(Options& o) {
  if (o.models_given) return;
  for (auto& m : o.models) {
    std::string tried;
    const std::string found = wm::cli::find_shipped(m, &tried);
    if (found.empty())
      throw wm::Error(wm::str_cat("the default model ", m, " was not found; tried ", tried, ": give --model"));
    m = found;
  }
}

// Refuses a --json that names a model's file, then opens it (so that a bad path fails before the
// work). Returns null without --json.
std::unique_ptr<wm::cli::OutputFile> open_json(const Options& o) {
  wm::cli::NamedPaths inputs;
  for (const auto& m : o.models) {
    const bool dir = std::filesystem::is_directory(m);
    inputs.push_back({"--model " + m, dir ? "" : m});
    if (dir)
      for (const char* f : {"config.json", "tokenizer.json", "model.safetensors"})
        inputs.push_back({wm::str_cat("the ", f, " of ", m), m + "/" + f});
  }
  wm::cli::require_distinct_outputs({{"--json", o.json_out}}, inputs);
  std::unique_ptr<wm::cli::OutputFile> json_file;
  if (!o.json_out.empty()) json_file = std::make_unique<wm::cli::OutputFile>(o.json_out);
  return json_file;
}

// A model folder's weights, a GGUF file's (its blocks as stored with --weights stored, else
// decoded), or random weights at a config.json's shape (--seed); `name` is what the tables call it.
wm::llm::LlmModel load_model(const std::string& m, at::Device dev, at::ScalarType dt, const Options& o,
                             std::string* name) {
  wm::llm::LlmModel model{nullptr};
  const bool gguf = wm::llm::is_gguf_file(m);
  if (o.weights == "stored" && !gguf)
    throw wm::Error(wm::str_cat("--weights stored is for GGUF files; ", m, " is not one"));
  if (gguf) {
    wm::llm::LlmSource src = wm::llm::open_llm(
        m, dev, dt, o.weights == "stored" ? wm::llm::GgufWeights::Stored : wm::llm::GgufWeights::Float);
    model = src.model;
    *name = src.name;
  } else if (std::filesystem::is_directory(m)) {
    model = wm::llm::load_llm(m, dev, dt);
    *name = std::filesystem::path(m).filename().string();
  } else {
    wm::llm::LlmConfig cfg = wm::llm::LlmConfig::load(m);
    wm::llm::check_fits_in_memory(static_cast<uint64_t>(wm::llm::llm_parameter_count(cfg)) * 4,
                                  wm::str_cat("a model of ", m, " in float32"),
                                  wm::str_cat(m, ": ", wm::llm::llm_size_fields(cfg)));
    // Drawn once, by init_weights (not first by the modules' own start as well).
    model = wm::llm::LlmModel(cfg, wm::llm::ParamAlloc{wm::llm::ParamInit::Uninitialised, at::kFloat});
    model->init_weights(o.seed);
    model->to(dev, dt);
    *name = std::filesystem::path(m).stem().string() + " (random)";
  }
  model->eval();
  return model;
}

// The largest context's window (K and V of every layer) and its attention scores (one prefill
// chunk's queries against the whole context, float32) must fit before anything runs.
void check_largest_context_fits(const wm::llm::LlmConfig& cfg, const Options& o, at::ScalarType dt,
                                const std::string& name) {
  const int64_t ctx = *std::max_element(o.contexts.begin(), o.contexts.end());
  wm::llm::check_fits_in_memory(wm::llm::llm_context_bytes(cfg, ctx + o.decode_tokens, std::min(o.prefill_chunk, ctx),
                                                           c10::elementSize(dt)),
                                wm::str_cat("context ", ctx, " on ", name),
                                wm::str_cat("--contexts ", ctx, ", --prefill-chunk ", o.prefill_chunk, "; ",
                                            cfg.num_hidden_layers, " layers of ", cfg.num_key_value_heads,
                                            " kv heads x head_dim ", cfg.head_dim));
}

// The figures of a run: the JSON's rows, and the lines of the policy and bank tables.
struct Results {
  nlohmann::json rows = nlohmann::json::array(), bank_rows = nlohmann::json::array(),
                 policy_rows = nlohmann::json::array(), stream_rows = nlohmann::json::array();
  std::vector<std::string> bank_lines, policy_lines, stream_lines;
  wm::bench::Bandwidth bandwidth;  // measured with --bandwidth or --profile
  nlohmann::json profile_rows = nlohmann::json::array();
  std::string profile_text;
};

// Prefill of ctx random tokens in --prefill-chunk passes, then --decode-tokens decoded one at a
// time over the window: a line of the main table (printed now) and a JSON row.
void bench_context(wm::llm::LlmModelImpl& model, const std::string& name, int64_t ctx, const Options& o,
                   at::Device dev, at::ScalarType dt, Results& res) {
  const int64_t decode_tokens = o.decode_tokens, prefill_chunk = o.prefill_chunk;
  at::manual_seed(static_cast<uint64_t>(o.seed + ctx));
  at::Tensor ids = at::randint(0, model.config().vocab_size, {ctx + decode_tokens}, at::kLong);
  const int64_t profiled = o.profile ? o.profile_steps + 1 : 0;  // --profile's steps and its warm-up
  wm::KvWindow window(model.kv_spec(dev, dt), {"recent"}, ctx + decode_tokens + profiled);
  wm::llm::StepOptions so;
  auto t0 = Clock::now();
  at::Tensor logits = prefill(model, ids.narrow(0, 0, ctx), prefill_chunk, dev, window, so);
  sync(logits);
  const double prefill_s = seconds_since(t0);
  t0 = Clock::now();
  for (int64_t i = 0; i < decode_tokens; ++i) {
    const int64_t p = ctx + i;
    logits = model.step(ids.narrow(0, p, 1).to(dev), at::full({1}, p, at::kLong), window, so).logits;
    (void)logits.argmax(-1).item<int64_t>();  // a decode step ends with its token on the host
  }
  const double decode_s = seconds_since(t0);
  const double kv_mib = window.bytes_used() / 1048576.0;
  const double per_tok = static_cast<double>(window.bytes_used()) / (ctx + decode_tokens);
  std::printf("%-28s %8lld %14.1f %12.1f %14.2f %12.2f %12.0f\n", name.c_str(), static_cast<long long>(ctx),
              ctx / prefill_s, 1000.0 * prefill_s, decode_tokens / decode_s, kv_mib, per_tok);
  std::fflush(stdout);
  res.rows.push_back({{"model", name},
                      {"context", ctx},
                      {"prefill_tokens_per_s", ctx / prefill_s},
                      {"prefill_s", prefill_s},
                      {"decode_tokens_per_s", decode_tokens / decode_s},
                      {"kv_bytes", window.bytes_used()},
                      {"kv_bytes_allocated", window.bytes_allocated()}});
  if (o.profile) {
    const wm::bench::DecodeProfile p = wm::bench::profile_decode(model, window, ctx + decode_tokens,
                                                                 logits.argmax(-1).item<int64_t>(), o.profile_steps);
    res.profile_text += wm::bench::format_profile(p, name, o.dtype, res.bandwidth);
    res.profile_rows.push_back(wm::bench::profile_json(p, name));
  }
}

// Decode speed under each --policies policy against the full cache, the same context and tokens,
// interleaved per context: full, then each policy. A line each (on stderr now, in the policy
// table later) and a JSON row.
void bench_policies(const wm::llm::LlmModel& model, const wm::llm::Tokenizer& tok, const std::string& name,
                    const Options& o, at::Device dev, at::ScalarType dt, Results& res) {
  for (int64_t ctx : o.contexts) {
    at::manual_seed(static_cast<uint64_t>(o.seed + ctx));
    const at::Tensor t =
        at::randint(0, std::min<int64_t>(tok.vocab_size(), model->config().vocab_size), {ctx}, at::kLong);
    const std::vector<int64_t> ids(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + ctx);
    double full_tps = 0;
    std::vector<std::string> names = {"full"};
    names.insert(names.end(), o.policies.begin(), o.policies.end());
    for (const auto& pname : names) {
      wm::llm::SessionOptions so;
      so.prefill_chunk = o.prefill_chunk;
      so.memory.policy = pname;
      so.memory.budget = pname == "full" ? 0 : std::max<int64_t>(1, static_cast<int64_t>(o.policy_share * ctx));
      so.memory.slack = pname == "full" ? 0 : o.evict_slack;
      wm::llm::LlmSession session(model, tok, dev, dt, so);
      session.feed(ids);
      wm::llm::GenerateOptions go;
      go.max_new_tokens = o.decode_tokens + 1;  // the first new token comes from the prompt's logits
      const wm::llm::Generation g = session.generate({}, go);
      const double tps = g.stats.decode_tokens_per_s();
      if (pname == "full") full_tps = tps;
      char line[256];
      std::snprintf(line, sizeof line, "%-28s %8lld %-14s %8lld %14.2f %8.2fx %10.2f", name.c_str(),
                    static_cast<long long>(ctx), pname.c_str(), static_cast<long long>(so.memory.budget), tps,
                    full_tps > 0 ? tps / full_tps : 0.0, g.stats.kv_bytes_used / 1048576.0);
      res.policy_lines.push_back(line);
      std::fprintf(stderr, "wm_bench_llm: %s\n", line);
      res.policy_rows.push_back({{"model", name},
                                 {"context", ctx},
                                 {"policy", pname},
                                 {"budget_tokens", so.memory.budget},
                                 {"decode_tokens_per_s", tps},
                                 {"against_full", full_tps > 0 ? tps / full_tps : 0.0},
                                 {"kv_bytes", g.stats.kv_bytes_used},
                                 {"kv_tokens_peak", g.stats.kv_tokens_peak}});
    }
  }
}

// Parallel decoding: S streams, each with its own window holding a --stream-context prompt of
// its own, decoded --decode-tokens steps together (LlmModel::step_batch: one product over the S
// rows per weight, attention per stream); aggregate tokens/s (S x steps / time), the median of
// --stream-reps rounds that visit every S in turn, against one stream. A line each (stderr now,
// the streams table later) and a JSON row.
void bench_streams(wm::llm::LlmModelImpl& model, const std::string& name, const Options& o, at::Device dev,
                   at::ScalarType dt, Results& res) {
  const int64_t smax = *std::max_element(o.streams.begin(), o.streams.end()), ctx = o.stream_context;
  const int64_t steps = o.decode_tokens;
  std::vector<wm::KvWindow> windows;
  windows.reserve(smax);
  wm::llm::StepOptions so;
  at::manual_seed(o.seed + 17);
  for (int64_t b = 0; b < smax; ++b) {
    windows.emplace_back(model.kv_spec(dev, dt), std::vector<std::string>{"recent"}, ctx + steps + 2);
    const at::Tensor ids = at::randint(0, model.config().vocab_size, {ctx}, at::kLong);
    sync(prefill(model, ids, o.prefill_chunk, dev, windows.back(), so));
  }
  std::vector<int64_t> prompt(ctx);
  for (int64_t i = 0; i < ctx; ++i) prompt[i] = i;
  std::map<int64_t, std::vector<double>> tps;
  for (int r = 0; r <= o.stream_reps; ++r) {  // round 0 warms up
    for (int64_t S : o.streams) {
      std::vector<wm::KvWindow*> ws;
      for (int64_t b = 0; b < S; ++b) ws.push_back(&windows[b]);
      at::Tensor next = at::randint(0, model.config().vocab_size, {S}, at::kLong);
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < steps; ++i) {
        const std::vector<wm::llm::StepResult> out =
            model.step_batch(next.to(dev), at::full({S}, ctx + i, at::kLong), ws, so);
        std::vector<at::Tensor> rows;
        for (const auto& o1 : out) rows.push_back(o1.logits);
        next = at::cat(rows, 0).argmax(-1).to(at::kCPU);  // each stream's token on the host, greedy
      }
      const double sec = seconds_since(t0);
      if (r > 0) tps[S].push_back(static_cast<double>(S * steps) / sec);
      for (auto* w : ws)  // back to the prompt alone for the next measurement
        for (int l = 0; l < model.config().num_hidden_layers; ++l) w->keep_tokens(l, prompt);
    }
  }
  const double one = tps.count(1) ? median(tps[1]) : 0.0;
  for (int64_t S : o.streams) {
    const double agg = median(tps[S]);
    char line[256];
    std::snprintf(line, sizeof line, "%-28s %8lld %8lld %16.1f %16.1f %9.2fx", name.c_str(), static_cast<long long>(S),
                  static_cast<long long>(ctx), agg, agg / S, one > 0 ? agg / one : 0.0);
    res.stream_lines.push_back(line);
    std::fprintf(stderr, "wm_bench_llm: %s\n", line);
    res.stream_rows.push_back({{"model", name},
                               {"streams", S},
                               {"context", ctx},
                               {"decode_tokens", steps},
                               {"aggregate_tokens_per_s", agg},
                               {"per_stream_tokens_per_s", agg / S},
                               {"against_one_stream", one > 0 ? agg / one : 0.0}});
  }
}

// EVOKE's trade for a --bank-block block, in host memory then on disk: a line each (on stderr now,
// in the bank table later) and a JSON row.
void bench_bank_tiers(wm::llm::LlmModelImpl& model, const std::string& name, const Options& o, at::Device dev,
                      at::ScalarType dt, Results& res) {
  for (wm::Tier tier : {wm::Tier::Host, wm::Tier::Disk}) {
    const BankFigures f = bench_bank(model, dev, dt, o.bank_block, o.prefill_chunk, tier, o.bank_reps, o.seed);
    const char* tname = tier == wm::Tier::Host ? "host" : "disk";
    char line[256];
    std::snprintf(line, sizeof line, "%-28s %8lld %6s %10.2f %10.2f %14.1f %10.1fx %10.2f", name.c_str(),
                  static_cast<long long>(o.bank_block), tname, f.save_ms, f.load_ms, f.recompute_ms,
                  f.recompute_ms / (f.save_ms + f.load_ms), f.block_bytes / 1048576.0);
    res.bank_lines.push_back(line);
    std::fprintf(stderr, "wm_bench_llm: %s\n", line);
    res.bank_rows.push_back({{"model", name},
                             {"block_tokens", o.bank_block},
                             {"tier", tname},
                             {"save_ms", f.save_ms},
                             {"load_ms", f.load_ms},
                             {"recompute_ms", f.recompute_ms},
                             {"speedup", f.recompute_ms / (f.save_ms + f.load_ms)},
                             {"block_bytes", f.block_bytes}});
  }
}

// Every figure of model file or folder m: the contexts, the policies (with a tokenizer.json) and
// the bank.
// dt: the model's dtype; kvdt: the K/V's.
void bench_model(const std::string& m, const Options& o, at::Device dev, at::ScalarType dt, at::ScalarType kvdt,
                 Results& res) {
  std::string name;
  wm::llm::LlmModel model = load_model(m, dev, dt, o, &name);
  if (o.weights == "int8") model->quantize_int8();
  dt = kvdt;  // from here on, the window's
  check_largest_context_fits(model->config(), o, dt, name);
  for (int64_t ctx : o.contexts) bench_context(*model, name, ctx, o, dev, dt, res);
  const std::string tok_path = m + "/tokenizer.json";
  if (!o.policies.empty() && std::filesystem::is_regular_file(tok_path)) {
    bench_policies(model, wm::llm::Tokenizer::load(tok_path), name, o, dev, dt, res);
  } else if (!o.policies.empty()) {
    std::fprintf(stderr, "wm_bench_llm: %s has no tokenizer.json: no policy figures for it\n", m.c_str());
  }
  if (o.bank_block > 0) bench_bank_tiers(*model, name, o, dev, dt, res);
  if (!o.streams.empty()) bench_streams(*model, name, o, dev, dt, res);
}

// The policy and bank tables, after the main one (each only when it has lines).
void print_tables(const Options& o, const Results& res) {
  if (!res.profile_text.empty()) std::printf("%s", res.profile_text.c_str());
  if (!res.policy_lines.empty()) {
    std::printf("\nDecode under memory policies (budget %.0f%% of the context), against the full cache\n",
                100 * o.policy_share);
    std::printf("%-28s %8s %-14s %8s %14s %9s %10s\n", "model", "context", "policy", "budget", "decode tok/s",
                "vs full", "KV MiB");
    for (const auto& l : res.policy_lines) std::printf("%s\n", l.c_str());
  }
  if (!res.stream_lines.empty()) {
    std::printf("\nParallel decoding: streams decoded together (one step for all), each over its own window\n"
                "(a %lld-token prompt), %lld steps; aggregate tokens/s, median of %d rounds\n",
                static_cast<long long>(o.stream_context), static_cast<long long>(o.decode_tokens), o.stream_reps);
    std::printf("%-28s %8s %8s %16s %16s %10s\n", "model", "streams", "context", "aggregate tok/s",
                "per stream tok/s", "vs 1");
    for (const auto& l : res.stream_lines) std::printf("%s\n", l.c_str());
  }
  if (!res.bank_lines.empty()) {
    std::printf("\nBank: a block moved out of the window into a tier (save) and spliced back re-anchored (load),\n"
                "against computing it again (recompute; medians of %d)\n",
                o.bank_reps);
    std::printf("%-28s %8s %6s %10s %10s %14s %11s %10s\n", "model", "tokens", "tier", "save ms", "load ms",
                "recompute ms", "speedup", "MiB");
    for (const auto& l : res.bank_lines) std::printf("%s\n", l.c_str());
  }
}

// The bandwidth figures for the JSON (null when not measured).
nlohmann::json bandwidth_json(const Options& o, const Results& res) {
  if (!o.bandwidth && !o.profile) return nullptr;
  const wm::bench::Bandwidth& b = res.bandwidth;
  return {{"read_gbps", b.read_gbps}, {"copy_gbps", b.copy_gbps}, {"triad_gbps", b.triad_gbps},
          {"array_bytes", b.array_bytes}, {"threads", b.threads}, {"reps", b.reps}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_bench_llm: prefill and decode tokens/s and KV bytes of decoders at several context lengths"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  o.models_given = app.count("--model") > 0;
  o.budget_given = app.count("--policy-budget") > 0;
  wm::cli::remove_temporaries_on_signal();

  try {
    find_default_models(o);
    if (o.budget_given && o.policies.empty())
      throw wm::Error("--policy-budget applies to --policies, and none is given");
    std::unique_ptr<wm::cli::OutputFile> json_file = open_json(o);
    const int nt = wm::init_threads(o.threads);
    wm::keep_freed_memory();
    const at::Device dev = wm::parse_device(o.device);
    const at::ScalarType dt = wm::parse_compute_dtype(o.dtype);
    if (dt == at::kHalf && dev.is_cpu())
      throw wm::Error("--dtype float16 is not supported on the CPU (libtorch's CPU kernels lack it): use bfloat16 or "
                      "float32");
    const at::ScalarType kvdt = o.kv_dtype.empty() ? dt : wm::parse_compute_dtype(o.kv_dtype);
    if (o.weights != "float" && !dev.is_cpu())
      throw wm::Error(wm::str_cat("--weights ", o.weights, " runs on the CPU only; the device is ", o.device));
    wm::llm::set_gemv_path(wm::llm::parse_gemv_path(o.gemv));
    wm::llm::set_quant_activations(wm::llm::parse_quant_activations(o.quant_acts));
    torch::NoGradGuard ng;
    if (o.kernels) {
      o.kernel.seed = o.seed;
      const nlohmann::json rows = wm::bench::bench_kernels(o.kernel);
      if (json_file) {
        json_file->stream() << nlohmann::json{{"kernels", rows}}.dump(2) << "\n";
        json_file->commit();
      }
      return 0;
    }
    std::printf("device %s, %d threads, dtype %s, K/V %s, weights %s, decode kernels %s, prefill chunk %lld\n",
                wm::describe_device(dev).c_str(), nt, o.dtype.c_str(), c10::toString(kvdt),
                o.weights == "float" ? o.dtype.c_str() : o.weights.c_str(), wm::llm::gemv_active_name(),
                static_cast<long long>(o.prefill_chunk));
    Results res;
    if (o.profile && !dev.is_cpu())
      throw wm::Error(wm::str_cat("--profile times the CPU path only; the device is ", o.device));
    if (o.bandwidth || o.profile) {
      res.bandwidth = wm::bench::measure_bandwidth(int64_t{1} << 30, 5);
      std::printf("host memory bandwidth (STREAM-like, 3 arrays of %lld MiB, %d threads, best of %d): copy %.1f GB/s, "
                  "triad %.1f GB/s, read %.1f GB/s\n",
                  static_cast<long long>(res.bandwidth.array_bytes >> 20), res.bandwidth.threads, res.bandwidth.reps,
                  res.bandwidth.copy_gbps, res.bandwidth.triad_gbps, res.bandwidth.read_gbps);
    }
    std::printf("%-28s %8s %14s %12s %14s %12s %12s\n", "model", "context", "prefill tok/s", "TTFT ms",
                "decode tok/s", "KV MiB", "KV B/token");
    for (const auto& m : o.models) bench_model(m, o, dev, dt, kvdt, res);
    print_tables(o, res);
    if (json_file) {
      json_file->stream() << nlohmann::json{{"device", wm::describe_device(dev)}, {"dtype", o.dtype},
                                            {"kv_dtype", c10::toString(kvdt)}, {"weights", o.weights},
                                            {"decode_kernels", wm::llm::gemv_active_name()},
                                            {"rows", res.rows}, {"bank", res.bank_rows},
                                            {"policies", res.policy_rows}, {"streams", res.stream_rows},
                                            {"bandwidth", bandwidth_json(o, res)},
                                            {"profile", res.profile_rows}}.dump(2)
                          << "\n";
      json_file->commit();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_bench_llm: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "wm_bench_llm: error: an unknown failure\n");
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_bench_llm
