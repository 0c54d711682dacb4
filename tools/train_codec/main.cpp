// wm_train_codec: trains the learned codec of the embedded world model (dit/conv_ae.h) on frames
// of the procedural world: fresh scenes every step, reconstruction loss (MSE on [-1, 1] pixels)
// through latents that see a little noise, so that the decoder copes with the DiT's imperfect
// latents. In pieces: a whole checkpoint every --ckpt-every steps and at --minutes; --resume
// continues exactly (weights, EMA, optimizer, the step's data and noise). The EMA weights, with
// the latents' per-channel statistics measured on training frames, are OUT/codec.safetensors.
#include <CLI/CLI.hpp>
#include <torch/types.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dit/conv_ae.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/progress.h"
#include "tools/cli/validators.h"
#include "tools/train/run_log.h"
#include "tools/media/metrics.h"
#include "tools/world/raycaster.h"
#include "tools/world/rng.h"
#include "tools/world/suite.h"
#include "tools/world/trajectory.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_train_codec {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string out = "runs/codec";
  int64_t steps = 6000;
  double minutes = 0;
  int batch = 16;
  int frames_per_scene = 8;
  double lr = 1e-3;
  int64_t warmup = 200;
  double latent_noise = 0.1;
  double ema = 0.999;
  uint64_t seed = 1;
  bool resume = false;
  int64_t ckpt_every = 250;
  int64_t eval_every = 500;
  int eval_frames = 64;
  int latent_channels = 8;
  std::vector<int> widths{32, 64, 96};
  int image_size = 64;
  int threads = 0;
  std::string device = "auto";
  std::string eval_only;
};

// n frames [n, H, W, 3] uint8: frames_per_scene frames at random times of each of
// ceil(n / frames_per_scene) trajectories in fresh scenes, all drawn from `seed`.
at::Tensor render_frames(uint64_t seed, int n, int frames_per_scene, int size) {
  wm::world::Rng rng(seed);
  wm::world::TrajectoryOptions topt;
  topt.min_seconds = 4;
  topt.max_seconds = 12;
  topt.verify_psnr = false;
  topt.render.width = topt.render.height = size;
  at::Tensor out = at::empty({n, size, size, 3}, at::kByte);
  int k = 0;
  while (k < n) {
    const wm::world::Episode ep = wm::world::generate_episode(rng.fork(), topt);
    const wm::world::Scene scene = wm::world::scene_of(ep);
    const wm::world::Raycaster ray(scene, topt.render);
    for (int f = 0; f < frames_per_scene && k < n; ++f, ++k) {
      const wm::Image im = ray.render(ep.poses[rng.next() % ep.poses.size()]);
      std::memcpy(out[k].data_ptr<uint8_t>(), im.rgb.data(), im.rgb.size());
    }
  }
  return out;
}

uint64_t step_seed(const Args& a, int64_t step) { return wm::world::hash_combine(a.seed, static_cast<uint64_t>(step)); }
// Held-out frames: a seed space apart from every training step's.
uint64_t eval_seed(const Args& a) { return wm::world::hash_combine(a.seed ^ 0xC0DEC0DEull, 0xE7A1); }
uint64_t stats_seed(const Args& a) { return wm::world::hash_combine(a.seed ^ 0x57A75ull, 0x57A7); }

// Mean PSNR (per frame, capped as the benchmarks cap it) of the uint8 round trip of frames
// through the codec; and the worst frame.
struct Psnr {
  double mean = 0, worst = 0;
};

Psnr round_trip_psnr(wm::dit::ConvAeCodec& codec, const at::Tensor& frames) {
  at::Tensor back;
  for (int64_t i = 0; i < frames.size(0); i += 16) {
    const int64_t n = std::min<int64_t>(16, frames.size(0) - i);
    at::Tensor part = codec.decode(codec.encode(frames.narrow(0, i, n), at::kCPU));
    back = back.defined() ? at::cat({back, part}) : part;
  }
  Psnr p;
  p.worst = 1e9;
  const auto truth = wm::dit::tensor_to_images(frames), got = wm::dit::tensor_to_images(back);
  for (size_t i = 0; i < truth.size(); ++i) {
    const double v = wm::media::capped_psnr(got[i], truth[i]);
    p.mean += v / truth.size();
    p.worst = std::min(p.worst, v);
  }
  return p;
}

