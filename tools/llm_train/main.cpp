// wm_llm_train: trains the tiny decoder on the text tasks (associative recall, needles, multi-fact
// chat sessions, embodied planning), with a context-length curriculum, the loss weighted onto the
// answers, checkpoints in the Hugging Face layout, and resume.
#include <CLI/CLI.hpp>
#include <torch/types.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "llmkv/bpe_trainer.h"
#include "llmkv/config.h"
#include "llmkv/hf_folder.h"
#include "llmkv/model.h"
#include "llmkv/tokenizer.h"
#include "llmkv/weight_shapes.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/progress.h"
#include "tools/cli/run_folder.h"
#include "tools/cli/validators.h"
#include "tools/llm_tasks/rng.h"
#include "tools/llm_tasks/sample.h"
#include "tools/llm_train/data.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_llm_train {

namespace fs = std::filesystem;

namespace {

struct Stage {
  int64_t context;      // the longest context of the stage
  int64_t min_context;  // == context, or the shortest of a range stage
  int64_t steps;
};

// "256:2000,1024:3000": context:steps per stage, in order. A range "64-256:2000" draws each step's
// context uniformly from [64, 256] (a function of the run seed and the step, so a resumed run sees
// the same contexts): short samples, where recall is learned soonest, beside long ones.
std::vector<Stage> parse_curriculum(const std::string& s) {
  std::vector<Stage> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto c = item.find(':');
    if (c == std::string::npos) throw wm::Error(wm::str_cat("--curriculum: '", item, "' is not context:steps"));
    Stage st{};
    try {
      const std::string ctx = item.substr(0, c);
      const auto dash = ctx.find('-');
      size_t used = 0, used2 = 0;
      st.min_context = std::stoll(ctx.substr(0, dash), &used);
      st.context = dash == std::string::npos ? st.min_context : std::stoll(ctx.substr(dash + 1), &used2);
      if (used != (dash == std::string::npos ? ctx.size() : dash) ||
          (dash != std::string::npos && used2 != ctx.size() - dash - 1))
        throw std::invalid_argument(ctx);
      const std::string steps = item.substr(c + 1);
      st.steps = std::stoll(steps, &used);
      if (used != steps.size()) throw std::invalid_argument(steps);
    } catch (const std::exception&) {
      throw wm::Error(wm::str_cat("--curriculum: '", item, "' is not context:steps or min-max:steps"));
    }
    if (st.min_context < wm::llmtasks::kMinTargetTokens || st.context > 65536 || st.min_context > st.context ||
        st.steps <= 0)
      throw wm::Error(wm::str_cat("--curriculum: '", item, "' needs ", wm::llmtasks::kMinTargetTokens,
                                  " <= context (min <= max of a range) <= 65536 and steps > 0"));
    out.push_back(st);
  }
  if (out.empty()) throw wm::Error("--curriculum is empty");
  return out;
}

// "mqar:1,niah:1": task:weight.
std::vector<std::pair<std::string, double>> parse_mix(const std::string& s) {
  std::vector<std::pair<std::string, double>> out;
  auto known = wm::llmtasks::task_names();
  for (const auto& a : wm::llmtasks::training_aid_names()) known.push_back(a);
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto c = item.find(':');
    const std::string name = item.substr(0, c);
    double w = 1.0;
    if (c != std::string::npos) {
      try {
        w = std::stod(item.substr(c + 1));
      } catch (const std::exception&) {
        w = -1;
      }
    }
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw wm::Error(wm::str_cat("--tasks: unknown task '", name, "'"));
    if (!(w > 0 && std::isfinite(w))) throw wm::Error(wm::str_cat("--tasks: weight of '", name, "' must be > 0"));
    out.push_back({name, w});
  }
  if (out.empty()) throw wm::Error("--tasks is empty");
  return out;
}

// The trainer's own held-out checks use held-out seeds from this index on; wm_llm_bench uses
// those from 0, so choosing a checkpoint by the first does not select on the second.
constexpr uint64_t kCheckSeeds = 1000000;

using wm::llmtasks::mix64;

