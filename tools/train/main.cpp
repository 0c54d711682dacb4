// wm_train: trains the world model from scratch on fresh scenes of the procedural world.
// Teacher forcing with clean context, on windows shaped like those met at inference
// (sink | chunks retrieved by pose | recent | the chunk being denoised), rectified-flow
// velocity loss. Progress with loss, periodic checkpoints (EMA weights + resumable state), and
// a memory probe on unseen scenes: one-chunk-ahead PSNR with and without the retrieved chunks.
#include <CLI/CLI.hpp>
#include <torch/types.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "dit/codec.h"
#include "dit/config.h"
#include "dit/model.h"
#include "dit/sampler.h"
#include "dit/weights.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/progress.h"
#include "tools/cli/validators.h"
#include "tools/train/run_log.h"
#include "tools/media/metrics.h"
#include "tools/train/data.h"
#include "tools/world/rng.h"
#include "worldkv/world_memory.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string config = "configs/tiny.json";
  std::string out = "runs/tiny";
  int64_t steps = 20000;
  double minutes = 0;
  double lr = 3e-4;
  int64_t warmup = 300;
  int noisy = 2;
  uint64_t seed = 1;
  bool resume = false;
  int64_t ckpt_every = 250;
  int64_t eval_every = 1000;
  int eval_samples = 8;
  double ema = 0.999;
  int threads = 0;
  int data_threads = 0;  // samples made ahead on worker threads (0: in the training loop)
  std::string device = "auto";
  double ctx_noise_prob = 0.3;
  double ctx_noise_max = 0.1;
  double sliding_prob = 0.0;
  double self_ctx_prob = 0.0;
  double compress_prob = 0.0;
  double compress_keep = 0.25;
  double reference_lr = 10.0;
  int self_ctx_chunks = 2;
  std::vector<double> self_ctx_timesteps{1.0, 0.5};
  std::vector<double> timesteps{1.0, 0.75, 0.5, 0.25};  // the probe's sampler
  std::string init;       // start from these weights
  std::string eval_only;  // no training: probe this model file
};

// Frames [a, b) of a per-frame tensor.
at::Tensor frames(const at::Tensor& t, int64_t a, int64_t b) { return t.narrow(0, a, b - a); }

// The teacher-forcing input for a sample: [S-1 clean chunks ; the last K chunks noisy].
struct Batch {
  at::Tensor x, t, frame_index, pose, action, bias, target;
  at::Tensor reference;  // [frames of x, C + 1, h, w] (warp_reference models): zeros on the context
  int64_t noisy_from;  // first frame of the noisy part in x
};