// The encoder's per-channel mean and standard deviation over frames, written into ae's buffers.
void measure_latent_stats(wm::dit::ConvAeImpl& ae, const at::Tensor& frames, at::Device dev) {
  at::NoGradGuard ng;
  at::Tensor z = ae.encode_raw(wm::dit::frames_to_unit(frames, dev));  // [N, C, h, w]
  at::Tensor zc = z.transpose(0, 1).reshape({z.size(1), -1});
  ae.latent_mean.copy_(zc.mean(1));
  ae.latent_std.copy_(zc.std(1).clamp_min(1e-4));
}

struct RunFiles {
  std::string last, codec, opt, state, log;
  explicit RunFiles(const std::string& out)
      : last(out + "/last.safetensors"),
        codec(out + "/codec.safetensors"),
        opt(out + "/last.optim.pt"),
        state(out + "/state.json"),
        log(out + "/log.jsonl") {}
};

wm::dit::ConvAeConfig codec_config(const Args& a) {
  wm::dit::ConvAeConfig c;
  c.latent_channels = a.latent_channels;
  c.widths = a.widths;
  c.image_height = c.image_width = a.image_size;
  c.validate();
  return c;
}

void run_eval_only(const Args& a, at::Device dev) {
  auto codec = wm::dit::ConvAeCodec::from_file(a.eval_only, dev);
  const at::Tensor frames = render_frames(eval_seed(a), a.eval_frames, 4, codec->image_height());
  const auto t0 = Clock::now();
  const Psnr p = round_trip_psnr(*codec, frames);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("%s: round trip of %d held-out frames (%d scenes): PSNR %.2f dB mean, %.2f dB worst frame; "
              "%.2f ms a frame (encode + decode)\n",
              a.eval_only.c_str(), a.eval_frames, (a.eval_frames + 3) / 4, p.mean, p.worst,
              1e3 * s / a.eval_frames);
}

// Copies the codec saved at `path` into dst (weights and latent statistics). Throws wm::Error
// when it was trained with another shape than cfg.
void load_into(wm::dit::ConvAe& dst, const std::string& path, const wm::dit::ConvAeConfig& cfg, at::Device dev) {
  wm::dit::ConvAe src = wm::dit::load_conv_ae(path, dev);
  WM_CHECK(wm::dit::conv_ae_config_json(src->config()) == wm::dit::conv_ae_config_json(cfg), path,
           " was trained with another codec shape (", wm::dit::conv_ae_config_json(src->config()),
           "); give the same --channels / --widths / --image-size");
  at::NoGradGuard ng;
  auto s = src->parameters(), d = dst->parameters();
  for (size_t i = 0; i < s.size(); ++i) d[i].copy_(s[i]);
  dst->latent_mean.copy_(src->latent_mean);
  dst->latent_std.copy_(src->latent_std);
}

// The step training starts at: with --resume and a run in the folder, the run's step, its model,
// EMA and optimizer loaded (*wall_before its training time so far); else 0, the EMA a copy of
// the model. Throws wm::Error when the run is at --steps already.
int64_t start_or_resume(const Args& a, const RunFiles& files, const wm::dit::ConvAeConfig& cfg, wm::dit::ConvAe& model,
              wm::dit::ConvAe& ema, torch::optim::AdamW& opt, at::Device dev, double* wall_before) {
  if (!(a.resume && fs::exists(files.last) && fs::exists(files.state))) {
    at::NoGradGuard ng;
    auto s = model->parameters(), d = ema->parameters();
    for (size_t i = 0; i < s.size(); ++i) d[i].copy_(s[i]);
    return 0;
  }
  load_into(model, files.last, cfg, dev);
  load_into(ema, files.codec, cfg, dev);
  torch::load(opt, files.opt);
  std::ifstream f(files.state);
  const nlohmann::json st = nlohmann::json::parse(f);
  const int64_t step = st.at("step").get<int64_t>();
  *wall_before = st.value("wall_seconds", 0.0);
  if (step >= a.steps)
    throw wm::Error(wm::str_cat("--resume: the run in ", a.out, " is at step ", step, " already; raise --steps (",
                                a.steps, ") to train on"));
  std::cerr << "wm_train_codec: resumed at step " << step << " from " << a.out << "\n";
  return step;
}