// The training seed of sample i of step s: a fixed function of (run seed, s, i), never a
// held-out seed, so that a resumed run sees the same data.
uint64_t train_seed(uint64_t run, int64_t step, int i) {
  for (uint64_t k = 0;; ++k) {
    const uint64_t s = mix64(run ^ mix64(static_cast<uint64_t>(step) * 1315423911ull + i * 2654435761ull + k));
    if (!wm::llmtasks::is_heldout(s)) return s;
  }
}

// Mimetic initialisation of attention: each head's query projection starts as its key/value
// group's key projection, both scaled to standard deviation `scale`, so that q.k ~ |W_k x|^2 and
// a token starts out attending to tokens like itself, the matching half of the recall circuit.
// On associative recall in a 2-layer Qwen2 (Hugging Face's), this brought the jump from chance to
// perfect recall forward from ~1,750 to ~800 steps.
void mimetic_qk_init(wm::llm::LlmModelImpl& model, const wm::llm::LlmConfig& cfg, double scale) {
  at::NoGradGuard ng;
  const int64_t hd = cfg.head_dim, group = cfg.num_attention_heads / cfg.num_key_value_heads;
  auto params = model.named_parameters(true);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string pre = wm::str_cat("model.layers.", l, ".self_attn.");
    at::Tensor* q = params.find(pre + "q_proj.weight");
    at::Tensor* k = params.find(pre + "k_proj.weight");
    if (q == nullptr || k == nullptr) throw wm::Error(wm::str_cat("--qk-init: no ", pre, "{q,k}_proj.weight"));
    k->mul_(scale / cfg.initializer_range);
    for (int64_t h = 0; h < cfg.num_attention_heads; ++h)
      q->narrow(0, h * hd, hd).copy_(k->narrow(0, (h / group) * hd, hd));
  }
}

double lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_lr) {
  if (step < warmup) return lr * (step + 1) / warmup;
  const double p = static_cast<double>(step - warmup) / std::max<int64_t>(1, total - warmup);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * std::min(1.0, p)));
}

// The folder's model with `grow` layers more on top: the folder's parameters by name, the new
// layers drawn as init_weights() draws them but for their output projections (o_proj and
// down_proj, with their biases), which start at zero, so that the grown model computes exactly
// what the folder's did until training moves them.
wm::llm::LlmModel grown_model(const wm::llm::HfFolder& folder, wm::llm::LlmConfig cfg, int grow, uint64_t seed) {
  wm::llm::LlmConfig small_cfg = cfg;
  small_cfg.num_hidden_layers = folder.config.num_hidden_layers;
  const wm::llm::ParamAlloc blank{wm::llm::ParamInit::Uninitialised, at::kFloat};
  wm::llm::LlmModel small(small_cfg, blank);
  wm::llm::load_llm_weights(*small, folder);
  cfg.num_hidden_layers = small_cfg.num_hidden_layers + grow;
  cfg.validate();
  wm::llm::LlmModel model(cfg, blank);
  model->init_weights(seed);
  torch::NoGradGuard ng;
  auto params = model->named_parameters(true);
  for (const auto& item : small->named_parameters(true)) params[item.key()].copy_(item.value());
  for (int64_t l = small_cfg.num_hidden_layers; l < cfg.num_hidden_layers; ++l)
    for (const auto& item : params) {
      const std::string& name = item.key();
      const std::string prefix = wm::str_cat("model.layers.", l, ".");
      if (name.rfind(prefix, 0) == 0 &&
          (name.find("o_proj.") != std::string::npos || name.find("down_proj.") != std::string::npos))
        item.value().zero_();
    }
  return model;
}