Batch make_batch(const wm::train::Sample& s, const wm::dit::DitConfig& cfg, int K, double ctx_noise_prob,
                 double ctx_noise_max, at::Generator& gen, at::Device dev, const at::Tensor* fixed_noise = nullptr, double fixed_t = -1) {
  const int F = cfg.frames_per_chunk;
  const int S = static_cast<int>(s.chunks.size());
  K = std::min(K, S);
  const int64_t C = (S - 1) * F, N0 = (S - K) * F, T = S * F;
  at::Tensor x0 = s.latents.to(dev);
  at::Tensor ctx = frames(x0, 0, C);
  at::Tensor src = frames(x0, N0, T);
  at::Tensor noise = fixed_noise ? *fixed_noise : wm::dit::seeded_noise(src.sizes(), gen, dev);
  // Per noisy chunk, t (or fixed), repeated over its frames: mostly near the sampler's steps
  // (1, 0.75, 0.5, 0.25, jittered by +-0.05), where the few-step sampler evaluates the model,
  // else U(0.02, 1). Small t, which the sampler never visits, would dominate a v-prediction loss.
  at::Tensor tk;
  if (fixed_t >= 0) {
    tk = at::full({K}, fixed_t);
  } else {
    at::Tensor step = (at::randint(0, 4, {K}, gen).to(at::kFloat) * -0.25 + 1.0) + (at::rand({K}, gen) - 0.5) * 0.1;
    at::Tensor uni = at::rand({K}, gen) * 0.98 + 0.02;
    tk = at::where(at::rand({K}, gen) < 0.8, step, uni).clamp(0.02, 1.0);
  }
  at::Tensor tn = tk.repeat_interleave(F).to(dev);
  at::Tensor xn = (1 - tn).view({-1, 1, 1, 1}) * src + tn.view({-1, 1, 1, 1}) * noise;
  at::Tensor tc = at::zeros({C});
  if (C > 0 && ctx_noise_prob > 0) {
    // Light noise on some context chunks (labelled with their t) so that the model copes with
    // its own imperfect past frames.
    at::Tensor u = at::rand({S - 1}, gen), lvl = at::rand({S - 1}, gen) * ctx_noise_max;
    tc = at::where(u < ctx_noise_prob, lvl, at::zeros_like(lvl)).repeat_interleave(F);
    at::Tensor tcd = tc.to(dev).view({-1, 1, 1, 1});
    ctx = (1 - tcd) * ctx + tcd * wm::dit::seeded_noise(ctx.sizes(), gen, dev);
  }
  Batch b;
  b.x = at::cat({ctx, xn});
  b.t = at::cat({tc, tn.cpu()}).to(dev);
  auto pick = [&](const at::Tensor& a) { return at::cat({frames(a, 0, C), frames(a, N0, T)}).to(dev); };
  b.frame_index = at::cat({frames(s.frame_index, 0, C), frames(s.frame_index, N0, T)});
  b.pose = pick(s.pose);
  b.action = pick(s.action);
  b.bias = wm::dit::chunk_visibility_bias(wm::train::visibility(S, K), cfg.tokens_per_chunk(), dev);
  b.target = noise - src;
  b.noisy_from = C;
  if (cfg.cond.warp_reference) {
    // Each noisy chunk's reference: the last frame of the clean chunk before it, as the model fed
    // it (light noise included), turned to the chunk's yaws, when that frame directly precedes
    // the chunk (a window's sink or retrieved chunks do not); else none, as at inference the
    // refill pass and the context chunks have none.
    const int64_t Ch = x0.size(1), h = x0.size(2), w = x0.size(3);
    b.reference = at::zeros({C + K * F, Ch + 1, h, w}, x0.options());
    for (int k = 0; k < K; ++k) {
      const int64_t c = S - K + k, f0 = c * F;
      if (c < 1 || s.frame_index[f0 - 1].item<int64_t>() + 1 != s.frame_index[f0].item<int64_t>()) continue;
      at::Tensor ref = wm::dit::warp_reference(ctx[f0 - 1], s.pose[f0 - 1][2].item<double>(),
                                               frames(s.pose, f0, f0 + F).select(1, 2), cfg.cond);
      b.reference.narrow(0, C + k * F, F).copy_(ref);
    }
  }
  return b;
}

at::Tensor forward(wm::dit::CausalDit& model, const Batch& b) {
  wm::dit::SequenceOptions so;
  so.frame_index = b.frame_index;
  so.attn_bias = b.bias;
  wm::dit::FrameCond cond{b.pose, b.action, b.reference};
  return model->forward_sequence(b.x, b.t, cond, so);
}

// One-chunk-ahead prediction of the sample's target by the sampler sc, from its clean
// context (all of it, or all but the retrieved chunks: the sink and recent). Returns its latents.
at::Tensor predict_target_latents(wm::dit::CausalDit& model, wm::train::Sample s, bool keep_retrieved,
                                  uint64_t noise_seed, const wm::dit::SamplerConfig& sc, at::Device dev) {
  const int F = model->config().frames_per_chunk;
  if (!keep_retrieved && s.retrieved_end > s.retrieved_begin) {
    std::vector<int64_t> keep;
    std::vector<int> chunks;
    for (int j = 0; j < static_cast<int>(s.chunks.size()); ++j) {
      if (j >= s.retrieved_begin && j < s.retrieved_end) continue;
      chunks.push_back(s.chunks[j]);
      for (int f = 0; f < F; ++f) keep.push_back(j * F + f);
    }
    at::Tensor idx = at::tensor(keep, at::kLong);
    s.latents = s.latents.index_select(0, idx);
    s.frame_index = s.frame_index.index_select(0, idx);
    s.pose = s.pose.index_select(0, idx);
    s.action = s.action.index_select(0, idx);
    s.chunks = chunks;
    s.retrieved_begin = s.retrieved_end = 0;
  }
  at::Generator gen = at::detail::createCPUGenerator(noise_seed);
  const int S = static_cast<int>(s.chunks.size());
  at::Tensor noise = wm::dit::seeded_noise({F, s.latents.size(1), s.latents.size(2), s.latents.size(3)}, gen, dev);
  auto denoise = [&](const at::Tensor& x_t, double t) {
    Batch b = make_batch(s, model->config(), 1, 0.0, 0.0, gen, dev, &x_t, t);
    b.x = at::cat({b.x.narrow(0, 0, b.noisy_from), x_t});
    return forward(model, b).narrow(0, (S - 1) * F, F);
  };
  return wm::dit::sample_flow(noise, sc, denoise);
}