// One step on step `step`'s frames: the reconstruction loss (with noise on the latents when
// asked), an AdamW step at learning rate lr, then the EMA update. Returns the loss; *frames_done
// gets the time the frames were ready. Throws wm::Error when the loss is not finite.
double train_step(const Args& a, int64_t step, double lr, wm::dit::ConvAe& model, wm::dit::ConvAe& ema,
                  torch::optim::AdamW& opt, at::Device dev, Clock::time_point* frames_done) {
  const uint64_t seed = step_seed(a, step);
  const at::Tensor x = wm::dit::frames_to_unit(render_frames(seed, a.batch, a.frames_per_scene, a.image_size), dev);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  *frames_done = Clock::now();
  at::Tensor z = model->encode_raw(x);
  if (a.latent_noise > 0) {
    at::Tensor eps = at::randn(z.sizes(), gen, at::TensorOptions().dtype(at::kFloat)).to(dev);
    z = z + eps * (a.latent_noise * z.detach().std());
  }
  at::Tensor y = model->decode_raw(z);
  at::Tensor loss = (y - x).pow(2).mean();
  opt.zero_grad();
  loss.backward();
  torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
  opt.step();
  {
    at::NoGradGuard ng;
    const double d = std::min(a.ema, (1.0 + step) / (10.0 + step));
    auto s = model->parameters(), e = ema->parameters();
    for (size_t i = 0; i < s.size(); ++i) e[i].mul_(d).add_(s[i], 1 - d);
  }
  const double l = loss.item<double>();
  WM_CHECK(std::isfinite(l), "the loss is not finite at step ", step);
  return l;
}