// The command line's settings.
struct Options {
  std::string out = "out/llm-train", config_path = "configs/tiny-llm.json", tokenizer_path, init_from,
              tasks = "mqar,niah,multifact,plan,copy";
  std::string curriculum = "256:600,512:600,1024:600", device = "auto", split = "gpt2";
  int64_t vocab = 2048, batch_tokens = 8192, warmup = 100, save_every = 250, eval_every = 250, eval_samples = 16;
  double rope_theta = 0.0;
  int grow_layers = 0;
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, clip = 1.0, context_weight = 0.1, qk_init = 0.0, beta2 = 0.95;
  uint64_t seed = 1;  // on --resume, the checkpoint's (the run's own data stream)
  int threads = 0;
  bool resume = false, all_queries = false;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("-o,--out", o.out, "output folder: the model (Hugging Face layout), checkpoint/ and train.log")
      ->capture_default_str();
  auto* config_opt = app.add_option("--config", o.config_path, "model shape (config.json fields; vocab_size comes from the tokenizer)")
      ->capture_default_str()->check(CLI::ExistingFile);
  auto* tokenizer_opt = app.add_option("--tokenizer", o.tokenizer_path, "tokenizer.json to use (default: train a byte-level BPE on the tasks' text)")
      ->check(CLI::ExistingFile);
  app.add_option("--vocab", o.vocab, "vocabulary of the BPE trained when no --tokenizer is given")
      ->capture_default_str()->check(CLI::Range(int64_t{300}, int64_t{65536}));
  app.add_option("--split", o.split,
                 "pre-tokenizer of the BPE trained when no --tokenizer is given: gpt2 (a number with its "
                 "leading space is one piece, so BPE can learn \" 42\" as one token) or qwen2 (one digit "
                 "per token)")
      ->capture_default_str()->check(CLI::IsMember({"gpt2", "qwen2"}));
  app.add_option("--tasks", o.tasks, "task mix, name[:weight],...; besides the tasks, the training aids 'copy', 'recall', 'lookup', 'needles' and 'facts'")->capture_default_str();
  app.add_option("--curriculum", o.curriculum, "context:steps,... stages in order")->capture_default_str();
  app.add_option("--batch-tokens", o.batch_tokens, "tokens per step (samples = batch_tokens / context, at least 1)")
      ->capture_default_str()->check(CLI::Range(int64_t{32}, int64_t{1} << 24));
  app.add_option("--lr", o.lr, "peak learning rate")->capture_default_str()->check(wm::cli::FiniteRange(1e-7, 1.0));
  app.add_option("--min-lr", o.min_lr, "final learning rate (cosine)")->capture_default_str()->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--warmup", o.warmup, "warm-up steps")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")->capture_default_str()->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--beta2", o.beta2, "AdamW's second-moment decay")->capture_default_str()->check(wm::cli::FiniteRange(0.0, 0.999999));
  app.add_option("--clip", o.clip, "gradient norm clip")->capture_default_str()->check(wm::cli::FiniteRange(1e-6, 1e6));
  app.add_option("--context-weight", o.context_weight, "loss weight of non-answer tokens (answers weigh 1)")
      ->capture_default_str()->check(wm::cli::FiniteRange(0.0, 1.0));
  auto* qk_init_opt = app.add_option("--qk-init", o.qk_init,
                 "mimetic attention initialisation: queries start equal to their group's keys, both with this "
                 "standard deviation (0: off, every matrix drawn with the config's initializer_range)")
      ->capture_default_str()->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--save-every", o.save_every, "steps between checkpoints")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--eval-every", o.eval_every, "steps between held-out answer accuracy checks")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--eval-samples", o.eval_samples, "held-out samples per task in those checks")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app.add_option("--seed", o.seed, "data and initialisation seed")->capture_default_str()->check(wm::cli::Uint64());
  app.add_flag("--all-queries", o.all_queries,
               "mqar samples for training query every pair, not half of them as the task does by default (and "
               "as evaluation does): twice the answers per token");
  auto* resume_opt = app.add_flag("--resume", o.resume, "continue from <out>/checkpoint");
  app.add_option("--init-from", o.init_from,
                 "start from this model folder's weights, config and tokenizer (a run of its own: a fresh "
                 "optimizer at step 0, the data of --seed): to go on with other tasks or settings than a "
                 "finished run's; its config, tokenizer and weights as they are (so not with --config, "
                 "--tokenizer or --qk-init)")
      ->check(CLI::ExistingDirectory)
      ->excludes(resume_opt)
      ->excludes(config_opt)
      ->excludes(tokenizer_opt)
      ->excludes(qk_init_opt);
  app.add_option("--grow-layers", o.grow_layers,
                 "with --init-from: add this many layers on top of the model's, their output projections at zero "
                 "(the grown model starts out computing what the model did)")
      ->check(CLI::Range(0, 64))
      ->needs("--init-from");
  app.add_option("--rope-theta", o.rope_theta,
                 "RoPE base instead of the config's (or the --init-from model's: a model goes on at a larger "
                 "base, as long-context extension does, its weights unchanged); 0: the config's")
      ->check(wm::cli::FiniteRange(0.0, 1e12))
      ->excludes(resume_opt);
  app.add_option("--device", o.device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
}