std::vector<wm::Image> predict_target(wm::dit::CausalDit& model, wm::dit::Codec& codec, const wm::train::Sample& s,
                                      bool keep_retrieved, uint64_t noise_seed, const wm::dit::SamplerConfig& sc,
                                      at::Device dev) {
  codec.reset();  // a clip of its own
  return codec.decode_images(predict_target_latents(model, s, keep_retrieved, noise_seed, sc, dev));
}

// Self-generated context: the last n context chunks of s (those just before the target) become
// the model's own predictions, each from the chunks before it, the earlier ones already
// generated, as in a rollout. The target stays the ground truth, so the model learns to draw
// the world from context as imperfect as its own. No autograd.
void self_context(wm::dit::CausalDit& model, wm::train::Sample& s, int n, uint64_t noise_seed,
                  const wm::dit::SamplerConfig& sc, at::Device dev) {
  at::NoGradGuard ng;
  const int F = model->config().frames_per_chunk;
  const int S = static_cast<int>(s.chunks.size());
  s.latents = s.latents.clone();  // written below; earlier copies of the sample keep theirs
  for (int j = std::max(1, S - 1 - n); j < S - 1; ++j) {
    wm::train::Sample p = s;
    const int64_t T = (j + 1) * F;
    p.latents = s.latents.narrow(0, 0, T);
    p.frame_index = s.frame_index.narrow(0, 0, T);
    p.pose = s.pose.narrow(0, 0, T);
    p.action = s.action.narrow(0, 0, T);
    p.chunks.resize(j + 1);
    at::Tensor x = predict_target_latents(model, p, true, noise_seed + j, sc, dev).to(at::kCPU, at::kFloat);
    s.latents.narrow(0, j * F, F).copy_(x);
  }
}

struct EvalResult {
  double psnr_full = 0, psnr_nomem = 0, psnr_repeat = 0;
  double psnr_warp = 0;  // warp_reference models: the last context frame turned, repeated where it does not see
  int n = 0;
};

EvalResult evaluate(wm::dit::CausalDit& model, wm::dit::Codec& codec, int n, uint64_t seed,
                    const wm::dit::SamplerConfig& sc, at::Device dev) {
  at::NoGradGuard ng;
  const bool was_training = model->is_training();
  model->eval();
  wm::train::SampleOptions so;
  so.revisit_prob = 1.0;
  so.random_ctx_prob = 0.0;
  EvalResult r;
  for (uint64_t k = 0; r.n < n && k < static_cast<uint64_t>(n) * 4; ++k) {
    wm::train::Sample s = make_sample(wm::world::hash_combine(seed, 0xE7A1000 + k), model->config(), codec, so);
    if (!s.revisit) continue;
    const int F = model->config().frames_per_chunk;
    // The rendered frames, not their codec round trip: a lossy codec's figures compare with
    // the pixel-patch codec's (whose round trip is exact).
    const int64_t T = s.frames.size(0);
    std::vector<wm::Image> truth = wm::dit::tensor_to_images(s.frames.narrow(0, T - F, F));
    std::vector<wm::Image> last = wm::dit::tensor_to_images(s.frames.narrow(0, T - F - 1, 1));
    auto full = predict_target(model, codec, s, true, 1000 + k, sc, dev);
    auto nomem = predict_target(model, codec, s, false, 1000 + k, sc, dev);
    std::vector<wm::Image> turned;
    if (model->config().cond.warp_reference) {
      // The last context frame's latents turned to each target frame's yaw (what a
      // reference_residual model draws when its head outputs zero), its own columns where the
      // turn leaves them unseen.
      const int64_t C = s.latents.size(1);
      at::Tensor src = s.latents[T - F - 1];
      at::Tensor ref = wm::dit::warp_reference(src, s.pose[T - F - 1][2].item<double>(),
                                               s.pose.narrow(0, T - F, F).select(1, 2), model->config().cond);
      at::Tensor mask = ref.narrow(1, C, 1);
      codec.reset();
      turned = codec.decode_images(ref.narrow(1, 0, C) + (1 - mask) * src.unsqueeze(0));
    }
    // Capped as in the revisit benchmark (wm::media::kPsnrCap): a camera standing still makes the
    // repeated frame identical to the truth (infinite PSNR).
    const auto psnr = wm::media::capped_psnr;
    for (int f = 0; f < F; ++f) {
      r.psnr_full += psnr(full[f], truth[f]) / F;
      r.psnr_nomem += psnr(nomem[f], truth[f]) / F;
      r.psnr_repeat += psnr(last[0], truth[f]) / F;
      if (!turned.empty()) r.psnr_warp += psnr(turned[f], truth[f]) / F;
    }
    ++r.n;
  }
  if (r.n > 0) {
    r.psnr_full /= r.n;
    r.psnr_nomem /= r.n;
    r.psnr_repeat /= r.n;
    r.psnr_warp /= r.n;
  }
  if (was_training) model->train();
  return r;
}

