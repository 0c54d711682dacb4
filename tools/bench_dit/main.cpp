// wm_bench_dit: throughput of a causal DiT config with random weights. Each chunk runs the
// few-step sampler over the window, then the t = 0 refill pass whose K/V join the window.
//   wm_bench_dit --config configs/matrix-game-2.json --chunks 3
//   wm_bench_dit --config configs/tiny.json --chunks 16 --max-window-chunks 6
// Matrix-Game-2.0 at its real shape (mg2_bench.h): one steady-state chunk per step, refresh, total:
//   wm_bench_dit --mg2 universal --dtype both --threads 2
//   wm_bench_dit --mg2-check /work/mg2_full      # one forward against the upstream code's output
//   wm_bench_dit --mg2-rollout universal --device cuda --policies native,worldkv --seconds 10,60
// LingBot-World-Fast (lingbot_bench.h): a steady-state chunk, and a random model folder as the hub's:
//   wm_bench_dit --lingbot 14b --layers 1 --threads 2
//   wm_bench_dit --lingbot tiny --lingbot-hub /tmp/lingbot
#include <CLI/CLI.hpp>

#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "dit/config.h"
#include "dit/model.h"
#include "dit/sampler.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/window.h"
#include "tools/bench_dit/bench_util.h"
#include "tools/bench_dit/lingbot_bench.h"
#include "tools/bench_dit/mg2_bench.h"
#include "tools/bench_dit/mg2_rollout.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/validators.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_bench_dit {