// Tokenizer: given, resumed, taken over, or trained on the tasks' own text.
wm::llm::Tokenizer make_tokenizer(const Options& o, const std::string& ckpt) {
  if (o.resume) return wm::llm::Tokenizer::load(ckpt + "/tokenizer.json");
  if (!o.init_from.empty()) return wm::llm::Tokenizer::load(o.init_from + "/tokenizer.json");
  if (!o.tokenizer_path.empty()) return wm::llm::Tokenizer::load(o.tokenizer_path);
  std::fprintf(stderr, "wm_llm_train: training a byte-level BPE of %lld tokens on the tasks' text\n",
               static_cast<long long>(o.vocab));
  wm::llm::BpeTrainerOptions bo;
  bo.vocab_size = o.vocab;
  bo.style = o.split == "qwen2" ? wm::llm::SplitStyle::Qwen2 : wm::llm::SplitStyle::Gpt2;
  bo.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  return wm::llm::BpeTrainer::train(std::vector<std::string>{wm::llmtasks::sample_corpus(o.seed, 4 << 20)}, bo);
}

// The model's config: the folder's (`from`, opened as `folder`) or --config's with the tokenizer's
// vocabulary and end token, at --rope-theta when given. Throws wm::Error when training a model of
// it (grown by --grow-layers) would not fit in memory.
wm::llm::LlmConfig model_config(const Options& o, const std::string& from,
                                const std::optional<wm::llm::HfFolder>& folder, const wm::llm::Tokenizer& tok) {
  wm::llm::LlmConfig cfg = folder ? folder->config : wm::llm::LlmConfig::load(o.config_path);
  if (o.rope_theta > 0) cfg.rope_theta = o.rope_theta;
  if (from.empty()) {
    cfg.vocab_size = tok.vocab_size();
    cfg.eos_token_ids.clear();
    if (auto e = tok.token_to_id("<|endoftext|>")) cfg.eos_token_ids.push_back(*e);
    cfg.validate();
  }
  wm::llm::LlmConfig grown = cfg;
  grown.num_hidden_layers += o.grow_layers;
  // Weights, gradients and AdamW's two moments, in float32.
  wm::llm::check_fits_in_memory(static_cast<uint64_t>(wm::llm::llm_parameter_count(grown)) * 16,
                                "training this model",
                                wm::str_cat(from.empty() ? o.config_path : from + "/config.json", ": ",
                                            wm::llm::llm_size_fields(grown),
                                            o.grow_layers ? wm::str_cat("; --grow-layers ", o.grow_layers) : ""));
  return cfg;
}

// The model on `dev`: the folder's weights (grown by --grow-layers, `cfg` then the grown
// model's), or drawn from --seed (with --qk-init's attention).
wm::llm::LlmModel make_model(const Options& o, const std::optional<wm::llm::HfFolder>& folder,
                             wm::llm::LlmConfig& cfg, at::Device dev) {
  // The folder's weights into a model of cfg (the folder's config, but for --rope-theta); its
  // parameters start uninitialised: loaded or drawn by init_weights, never drawn twice.
  wm::llm::LlmModel model(cfg, wm::llm::ParamAlloc{wm::llm::ParamInit::Uninitialised, at::kFloat});
  if (folder && o.grow_layers > 0) {
    model = grown_model(*folder, cfg, o.grow_layers, o.seed);
    cfg = model->config();
    model->to(dev);
  } else if (folder) {
    wm::llm::load_llm_weights(*model, *folder);
    model->to(dev);
  } else {
    model->init_weights(o.seed);
    if (o.qk_init > 0) mimetic_qk_init(*model, cfg, o.qk_init);
    model->to(dev);
  }
  return model;
}

// AdamW's two parameter groups. Weight decay on matrices only: RMSNorm gains and biases are not
// pulled toward zero.
std::vector<torch::optim::OptimizerParamGroup> param_groups(wm::llm::LlmModelImpl& model, const Options& o) {
  std::vector<at::Tensor> decayed, plain;
  for (const auto& p : model.parameters()) (p.dim() >= 2 ? decayed : plain).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(o.lr).betas({0.9, o.beta2}).weight_decay(o.weight_decay)));
  groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(o.lr).betas({0.9, o.beta2}).weight_decay(0.0)));
  return groups;
}