// Chunks a sliding-window sample's context holds (for --sliding's help): the memory's
// sliding_window layout, default sizes.
size_t sliding_context_chunks() {
  const wm::worldkv::MemoryConfig mc = wm::train::window_config(wm::train::SampleOptions{}, wm::dit::DitConfig{}, true);
  return wm::worldkv::window_chunks(mc, int64_t{1} << 20).recent.size();
}

void add_options(CLI::App& app, Args& a) {
  app.add_option("--config", a.config, "model config JSON")->check(CLI::ExistingFile);
  app.add_option("--out", a.out, "run folder: checkpoints, log, final model");
  app.add_option("--steps", a.steps, "optimizer steps in all")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--minutes", a.minutes, "stop (with a checkpoint) after this wall time; 0: no limit")
      ->check(wm::cli::FiniteNonNegative);
  app.add_option("--lr", a.lr, "peak learning rate (AdamW)")->check(wm::cli::FiniteRange(1e-8, 1.0));
  app.add_option("--warmup", a.warmup, "linear warm-up steps; cosine decay to 10% after")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--noisy", a.noisy, "noisy chunks per sample (the target and the ones before it)")->check(CLI::Range(1, 16));
  app.add_option("--seed", a.seed, "seed of the initialisation and of every sample");
  auto* resume_opt = app.add_flag("--resume", a.resume, "continue from OUT/last.* if present");
  app.add_option("--ckpt-every", a.ckpt_every, "steps between checkpoints")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--eval-every", a.eval_every, "steps between memory probes (0: only at the end)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--eval-samples", a.eval_samples, "revisit samples per probe")->check(CLI::Range(1, 100000));
  app.add_option("--ema", a.ema, "EMA decay of the saved weights")->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--threads", a.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--device", a.device, "auto, cpu, cuda, cuda:N");
  app.add_option("--data-threads", a.data_threads,
                 "make the next steps' samples on this many worker threads while a step trains (0: none; the "
                 "samples, and so the run, are the same either way)")
      ->check(CLI::Range(0, 64));
  app.add_option("--ctx-noise", a.ctx_noise_prob, "probability of light noise on a context chunk")
      ->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--ctx-noise-max", a.ctx_noise_max, "that noise's t is drawn from U(0, this)")
      ->check(wm::cli::FiniteRange(0.0, 0.9));
  app.add_option("--sliding", a.sliding_prob,
                 wm::str_cat("fraction of samples whose context is the ", sliding_context_chunks(),
                             " chunks just before the target (a sliding window, no sink)"))
      ->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--self-ctx", a.self_ctx_prob,
                 "fraction of samples whose last context chunks are the model's own predictions")
      ->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--self-ctx-chunks", a.self_ctx_chunks, "how many context chunks (before the target) it generates")
      ->check(CLI::Range(1, 5));
  app.add_option("--self-ctx-timesteps", a.self_ctx_timesteps, "the sampler that generates them")
      ->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--compress-ctx", a.compress_prob,
                 "fraction of samples whose retrieved chunks lose the tokens worldkv_c compression leaves out "
                 "(its drop rule, ranked on latent patches)")
      ->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--compress-keep", a.compress_keep, "the fraction of non-anchor tokens they keep")
      ->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--reference-lr", a.reference_lr,
                 "a warp_reference model's reference_embedding learns at this multiple of --lr (it starts at zero)")
      ->check(wm::cli::FiniteRange(0.0, 1000.0));
  app.add_option("--timesteps", a.timesteps, "the memory probe's sampler timesteps, descending in (0, 1]")
      ->check(wm::cli::FiniteRange(0.0, 1.0));
  auto* init_opt = app.add_option("--init", a.init,
                                  "start from these weights (e.g. the shipped model) instead of a fresh initialisation; tensors whose "
                                  "shape differs (another codec's patch embedding and head) start fresh")
                       ->check(CLI::ExistingFile);
  app.add_option("--eval-only", a.eval_only,
                 "no training: run the memory probe (--eval-samples unseen revisits) on this model file")
      ->check(CLI::ExistingFile)->excludes(resume_opt)->excludes(init_opt);
  app.footer("Checkpoints are written whole (a temporary name, then a rename): an interrupted run leaves the "
             "previous checkpoint intact, and at most hidden .part files beside it.");
}