void train(const Args& a, at::Device dev) {
  const wm::dit::ConvAeConfig cfg = codec_config(a);
  {
    std::error_code ec;
    fs::create_directories(a.out, ec);
    if (ec) throw wm::Error("--out: cannot create the run folder " + a.out + ": " + ec.message());
  }
  const RunFiles files(a.out);
  wm::dit::ConvAe model(cfg), ema(cfg);
  model->init_weights(a.seed);
  model->to(dev);
  ema->to(dev);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(a.lr).betas({0.9, 0.99}).weight_decay(0.0));
  double wall_before = 0;
  int64_t step = start_or_resume(a, files, cfg, model, ema, opt, dev, &wall_before);
  for (auto& p : ema->parameters()) p.set_requires_grad(false);
  std::ofstream log = wm::train::open_log(files.log);
  int64_t nparams = 0;
  for (auto& p : model->parameters()) nparams += p.numel();
  std::cerr << "wm_train_codec: " << cfg.latent_channels << " latent channels, stride " << cfg.stride() << ", "
            << nparams << " parameters, " << wm::describe_device(dev) << ", steps " << step << " -> " << a.steps
            << "\n";
  const at::Tensor eval_frames = render_frames(eval_seed(a), a.eval_frames, 4, a.image_size);
  const at::Tensor stat_frames = render_frames(stats_seed(a), 128, 4, a.image_size);

  auto save = [&](bool final_save, double wall) {
    measure_latent_stats(*ema, stat_frames, dev);
    const std::map<std::string, std::string> meta = {{"step", std::to_string(step)}, {"trainer", "wm_train_codec"}};
    wm::dit::save_conv_ae(*model, files.last, meta);
    wm::dit::save_conv_ae(*ema, files.codec, meta);
    wm::cli::OutputPath opt_file(files.opt);
    torch::save(opt, opt_file.tmp());
    opt_file.commit();
    wm::cli::OutputFile f(files.state);
    f.stream() << nlohmann::json{{"step", step}, {"seed", a.seed}, {"final", final_save}, {"wall_seconds", wall}}.dump(2);
    f.commit();
  };
  auto evaluate = [&]() {
    wm::dit::ConvAeCodec codec(ema, dev);  // shares ema's modules
    const Psnr p = round_trip_psnr(codec, eval_frames);
    char line[200];
    std::snprintf(line, sizeof line, "[eval %lld] round trip of %d held-out frames: PSNR %.2f dB mean, %.2f dB worst\n",
                  static_cast<long long>(step), a.eval_frames, p.mean, p.worst);
    std::cerr << line;
    log << nlohmann::json{{"step", step}, {"eval_psnr", p.mean}, {"eval_psnr_worst", p.worst}}.dump() << "\n";
    log.flush();
  };

  const auto t_start = Clock::now();
  double loss_ema = 0, data_s = 0, model_s = 0;
  int64_t n = 0;
  wm::cli::ProgressLine status(30);
  model->train();
  while (step < a.steps) {
    const auto t0 = Clock::now();
    auto t1 = t0;
    const double lr = wm::train::cosine_learning_rate(a.lr, a.warmup, a.steps, step);
    const double l = train_step(a, step, lr, model, ema, opt, dev, &t1);
    ++step;
    ++n;
    data_s += std::chrono::duration<double>(t1 - t0).count();
    model_s += std::chrono::duration<double>(Clock::now() - t1).count();
    loss_ema = n == 1 ? l : 0.98 * loss_ema + 0.02 * l;
    const double el = std::chrono::duration<double>(Clock::now() - t_start).count();
    const double rate = n / el;
    // PSNR of the loss (pixels in [-1, 1]: peak-to-peak 2)
    status.show(step == a.steps,
                "[%lld/%lld] loss %.5f (%.2f dB)  %.2f steps/s (frames %.0f ms, training pass %.0f ms)  elapsed %s  "
                "eta %s",
                static_cast<long long>(step), static_cast<long long>(a.steps), loss_ema,
                10 * std::log10(4.0 / std::max(loss_ema, 1e-12)), rate, 1e3 * data_s / n, 1e3 * model_s / n,
                wm::train::fmt_duration(el).c_str(), wm::train::fmt_duration((a.steps - step) / std::max(rate, 1e-9)).c_str());
    log << nlohmann::json{{"step", step}, {"loss", l}, {"lr", lr}, {"t", el}}.dump() << "\n";
    const bool out_of_time = a.minutes > 0 && el > a.minutes * 60;
    if (step % a.ckpt_every == 0 || step == a.steps || out_of_time)
      save(step == a.steps, wall_before + std::chrono::duration<double>(Clock::now() - t_start).count());
    if ((a.eval_every > 0 && step % a.eval_every == 0) || step == a.steps || out_of_time) {
      status.finish();
      evaluate();
    }
    if (out_of_time) {
      status.finish();
      std::cerr << "wm_train_codec: time budget reached at step " << step << "; continue with --resume\n";
      break;
    }
  }
  status.finish();
  std::cerr << "wm_train_codec: done; codec (EMA) at " << files.codec << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_train_codec: train the learned codec (a per-frame convolutional autoencoder) on the procedural "
               "world's frames"};
  Args a;
  app.add_option("--out", a.out, "run folder: checkpoints, log, OUT/codec.safetensors");
  app.add_option("--steps", a.steps, "optimizer steps in all")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--minutes", a.minutes, "stop (with a checkpoint) after this wall time; 0: no limit")
      ->check(wm::cli::FiniteNonNegative);
  app.add_option("--batch", a.batch, "frames per step")->check(CLI::Range(1, 4096));
  app.add_option("--frames-per-scene", a.frames_per_scene, "frames drawn from each fresh scene")->check(CLI::Range(1, 4096));
  app.add_option("--lr", a.lr, "peak learning rate (AdamW)")->check(wm::cli::FiniteRange(1e-8, 1.0));
  app.add_option("--warmup", a.warmup, "linear warm-up steps; cosine decay to 10% after")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--latent-noise", a.latent_noise,
                 "Gaussian noise added to the latents in training, as a fraction of their standard deviation")
      ->check(wm::cli::FiniteRange(0.0, 10.0));
  app.add_option("--ema", a.ema, "EMA decay of the saved weights")->check(wm::cli::FiniteRange(0.0, 1.0));
  app.add_option("--seed", a.seed, "seed of the initialisation, the frames and the noise");
  auto* resume_opt = app.add_flag("--resume", a.resume, "continue from OUT's checkpoint if present");
  app.add_option("--ckpt-every", a.ckpt_every, "steps between checkpoints")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--eval-every", a.eval_every, "steps between held-out PSNR checks (0: only at the end)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--eval-frames", a.eval_frames, "held-out frames of the check")->check(CLI::Range(1, 100000));
  app.add_option("--channels", a.latent_channels, "latent channels")->check(CLI::Range(1, 1024));
  app.add_option("--widths", a.widths, "channels per level, full resolution first (stride 2^(levels-1))")
      ->check(CLI::Range(1, 4096));
  app.add_option("--image-size", a.image_size, "frame side in pixels")->check(CLI::Range(8, 4096));
  app.add_option("--threads", a.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--device", a.device, "auto, cpu, cuda, cuda:N");
  app.add_option("--eval-only", a.eval_only, "no training: the held-out round-trip PSNR of this codec file")
      ->check(CLI::ExistingFile)
      ->excludes(resume_opt);
  app.footer("Checkpoints are written whole (a temporary name, then a rename): an interrupted run leaves the "
             "previous checkpoint intact.");
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  try {
    wm::init_threads(a.threads);
    wm::keep_freed_memory();
    const at::Device dev = wm::parse_device(a.device);
    if (!a.eval_only.empty())
      run_eval_only(a, dev);
    else
      train(a, dev);
  } catch (const std::exception& e) {
    std::cerr << "wm_train_codec: error: " << wm::cli::error_text(e) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_train_codec