// --resume: the checkpoint's optimizer state into `opt`, o.seed set to the run's own; returns the
// checkpoint's step. Throws wm::CorruptData for a damaged optimizer.pt or trainer_state.json,
// wm::Error when the options change the run or the curriculum ends at or before the step.
int64_t resume_checkpoint(torch::optim::AdamW& opt, const std::string& ckpt, int64_t total_steps, Options& o) {
  const std::string opt_file = ckpt + "/optimizer.pt";
  try {
    torch::load(opt, opt_file);
  } catch (const std::exception& e) {
    // libtorch's reader says "PytorchStreamReader failed reading zip archive" and the like,
    // without the file: the file, and its message's first line.
    std::string why = wm::cli::error_text(e);
    why = why.substr(0, why.find('\n'));
    throw wm::CorruptData(wm::str_cat("--resume: ", opt_file,
                                      " is damaged or not this model's optimizer state (", why, ")"));
  }
  const std::string state_file = ckpt + "/trainer_state.json";
  std::ifstream f(state_file);
  if (!f) throw wm::CorruptData(wm::str_cat("cannot read ", state_file));
  const auto st = nlohmann::json::parse(f, nullptr, false);
  if (st.is_discarded() || !st.is_object() || !st.contains("step") || !st.contains("seed") ||
      !st.at("step").is_number_integer() || !st.at("seed").is_number_unsigned() || st.at("step").get<int64_t>() < 0)
    throw wm::CorruptData(wm::str_cat(state_file, " is not a trainer state (step and seed: whole numbers >= 0)"));
  const int64_t step = st.at("step").get<int64_t>();
  // The data stream is a function of (seed, step): the run's own seed, whatever the flags say.
  o.seed = st.at("seed").get<uint64_t>();
  // A different mix, batch or loss weighting would make the resumed run another run.
  for (const auto& [key, now] : {std::pair<std::string, nlohmann::json>{"tasks", o.tasks},
                                 {"batch_tokens", o.batch_tokens}, {"context_weight", o.context_weight}})
    if (st.contains(key) && st.at(key) != now)
      throw wm::Error(wm::str_cat("--resume: --", key, " was ", st.at(key).dump(), " in this run, not ",
                                  now.dump()));
  if (step >= total_steps)
    throw wm::Error(wm::str_cat("--resume: the checkpoint is at step ", step, "; the curriculum has ",
                                total_steps, " steps (lengthen it to train on)"));
  return step;
}

using Mix = std::vector<std::pair<std::string, double>>;

// A run once set up: what the training loop reads, and the step it advances.
struct Run {
  const Options& o;
  const std::vector<Stage>& stages;
  const Mix& mix;
  int64_t total_steps;
  at::Device dev;
  const wm::llm::Tokenizer& tok;
  const wm::llm::LlmConfig& cfg;
  wm::llm::LlmModel& model;
  torch::optim::AdamW& opt;
  std::string ckpt;  // <out>/checkpoint
  int64_t step;      // steps done
};

void save_model(const std::string& dir, wm::llm::LlmModelImpl& model, const wm::llm::Tokenizer& tok) {
  wm::llm::save_llm(dir, model);
  tok.save(dir + "/tokenizer.json");
}