// The samplers of the memory probe (--timesteps) and of self-generated context
// (--self-ctx-timesteps); a bad list is rejected here, before any work.
struct Samplers {
  wm::dit::SamplerConfig probe, self_ctx;
};

Samplers make_samplers(const Args& a) {
  Samplers s;
  s.probe.timesteps = a.timesteps;
  wm::dit::flow_schedule(s.probe);
  s.self_ctx.timesteps = a.self_ctx_timesteps;
  wm::dit::flow_schedule(s.self_ctx);
  return s;
}

uint64_t probe_seed(const Args& a) { return a.seed ^ 0x5EED5EEDull; }

// --eval-only: the memory probe on a saved model, printed to stdout.
void run_probe_only(const Args& a, const Samplers& samplers, at::Device dev) {
  wm::dit::CausalDit m = wm::dit::load_model(a.eval_only, dev);
  auto codec = wm::dit::make_codec(m->config());
  EvalResult r = evaluate(m, *codec, a.eval_samples, probe_seed(a), samplers.probe, dev);
  std::printf("%s: one-chunk-ahead PSNR on %d unseen revisit chunks (ground-truth context; per frame, capped at %.0f dB):\n"
              "  full window (sink, retrieved, recent) %.2f dB\n  sink + recent only            %.2f dB\n"
              "  repeat the last context frame      %.2f dB\n",
              a.eval_only.c_str(), r.n, wm::media::kPsnrCap, r.psnr_full, r.psnr_nomem, r.psnr_repeat);
  if (m->config().cond.warp_reference)
    std::printf("  turn the last context frame (warp)  %.2f dB\n", r.psnr_warp);
}

// The files of a run folder.
struct RunFiles {
  std::string last, last_ema, last_opt, state, log;
  explicit RunFiles(const std::string& out)
      : last(out + "/last.safetensors"),
        last_ema(out + "/model.safetensors"),
        last_opt(out + "/last.optim.pt"),
        state(out + "/state.json"),
        log(out + "/log.jsonl") {}
};

// What training changes: the model, its EMA copy (the weights saved as the model), the optimizer
// and the step count.
struct TrainState {
  wm::dit::CausalDit model, ema;
  std::unique_ptr<torch::optim::AdamW> opt;
  std::vector<double> lr_mult;  // per parameter group: its learning rate over the schedule's
  int64_t step = 0;
  double wall_before = 0;  // seconds trained before this process (a resumed run)
};