namespace {

using Clock = std::chrono::steady_clock;
using wm::bench::seconds_since;
using wm::bench::sync;

struct Args {
  std::string config = "configs/matrix-game-2.json";
  int layers = 0;
  int chunks = 3;
  int steps = 4;
  double shift = 1.0;
  int max_window_chunks = 0;
  std::string device = "auto";
  std::string dtype = "float32";
  int threads = 0;
  uint64_t seed = 0;
  bool train = false;
  int batch = 1;
  int iters = 3;
};

// Training-pass timing: forward_sequence over `chunks` chunks (block-causal), MSE loss to a
// random target, backward; reports the mean of `iters` after one warm-up.
int run_train(const Args& a, wm::dit::CausalDit& model, const wm::dit::DitConfig& cfg, at::Device dev) {
  WM_CHECK(a.batch > 0 && a.iters > 0, "--batch and --iters must be > 0");
  at::AutoGradMode grad(true);
  const int64_t T = int64_t(a.chunks) * cfg.frames_per_chunk;
  auto fo = at::TensorOptions().dtype(at::kFloat).device(dev);
  at::Tensor x = at::randn({a.batch, T, cfg.latent_channels, cfg.latent_height, cfg.latent_width}, fo);
  at::Tensor target = at::randn_like(x);
  at::Tensor t = at::rand({a.batch, T}, fo);
  wm::dit::FrameCond cond{at::randn({a.batch, T, 3}, fo), at::rand({a.batch, T, cfg.cond.action_dim}, fo)};
  std::printf("train pass: batch %d x %lld frames = %lld tokens per sequence\n", a.batch, static_cast<long long>(T),
              static_cast<long long>(T * cfg.tokens_per_frame()));
  double fwd = 0, bwd = 0;
  for (int i = 0; i <= a.iters; ++i) {
    model->zero_grad();
    auto t0 = Clock::now();
    at::Tensor out = model->forward_sequence(x, t, cond);
    at::Tensor loss = (out - target).pow(2).mean();
    sync(loss);
    const double f = seconds_since(t0);
    auto t1 = Clock::now();
    loss.backward();
    sync(model->head->head->weight.grad());
    const double b = seconds_since(t1);
    std::printf("iter %d: forward %.3f s, backward %.3f s, loss %.4f%s\n", i, f, b, loss.item<double>(),
                i == 0 ? " (warm-up)" : "");
    if (i > 0) {
      fwd += f;
      bwd += b;
    }
  }
  std::printf("mean forward+backward %.3f s (forward %.3f, backward %.3f)\n", (fwd + bwd) / a.iters, fwd / a.iters,
              bwd / a.iters);
  return 0;
}

int run(const Args& a) {
  wm::keep_freed_memory();
  wm::init_threads(a.threads);
  at::NoGradGuard ng;
  const at::Device dev = wm::parse_device(a.device);
  const at::ScalarType dt = wm::parse_compute_dtype(a.dtype);
  wm::dit::DitConfig cfg = wm::dit::load_config(a.config);
  if (a.layers > 0) cfg.n_layers = a.layers;
  WM_CHECK(a.chunks > 0 && a.steps > 0, "--chunks and --steps must be > 0");

  auto t_build = Clock::now();
  wm::dit::CausalDit model(cfg);
  model->to(dev, dt);
  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  std::printf("config %s: dim %d, %d layers, %d heads x %d, ffn %d, %d tokens/frame, %d frames/chunk\n",
              cfg.name.c_str(), cfg.dim, cfg.n_layers, cfg.n_heads, cfg.head_dim, cfg.ffn_dim, cfg.tokens_per_frame(),
              cfg.frames_per_chunk);
  std::printf("parameters %.1f M (%s), built in %.1f s on %s\n", n_params / 1e6, a.dtype.c_str(),
              seconds_since(t_build), wm::describe_device(dev).c_str());

  if (a.train) return run_train(a, model, cfg, dev);

  wm::dit::SamplerConfig sc;
  sc.timesteps.clear();
  for (int i = 0; i < a.steps; ++i) sc.timesteps.push_back(1.0 - double(i) / a.steps);
  sc.shift = a.shift;
  wm::KvWindow window(model->kv_spec(dev, dt), {"recent"});
  at::Generator gen = at::detail::createCPUGenerator(a.seed);
  const int F = cfg.frames_per_chunk;
  std::deque<std::string> ids;

  std::printf("%5s %8s %10s %10s %10s %8s %12s %12s\n", "chunk", "ctx_tok", "sample_s", "refill_s", "total_s",
              "fps", "win_used_MB", "win_alloc_MB");
  double total = 0;
  for (int c = 0; c < a.chunks; ++c) {
    const int64_t first = int64_t(c) * F;
    wm::dit::FrameCond cond;  // a camera walking forward and turning right
    cond.pose = at::zeros({F, 3});
    cond.action = at::zeros({F, cfg.cond.action_dim});
    for (int f = 0; f < F; ++f) {
      cond.pose[f][0] = 0.125 * double(first + f);
      cond.pose[f][2] = 2.0 * double(first + f);
      if (cfg.cond.action_dim > 0) cond.action[f][0] = 1.0;
    }
    const int64_t ctx = window.size(0);
    auto t0 = Clock::now();
    sc.refill = false;
    wm::dit::ChunkResult r = wm::dit::generate_chunk(model, &window, cond, first, sc, gen);
    sync(r.latents);
    const double ts = seconds_since(t0);
    auto t1 = Clock::now();
    model->forward_chunk(r.latents, at::scalar_tensor(0.0), cond, first, &window, &r.kv);
    sync(r.kv.back().k);
    const double tr = seconds_since(t1);
    wm::Block b;
    b.id = "chunk:" + std::to_string(c);
    b.layers = std::move(r.kv);
    window.place("recent", b);
    ids.push_back(b.id);
    if (a.max_window_chunks > 0 && int(ids.size()) > a.max_window_chunks) {
      window.remove(ids.front());
      ids.pop_front();
    }
    const double dtot = ts + tr;
    total += dtot;
    std::printf("%5d %8lld %10.3f %10.3f %10.3f %8.3f %12.1f %12.1f\n", c, static_cast<long long>(ctx), ts, tr, dtot,
                F / dtot, window.bytes_used() / 1e6, window.bytes_allocated() / 1e6);
    std::fflush(stdout);
  }
  std::printf("mean %.3f s/chunk, %.3f frames/s over %d chunks (%d steps + refill)\n", total / a.chunks,
              a.chunks * F / total, a.chunks, a.steps);
  return 0;
}

// Every program mode's options: the causal DiT's (Args), --mg2's, --mg2-check's, --mg2-rollout's.
struct AllOptions {
  Args a;
  wm::bench::Mg2BenchOptions mg;
  wm::bench::Mg2CheckOptions mc;
  wm::bench::Mg2RolloutOptions ro;
  wm::bench::LingbotBenchOptions lb;
  wm::bench::LingbotHubOptions hub;
  std::string latent_size = "60x104";
  std::string lingbot_check;
  bool no_decode = false, no_pin = false;
  std::string json_out;
};

// The options whose presence picks a mode or is checked against it.
struct ModeOptions {
  CLI::Option *dtype = nullptr, *mg2 = nullptr, *mg2_model = nullptr, *mg2_check = nullptr, *mg2_rollout = nullptr;
  CLI::Option *lingbot = nullptr, *lingbot_hub = nullptr, *lingbot_check = nullptr, *lingbot_disk = nullptr;
  CLI::Option* kv_files = nullptr;
  CLI::Option *latent_size = nullptr, *window_frames = nullptr;
  CLI::Option *policies = nullptr, *seconds = nullptr, *warmup = nullptr, *repeats = nullptr, *json = nullptr;
};

// The causal DiT's options (configs/*.json models), a few shared with the other modes.
void add_causal_options(CLI::App& app, Args& a, ModeOptions& m) {
  app.add_option("--config", a.config, "model config JSON")->capture_default_str()->check(CLI::ExistingFile);
  app.add_option("--layers", a.layers, "override the config's layer count (0: keep)")->capture_default_str()
      ->check(CLI::Range(0, 1024));
  app.add_option("--chunks", a.chunks, "chunks to generate")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--steps", a.steps, "sampler steps per chunk (t = 1, 1-1/n, ...)")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--shift", a.shift, "timestep shift")->capture_default_str()->check(wm::cli::FiniteRange(1e-3, 1e3));
  app.add_option("--max-window-chunks", a.max_window_chunks,
                 "drop the oldest chunk beyond this many in the window (0: grow without bound)")
      ->capture_default_str()->check(CLI::Range(0, 100000));
  app.add_option("--device", a.device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  m.dtype = app.add_option("--dtype", a.dtype, "float32, bfloat16, float16 (weights and KV window; --mg2-rollout: bf16 unless given)")
                ->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads (0: all cores)")->capture_default_str()->check(CLI::Range(0, 1024));
  app.add_option("--seed", a.seed, "noise seed")->capture_default_str();
  auto* train = app.add_flag("--train", a.train, "time a training pass instead: forward_sequence over --chunks chunks + backward");
  app.add_option("--batch", a.batch, "--train: sequences per batch")->capture_default_str()->check(CLI::Range(1, 4096))
      ->needs(train);
  app.add_option("--iters", a.iters, "--train: timed iterations after one warm-up")->capture_default_str()
      ->check(CLI::Range(1, 100000))->needs(train);
}

// Matrix-Game-2.0's modes: --mg2 (or --mg2-model), --mg2-check, --mg2-rollout.
void add_mg2_options(CLI::App& app, AllOptions& o, ModeOptions& m) {
  m.mg2 = app.add_option("--mg2", o.mg.mode,
                         "Matrix-Game-2.0 instead: random weights of the release's config, one steady-state chunk "
                         "(chunk 2, full native window) timed per step (universal, gta_drive, templerun)")
              ->check(CLI::IsMember({"universal", "gta_drive", "templerun"}));
  m.mg2_model = app.add_option("--mg2-model", o.mg.model_dir, "as --mg2 with a model folder (config.json + checkpoint)")
                    ->check(CLI::ExistingPath)->excludes(m.mg2);
  m.mg2_check = app.add_option("--mg2-check", o.mc.dir,
                               "one forward of chunk 0 at t = 1000 of DIR/model.safetensors with the conformance "
                               "fixtures' inputs against DIR/io.safetensors `flow` (made by the upstream code)")
                    ->check(CLI::ExistingDirectory)->excludes(m.mg2)->excludes(m.mg2_model);
  m.mg2_rollout = app.add_option("--mg2-rollout", o.ro.mode,
                                 "Matrix-Game-2.0 rollout frames/s instead: random weights of the release's config, "
                                 "DiT + memory + Wan VAE decode per chunk, under each of --policies")
                      ->check(CLI::IsMember({"universal", "gta_drive", "templerun"}))
                      ->excludes(m.mg2)->excludes(m.mg2_model)->excludes(m.mg2_check);
  m.policies = app.add_option("--policies", o.ro.policies, "--mg2-rollout: native, full_kv, worldkv, worldkv_c, ...")
                   ->delimiter(',')->default_str("native,worldkv")->needs(m.mg2_rollout);
  m.seconds = app.add_option("--seconds", o.ro.seconds, "--mg2-rollout: report at these lengths (seconds of video)")
                  ->delimiter(',')->default_str("10,60")->needs(m.mg2_rollout);
  app.add_option("--video-fps", o.ro.video_fps, "--mg2-rollout: video frames per second of video")
      ->capture_default_str()->check(CLI::Range(1.0, 240.0))->needs(m.mg2_rollout);
  app.add_flag("--no-pin-host", o.no_pin, "--mg2-rollout: the bank's host tier in pageable memory, not pinned")
      ->needs(m.mg2_rollout);
  app.add_flag("--no-decode", o.no_decode, "--mg2-rollout: skip the Wan VAE decode")->needs(m.mg2_rollout);
  app.add_option("--bank-device-gib", o.ro.bank_device_gib, "--mg2-rollout: the bank's GPU tier (GiB); the rest on the host")
      ->capture_default_str()->check(CLI::Range(0.0, 4096.0))->needs(m.mg2_rollout);
  m.warmup = app.add_option("--warmup", o.mg.warmup, "--mg2: untimed chunks per dtype before the measured ones")
                 ->capture_default_str()->check(CLI::Range(0, 1000));
  m.repeats = app.add_option("--repeats", o.mg.repeats, "--mg2: measured chunks per dtype")
                  ->capture_default_str()->check(CLI::Range(1, 1000));
  m.json = app.add_option("--json", o.json_out, "--mg2, --mg2-check: also write the figures as JSON to this file");
  app.footer("--mg2, --mg2-model, --mg2-check use --dtype f32|bf16|both (default f32), --threads, --device and "
             "(--mg2) --layers, --seed; the other options are for configs/*.json models.");
}

// LingBot-World-Fast's modes: --lingbot SIZE (timing) and --lingbot-hub DIR (a random model folder).
void add_lingbot_options(CLI::App& app, AllOptions& o, ModeOptions& m) {
  m.lingbot = app.add_option("--lingbot", o.lb.size,
                             "LingBot-World-Fast instead: random weights of SIZE (14b: the release, tiny, or a "
                             "config.json), one steady-state chunk (4 steps + the clean pass over a full window) timed "
                             "per call, and its memory")
                  ->excludes(m.mg2)->excludes(m.mg2_model)->excludes(m.mg2_check)->excludes(m.mg2_rollout);
  m.lingbot_hub = app.add_option("--lingbot-hub", o.hub.dir,
                                 "with --lingbot: write the random model as the hub lays it out into "
                                 "DIR/lingbot_world_fast/ and a random Wan VAE into DIR/Wan2.1_VAE.safetensors, "
                                 "then stop")
                      ->needs(m.lingbot);
  m.lingbot_disk = app.add_option("--lingbot-disk", o.lb.from_dir,
                                  "LingBot-World-Fast from disk instead: time the DiT folder DIR (a hub folder's "
                                  "lingbot_world_fast/) read a block at a time (one block held), its size from its "
                                  "config.json, as --lingbot times random weights")
                       ->check(CLI::ExistingDirectory)->excludes(m.lingbot)->excludes(m.mg2)->excludes(m.mg2_model)
                       ->excludes(m.mg2_check)->excludes(m.mg2_rollout);
  m.lingbot_check = app.add_option("--lingbot-check", o.lingbot_check,
                                   "one forward of the full-width single-block model of "
                                   "tools/lingbot_fixtures/make_full_block_check.py against upstream's output")
                        ->check(CLI::ExistingDirectory)->excludes(m.lingbot)->excludes(m.lingbot_disk)
                        ->excludes(m.mg2)->excludes(m.mg2_check);
  m.latent_size = app.add_option("--latent-size", o.latent_size,
                                 "--lingbot, --lingbot-disk: latent frame HxW (60x104: a 480x832 video)")
                      ->capture_default_str();
  m.window_frames = app.add_option("--window-frames", o.lb.window_frames,
                                   "--lingbot, --lingbot-disk: latent frames the chunk attends to besides itself "
                                   "(15: WorldKV's sink 3, retrieved 9, recent 3)")
                        ->capture_default_str()->check(CLI::Range(0, 100000));
  m.kv_files = app.add_option("--kv-files", o.lb.kv_files,
                              "--lingbot, --lingbot-disk: keep the synthetic window's K/V in unnamed files in this "
                              "folder (as wm_render --kv-files), not in memory; CPU only")
                   ->check(CLI::ExistingDirectory)->excludes(m.lingbot_hub);
  app.add_option("--vae-dim", o.hub.vae_dim, "--lingbot-hub: the random Wan VAE's base width (the release: 96)")
      ->capture_default_str()->check(CLI::Range(1, 1024))->needs(m.lingbot_hub);
  app.add_option("--shard-mib", o.hub.shard_mib, "--lingbot-hub: the largest shard (MiB)")
      ->capture_default_str()->check(wm::cli::FiniteRange(1e-6, 1e9))->needs(m.lingbot_hub);
  app.add_option("--umt5-spiece", o.hub.spiece,
                 "--lingbot-hub: a SentencePiece model copied in as DIR/google/umt5-xxl/spiece.model, the tokenizer "
                 "--prompt needs (the random umT5 encoder then has one row per piece)")
      ->check(CLI::ExistingFile)->needs(m.lingbot_hub);
}

// --lingbot (and --lingbot-hub).
int run_lingbot_mode(AllOptions& o, const ModeOptions& m) {
  const Args& a = o.a;
  wm::init_threads(a.threads);
  if (*m.lingbot_hub) {
    o.hub.size = o.lb.size;
    o.hub.layers = a.layers;
    o.hub.seed = a.seed;
    o.hub.dtype = *m.dtype ? (a.dtype == "float32" || a.dtype == "f32" ? "f32" : "bf16") : "bf16";
    return wm::bench::run_lingbot_hub(o.hub);
  }
  const size_t x = o.latent_size.find('x');
  WM_CHECK(x != std::string::npos, "--latent-size must be HxW, got '", o.latent_size, "'");
  o.lb.latent_height = std::stoll(o.latent_size.substr(0, x));
  o.lb.latent_width = std::stoll(o.latent_size.substr(x + 1));
  o.lb.dtypes = wm::bench::parse_mg2_dtypes(a.dtype == "float32" ? "f32" : a.dtype);
  o.lb.device = a.device;
  o.lb.layers = a.layers;
  o.lb.seed = a.seed;
  o.lb.warmup = *m.warmup ? o.mg.warmup : 0;
  o.lb.repeats = o.mg.repeats;
  return wm::bench::run_lingbot_bench(o.lb);
}

// Runs the mode the options pick; returns the exit status.
int run_mode(AllOptions& o, const ModeOptions& m) {
  Args& a = o.a;
  if (*m.lingbot || *m.lingbot_disk) return run_lingbot_mode(o, m);
  for (auto* opt : {m.latent_size, m.window_frames, m.kv_files})
    if (*opt) throw wm::Error(opt->get_name() + " applies to --lingbot and --lingbot-disk");
  if (*m.lingbot_check) {
    wm::init_threads(a.threads);
    return wm::bench::run_lingbot_check(o.lingbot_check, a.device);
  }
  if (*m.mg2_rollout) {
    wm::bench::Mg2RolloutOptions& ro = o.ro;
    wm::init_threads(a.threads);
    if (!*m.policies) ro.policies = {"native", "worldkv"};
    if (!*m.seconds) ro.seconds = {10, 60};
    ro.device = a.device;
    ro.dtype = *m.dtype ? a.dtype : "bf16";
    ro.seed = a.seed;
    ro.layers = a.layers;
    ro.decode = !o.no_decode;
    ro.pin_host = !o.no_pin;
    ro.json_out = o.json_out;
    return wm::bench::run_mg2_rollout(ro);
  }
  const bool mg2_mode = *m.mg2 || *m.mg2_model || *m.mg2_check;
  if (!mg2_mode) {
    for (auto* opt : {m.warmup, m.repeats, m.json})
      if (*opt) throw wm::Error(opt->get_name() + " applies to --mg2, --mg2-model, --mg2-check and --lingbot");
    return run(a);
  }
  wm::init_threads(a.threads);
  const auto dtypes = wm::bench::parse_mg2_dtypes(a.dtype == "float32" ? "f32" : a.dtype);
  if (*m.mg2_check) {
    o.mc.dtypes = dtypes;
    o.mc.device = a.device;
    o.mc.json_out = o.json_out;
    return wm::bench::run_mg2_check(o.mc);
  }
  o.mg.dtypes = dtypes;
  o.mg.device = a.device;
  o.mg.layers = a.layers;
  o.mg.seed = a.seed;
  o.mg.json_out = o.json_out;
  return wm::bench::run_mg2_bench(o.mg);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_bench_dit: per-chunk latency of a causal DiT config (random weights) through the few-step "
               "sampler and the refill pass over a growing KV window"};
  AllOptions o;
  ModeOptions m;
  add_causal_options(app, o.a, m);
  add_mg2_options(app, o, m);
  add_lingbot_options(app, o, m);
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  try {
    return run_mode(o, m);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_bench_dit: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
}

}  // namespace wm_tool_bench_dit