// A checkpoint is written whole into checkpoint.next/, then swapped in: an interruption
// leaves the previous checkpoint (or checkpoint.old/, taken up on resume) intact.
void write_checkpoint(Run& r) {
  const Options& o = r.o;
  const std::string next = r.ckpt + ".next", old = r.ckpt + ".old";
  fs::remove_all(next);
  save_model(next, *r.model, r.tok);
  torch::save(r.opt, next + "/optimizer.pt");
  wm::cli::OutputFile st(next + "/trainer_state.json");
  st.stream() << nlohmann::json{{"step", r.step}, {"seed", o.seed}, {"tasks", o.tasks}, {"batch_tokens", o.batch_tokens},
                                {"context_weight", o.context_weight}, {"curriculum", o.curriculum},
                                {"init_from", o.init_from}, {"grow_layers", o.grow_layers}, {"rope_theta", r.cfg.rope_theta},
                                // Settings a run cannot be reproduced without (read by people, not by --resume).
                                {"all_queries", o.all_queries}, {"lr", o.lr}, {"min_lr", o.min_lr},
                                {"weight_decay", o.weight_decay}, {"beta2", o.beta2}, {"clip", o.clip},
                                {"qk_init", o.qk_init}, {"warmup", o.warmup}}.dump()
              << "\n";
  st.commit();
  fs::remove_all(old);
  if (fs::exists(r.ckpt)) fs::rename(r.ckpt, old);
  fs::rename(next, r.ckpt);
  fs::remove_all(old);
}

// Held-out answer accuracy per task at a context, teacher-forced (equal to greedy exact match).
nlohmann::json evaluate(Run& r, const wm::llmtasks::TokenCounter& counter, int64_t context) {
  torch::NoGradGuard ng;
  r.model->eval();
  nlohmann::json acc;
  for (const auto& [task, w] : r.mix) {
    int correct = 0, total = 0;
    for (int64_t i = 0; i < r.o.eval_samples; ++i) {
      wm::llmtasks::GenOptions go;
      go.target_tokens = context;
      go.count = counter;
      const auto s = wm::llmdata::tokenize(
          wm::llmtasks::make_sample(task, wm::llmtasks::heldout_seed(kCheckSeeds + static_cast<uint64_t>(i)), go),
          r.tok);
      at::Tensor ids = at::tensor(s.ids, at::kLong).unsqueeze(0).to(r.dev);
      at::Tensor am = r.model->forward_train(ids)[0].argmax(-1).to(at::kCPU);
      std::vector<int64_t> arg(am.data_ptr<int64_t>(), am.data_ptr<int64_t>() + am.numel());
      for (const auto& a : s.answers) {
        correct += wm::llmdata::answer_correct(s.ids, arg, a);
        ++total;
      }
    }
    acc[task] = total ? static_cast<double>(correct) / total : 0.0;
  }
  r.model->train();
  return acc;
}

// The stage a step falls in (the last one past the curriculum's end).
Stage stage_at(const std::vector<Stage>& stages, int64_t step) {
  int64_t at_step = step;
  Stage stage = stages.back();
  for (const auto& s : stages) {
    if (at_step < s.steps) {
      stage = s;
      break;
    }
    at_step -= s.steps;
  }
  return stage;
}

// A step's context: the stage's, or drawn from a range stage's by (run seed, step).
int64_t context_at(const Stage& stage, uint64_t seed, int64_t step) {
  return stage.min_context +
         static_cast<int64_t>(mix64(seed ^ mix64(static_cast<uint64_t>(step) ^ 0x5EEDC0DEull)) %
                              static_cast<uint64_t>(stage.context - stage.min_context + 1));
}

// A step's batch on the CPU: n samples padded to the longest, T tokens.
struct Batch {
  int n = 0;
  int64_t T = 0;
  at::Tensor ids;     // [n, T] int64, padded with the end token (or 0)
  at::Tensor w;       // [n, T] float32 loss weight: 1 on answers, --context-weight elsewhere, 0 on padding and token 0
  at::Tensor is_ans;  // [n, T] bool: answer tokens
};