// --init: the weights of another model. Tensors of the same name and shape are copied; the
// others (another codec's patch embedding and head, say) keep their fresh initialisation and are
// named on stderr. A head trained for another prediction starts from zero.
void load_init_weights(const Args& a, const wm::dit::DitConfig& cfg, wm::dit::CausalDit& model) {
  const wm::dit::DitConfig from_cfg = wm::dit::config_from_weights(a.init);
  wm::dit::CausalDit from(from_cfg);
  wm::dit::load_weights(*from, a.init);
  from->to(model->patch_embedding->weight.device());
  const wm::dit::InitReport rep = wm::dit::init_from(*from, *model);
  if (rep.copied == 0)
    throw wm::Error(wm::str_cat("--init: ", a.init, " has no tensor of the shape ", a.config, " gives it"));
  std::cerr << "wm_train: starting from " << a.init << " (" << rep.copied << " tensors)\n";
  if (!rep.fresh.empty()) {
    std::cerr << "wm_train: " << rep.fresh.size() << " tensors are not in it (or in another shape) and start fresh:";
    for (const auto& n : rep.fresh) std::cerr << " " << n;
    std::cerr << "\n";
  }
  if (from_cfg.prediction != cfg.prediction) {
    // The head's output changes meaning: start it from zero, as a fresh model does.
    at::NoGradGuard ng;
    for (auto& p : model->head->head->parameters()) p.zero_();
    std::cerr << "wm_train: " << a.init << " predicts " << wm::dit::prediction_name(from_cfg.prediction) << ", "
              << a.config << " " << wm::dit::prediction_name(cfg.prediction) << ": head.head starts from zero\n";
  }
}

// The state to train from: resumed from the run folder (--resume, when it holds a checkpoint),
// or fresh: seeded, or --init's weights, the EMA a copy. Throws wm::Error if a resumed run is
// already at --steps.
TrainState start_state(const Args& a, const wm::dit::DitConfig& cfg, const RunFiles& files, at::Device dev) {
  TrainState st{wm::dit::CausalDit(cfg), nullptr, nullptr};
  st.model->init_weights(a.seed, /*zero_head=*/true);
  st.model->to(dev);
  st.ema = wm::dit::CausalDit(cfg);
  st.ema->to(dev);
  // One parameter group, and a second one for a warp_reference model's reference_embedding: it
  // starts at zero and learns at --reference-lr times the rate.
  const auto opts = torch::optim::AdamWOptions(a.lr).betas({0.9, 0.99}).weight_decay(0.01);
  std::vector<at::Tensor> body, reference;
  for (auto& p : st.model->named_parameters(true))
    (p.key().rfind("reference_embedding.", 0) == 0 ? reference : body).push_back(p.value());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(body, std::make_unique<torch::optim::AdamWOptions>(opts));
  st.lr_mult = {1.0};
  if (!reference.empty()) {
    groups.emplace_back(reference, std::make_unique<torch::optim::AdamWOptions>(opts));
    st.lr_mult.push_back(a.reference_lr);
  }
  st.opt = std::make_unique<torch::optim::AdamW>(std::move(groups), opts);
  if (a.resume && fs::exists(files.last) && fs::exists(files.state)) {
    wm::dit::load_weights(*st.model, files.last);
    wm::dit::load_weights(*st.ema, files.last_ema);
    torch::load(*st.opt, files.last_opt);
    std::ifstream f(files.state);
    nlohmann::json state = nlohmann::json::parse(f);
    st.step = state.at("step").get<int64_t>();
    st.wall_before = state.value("wall_seconds", 0.0);
    if (st.step >= a.steps)
      throw wm::Error(wm::str_cat("--resume: the run in ", a.out, " is at step ", st.step, " already; raise --steps (",
                                  a.steps, ") to train on"));
    std::cerr << "wm_train: resumed at step " << st.step << " from " << a.out << "\n";
  } else {
    if (!a.init.empty()) load_init_weights(a, cfg, st.model);
    at::NoGradGuard ng;
    auto src = st.model->parameters(), dst = st.ema->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  st.ema->eval();
  for (auto& p : st.ema->parameters()) p.set_requires_grad(false);
  return st;
}

// Writes the checkpoint (weights, EMA weights, optimizer, state), each file whole.
void save_checkpoint(const Args& a, TrainState& st, const RunFiles& files, double wall_seconds, bool final_save) {
  std::map<std::string, std::string> meta = {{"step", std::to_string(st.step)}, {"trainer", "wm_train"}};
  wm::dit::save_weights(*st.model, files.last, meta);
  wm::dit::save_weights(*st.ema, files.last_ema, meta);
  wm::cli::OutputPath opt_file(files.last_opt);
  torch::save(*st.opt, opt_file.tmp());
  opt_file.commit();
  wm::cli::OutputFile f(files.state);
  f.stream() << nlohmann::json{{"step", st.step}, {"config", a.config}, {"seed", a.seed}, {"final", final_save},
                               {"wall_seconds", wall_seconds}}
                    .dump(2);
  f.commit();
}

struct StepResult {
  double loss = 0, lr = 0;
  double data_s = 0, model_s = 0;  // seconds making the sample and in the training pass
};

// The seed of step k's sample: everything about it follows from --seed and k.
uint64_t sample_seed(const Args& a, int64_t step) {
  return wm::world::hash_combine(a.seed, static_cast<uint64_t>(step));
}

// One optimizer step on the sample of st.step (everything about it follows from --seed and the
// step), then the EMA update. Throws wm::Error if the loss is not finite.
StepResult train_step(const Args& a, TrainState& st, const wm::dit::DitConfig& cfg,
                      wm::train::SamplePrefetcher& samples, const Samplers& samplers, at::Device dev) {
  StepResult out;
  const auto t_data = Clock::now();
  const uint64_t sseed = sample_seed(a, st.step);
  at::Generator gen = at::detail::createCPUGenerator(sseed);
  wm::train::Sample s = samples.take(st.step);
  if (a.self_ctx_prob > 0 && at::rand({1}, gen).item<double>() < a.self_ctx_prob)
    self_context(st.model, s, a.self_ctx_chunks, sseed, samplers.self_ctx, dev);
  Batch b = make_batch(s, cfg, a.noisy, a.ctx_noise_prob, a.ctx_noise_max, gen, dev);
  if (a.compress_prob > 0 && at::rand({1}, gen).item<double>() < a.compress_prob)
    wm::train::hide_compressed_tokens(b.bias, s, cfg, a.compress_keep);
  const auto t_model = Clock::now();
  out.data_s = std::chrono::duration<double>(t_model - t_data).count();
  at::Tensor v = forward(st.model, b);
  at::Tensor err = v.narrow(0, b.noisy_from, v.size(0) - b.noisy_from) - b.target;
  if (cfg.prediction == wm::dit::Prediction::X0) {
    // Velocity loss, its weight 1 / t^2 on the x0 error capped at t = 0.25 (the sampler's
    // last step): below that it would dwarf every other t.
    at::Tensor tn = b.t.narrow(0, b.noisy_from, err.size(0)).to(at::kFloat);
    err = err * (tn / tn.clamp_min(0.25)).view({-1, 1, 1, 1});
  }
  at::Tensor loss = err.pow(2).mean();
  st.opt->zero_grad();
  loss.backward();
  torch::nn::utils::clip_grad_norm_(st.model->parameters(), 1.0);
  out.lr = wm::train::cosine_learning_rate(a.lr, a.warmup, a.steps, st.step);
  for (size_t i = 0; i < st.opt->param_groups().size(); ++i)
    static_cast<torch::optim::AdamWOptions&>(st.opt->param_groups()[i].options()).lr(out.lr * st.lr_mult.at(i));
  st.opt->step();
  {
    at::NoGradGuard ng;
    const double d = std::min(a.ema, (1.0 + st.step) / (10.0 + st.step));
    auto src = st.model->parameters(), dst = st.ema->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].mul_(d).add_(src[i], 1 - d);
  }
  out.loss = loss.item<double>();
  out.model_s = std::chrono::duration<double>(Clock::now() - t_model).count();
  WM_CHECK(std::isfinite(out.loss), "the loss is not finite at step ", st.step);
  ++st.step;
  return out;
}

// A memory probe's result, on stderr and in the log.
void report_probe(int64_t step, const EvalResult& r, std::ofstream& log) {
  char line[256];
  std::snprintf(line, sizeof line,
                "[eval %lld] one-chunk-ahead PSNR on %d unseen revisits: with memory %.2f dB, "
                "sink+recent only %.2f dB, repeat-last-frame %.2f dB\n",
                static_cast<long long>(step), r.n, r.psnr_full, r.psnr_nomem, r.psnr_repeat);
  std::cerr << line;
  log << nlohmann::json{{"step", step}, {"eval_psnr_memory", r.psnr_full}, {"eval_psnr_nomem", r.psnr_nomem},
                        {"eval_psnr_repeat", r.psnr_repeat}, {"eval_n", r.n}}
             .dump()
      << "\n";
  log.flush();
}