// A batch: n samples of about `context` tokens, task drawn by weight.
Batch make_batch(const Run& r, double wsum, const wm::llmtasks::TokenCounter& counter, int64_t pad, int64_t context) {
  const Options& o = r.o;
  Batch b;
  b.n = static_cast<int>(std::max<int64_t>(1, o.batch_tokens / context));
  std::vector<wm::llmdata::TokenizedSample> batch;
  for (int i = 0; i < b.n; ++i) {
    const uint64_t sd = train_seed(o.seed, r.step, i);
    double u = (mix64(sd ^ 0xABCDEFull) >> 11) * 0x1.0p-53 * wsum;
    std::string task = r.mix.back().first;
    for (const auto& [name, w] : r.mix) {
      if (u < w) {
        task = name;
        break;
      }
      u -= w;
    }
    wm::llmtasks::GenOptions go;
    go.target_tokens = context;
    go.count = counter;
    if (o.all_queries) go.mqar_queries = wm::llmtasks::kMqarKeyPool;
    batch.push_back(wm::llmdata::tokenize(wm::llmtasks::make_sample(task, sd, go), r.tok));
    b.T = std::max<int64_t>(b.T, static_cast<int64_t>(batch.back().ids.size()));
  }
  b.ids = at::full({b.n, b.T}, pad, at::kLong);
  b.w = at::zeros({b.n, b.T}, at::kFloat);
  b.is_ans = at::zeros({b.n, b.T}, at::kBool);
  for (int i = 0; i < b.n; ++i) {
    const auto& s = batch[i];
    const int64_t L = static_cast<int64_t>(s.ids.size());
    b.ids[i].narrow(0, 0, L).copy_(at::tensor(s.ids, at::kLong));
    std::vector<float> wt(L);
    std::vector<uint8_t> ans(L);
    for (int64_t j = 0; j < L; ++j) {
      wt[j] = s.target[j] ? 1.0f : static_cast<float>(o.context_weight);
      ans[j] = s.target[j];
    }
    wt[0] = 0.0f;  // the first token is never predicted
    b.w[i].narrow(0, 0, L).copy_(at::tensor(wt));
    b.is_ans[i].narrow(0, 0, L).copy_(at::tensor(std::vector<int64_t>(ans.begin(), ans.end()), at::kLong).to(at::kBool));
  }
  return b;
}

struct StepResult {
  double loss;        // the batch's weighted loss
  double answer_acc;  // answer-token accuracy of the batch
};

// One optimizer step on a batch at the schedule's learning rate of r.step (not advanced here).
StepResult train_step(Run& r, const Batch& b) {
  const Options& o = r.o;
  const int64_t T = b.T;
  at::Tensor ids = b.ids.to(r.dev);
  at::Tensor logits = r.model->forward_train(ids.narrow(1, 0, T - 1));  // predicts tokens 1..T-1
  at::Tensor labels = ids.narrow(1, 1, T - 1);
  at::Tensor wl = b.w.narrow(1, 1, T - 1).to(r.dev);
  at::Tensor nll = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}),
                                          {}, at::Reduction::None).view({b.n, T - 1});
  at::Tensor loss = (nll * wl).sum() / wl.sum().clamp_min(1e-6);
  for (auto& g : r.opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(
      lr_at(r.step, r.total_steps, o.warmup, o.lr, o.min_lr));
  r.opt.zero_grad();
  loss.backward();
  torch::nn::utils::clip_grad_norm_(r.model->parameters(), o.clip);
  r.opt.step();

  // Answer-token accuracy of this batch (teacher-forced argmax), a cheap training signal.
  at::Tensor ans_mask = b.is_ans.narrow(1, 1, T - 1).to(r.dev);
  const double n_ans = ans_mask.sum().item<double>();
  const double ans_acc =
      n_ans > 0 ? (logits.detach().argmax(-1).eq(labels) & ans_mask).sum().item<double>() / n_ans : 0.0;
  return {loss.item<double>(), ans_acc};
}