// Trains from --config (or resumes) into --out until --steps or --minutes, with checkpoints and
// memory probes on the way.
void train(const Args& a, const Samplers& samplers, at::Device dev) {
  const wm::dit::DitConfig cfg = wm::dit::load_config(a.config);
  auto codec = wm::dit::make_codec(cfg);
  {
    std::error_code ec;
    fs::create_directories(a.out, ec);
    if (ec) throw wm::Error("--out: cannot create the run folder " + a.out + ": " + ec.message());
  }
  const RunFiles files(a.out);
  TrainState st = start_state(a, cfg, files, dev);
  std::ofstream log = wm::train::open_log(files.log);
  int64_t nparams = 0;
  for (auto& p : st.model->parameters()) nparams += p.numel();
  std::cerr << "wm_train: " << cfg.name << ", " << nparams << " parameters, " << wm::describe_device(dev) << ", steps "
            << st.step << " -> " << a.steps << "\n";

  const auto t_start = Clock::now();
  double loss_ema = 0, data_s = 0, model_s = 0;
  int64_t ema_n = 0;
  wm::cli::ProgressLine status(30);
  wm::train::SampleOptions sopt;
  sopt.sliding_prob = a.sliding_prob;
  wm::train::SamplePrefetcher samples(
      a.data_threads, [&a](int64_t step) { return sample_seed(a, step); }, cfg, *codec, sopt);
  st.model->train();
  while (st.step < a.steps) {
    const StepResult r = train_step(a, st, cfg, samples, samplers, dev);
    data_s += r.data_s;
    model_s += r.model_s;
    loss_ema = ema_n == 0 ? r.loss : 0.98 * loss_ema + 0.02 * r.loss;
    ++ema_n;
    const int64_t step = st.step;
    const double el = std::chrono::duration<double>(Clock::now() - t_start).count();
    const double rate = ema_n / el;
    status.show(step == a.steps,
                "[%lld/%lld] loss %.4f  %.2f steps/s (samples %.0f ms, training pass %.0f ms)  elapsed %s  eta %s",
                static_cast<long long>(step), static_cast<long long>(a.steps), loss_ema, rate, 1e3 * data_s / ema_n,
                1e3 * model_s / ema_n, wm::train::fmt_duration(el).c_str(),
                wm::train::fmt_duration((a.steps - step) / std::max(rate, 1e-9)).c_str());
    log << nlohmann::json{{"step", step}, {"loss", r.loss}, {"lr", r.lr}, {"t", el}}.dump() << "\n";
    const bool out_of_time = a.minutes > 0 && el > a.minutes * 60;
    if (step % a.ckpt_every == 0 || step == a.steps || out_of_time)
      save_checkpoint(a, st, files, st.wall_before + std::chrono::duration<double>(Clock::now() - t_start).count(),
                      step == a.steps);
    if ((a.eval_every > 0 && step % a.eval_every == 0) || step == a.steps || out_of_time) {
      const EvalResult probed = evaluate(st.ema, *codec, a.eval_samples, probe_seed(a), samplers.probe, dev);
      status.finish();
      report_probe(step, probed, log);
    }
    if (out_of_time) {
      status.finish();
      std::cerr << "wm_train: time budget reached at step " << step << "; resume with --resume\n";
      break;
    }
  }
  status.finish();
  std::cerr << "wm_train: done; model (EMA) at " << files.last_ema << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_train: train the world model on the procedural world (teacher forcing, clean context)"};
  Args a;
  add_options(app, a);
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  try {
    wm::init_threads(a.threads);
    wm::keep_freed_memory();
    const at::Device dev = wm::parse_device(a.device);
    const Samplers samplers = make_samplers(a);
    if (!a.eval_only.empty())
      run_probe_only(a, samplers, dev);
    else
      train(a, samplers, dev);
  } catch (const std::exception& e) {
    std::cerr << "wm_train: error: " << wm::cli::error_text(e) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_train