// The steps from r.step to the curriculum's end: progress on stderr, one line a step in
// <out>/train.log, held-out accuracy every --eval-every steps, a checkpoint every --save-every.
void train(Run& r) {
  const Options& o = r.o;
  const int64_t pad = r.cfg.eos_token_ids.empty() ? 0 : r.cfg.eos_token_ids.front();
  std::ofstream log(o.out + "/train.log", std::ios::app);
  double wsum = 0;
  for (auto& m : r.mix) wsum += m.second;
  auto counter = wm::llmdata::token_counter(r.tok);

  wm::cli::ProgressLine progress(30);
  r.model->train();
  const auto t0 = std::chrono::steady_clock::now();
  double ema_loss = -1, ema_ans = -1;
  int64_t tokens_seen = 0;
  while (r.step < r.total_steps) {
    const Stage stage = stage_at(r.stages, r.step);
    const int64_t context = context_at(stage, o.seed, r.step);
    const Batch batch = make_batch(r, wsum, counter, pad, context);
    const StepResult res = train_step(r, batch);
    const double lv = res.loss, ans_acc = res.answer_acc;
    ema_loss = ema_loss < 0 ? lv : 0.95 * ema_loss + 0.05 * lv;
    ema_ans = ema_ans < 0 ? ans_acc : 0.95 * ema_ans + 0.05 * ans_acc;
    tokens_seen += batch.n * batch.T;
    const int64_t step = ++r.step;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress.show(step == r.total_steps, "wm_llm_train: step %lld/%lld ctx %lld loss %.4f answer-token acc %.3f  %.0f tokens/s  %.0f s",
                  static_cast<long long>(step), static_cast<long long>(r.total_steps), static_cast<long long>(context),
                  ema_loss, ema_ans, tokens_seen / el, el);
    log << nlohmann::json{{"step", step}, {"context", context}, {"loss", lv}, {"answer_token_acc", ans_acc},
                          {"elapsed_s", el}}.dump() << "\n";
    if (step % o.eval_every == 0 || step == r.total_steps) {
      const auto acc = evaluate(r, counter, stage.context);
      progress.finish();
      std::fprintf(stderr, "wm_llm_train: step %lld held-out answer accuracy at %lld tokens: %s\n",
                   static_cast<long long>(step), static_cast<long long>(stage.context), acc.dump().c_str());
      log << nlohmann::json{{"step", step}, {"context", stage.context}, {"heldout_accuracy", acc}}.dump() << "\n";
    }
    log.flush();
    if (step % o.save_every == 0 || step == r.total_steps) write_checkpoint(r);
  }
  progress.finish();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_llm_train: train the tiny decoder on the long-context text tasks"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();

  // The folders of --out this run creates: removed again when the run fails before it wrote
  // anything into them (kept once it succeeds).
  wm::cli::MadeFolders made_out;
  try {
    wm::init_threads(o.threads);
    wm::keep_freed_memory();
    const at::Device dev = wm::parse_device(o.device);
    if (o.min_lr > o.lr) throw wm::Error("--min-lr must not exceed --lr");
    const auto stages = parse_curriculum(o.curriculum);
    const Mix mix = parse_mix(o.tasks);
    int64_t total_steps = 0;
    for (const auto& s : stages) total_steps += s.steps;
    made_out.make(o.out, "--out");
    const std::string ckpt = o.out + "/checkpoint";
    if (o.resume && !fs::exists(ckpt) && fs::exists(ckpt + ".old")) fs::rename(ckpt + ".old", ckpt);
    if (o.resume && !fs::exists(ckpt + "/trainer_state.json"))
      throw wm::Error(wm::str_cat("--resume: no checkpoint in ", ckpt));

    const wm::llm::Tokenizer tok = make_tokenizer(o, ckpt);
    const std::string from = o.resume ? ckpt : o.init_from;  // a folder the model comes from, or none
    std::optional<wm::llm::HfFolder> folder;
    if (!from.empty()) folder = wm::llm::HfFolder::open(from);
    wm::llm::LlmConfig cfg = model_config(o, from, folder, tok);
    wm::llm::LlmModel model = make_model(o, folder, cfg, dev);
    int64_t params = 0;
    for (const auto& p : model->parameters()) params += p.numel();
    torch::optim::AdamW opt(param_groups(*model, o));
    const int64_t step = o.resume ? resume_checkpoint(opt, ckpt, total_steps, o) : 0;
    std::fprintf(stderr, "wm_llm_train: %lld parameters, vocab %lld, %d layers x %lld, on %s; %lld steps%s\n",
                 static_cast<long long>(params), static_cast<long long>(cfg.vocab_size),
                 static_cast<int>(cfg.num_hidden_layers), static_cast<long long>(cfg.hidden_size),
                 wm::describe_device(dev).c_str(), static_cast<long long>(total_steps),
                 o.resume ? wm::str_cat(", resuming at ", step).c_str()
                          : o.init_from.empty() ? "" : wm::str_cat(", starting from ", o.init_from).c_str());

    Run run{o, stages, mix, total_steps, dev, tok, cfg, model, opt, ckpt, step};
    train(run);
    save_model(o.out, *model, tok);
    made_out.keep();
    std::fprintf(stderr, "wm_llm_train: done; model in %s\n", o.out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_llm_train: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "wm_llm_train: error: an unknown failure\n");
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_llm_train
