// wm_bench_vae: speed of the Wan2.1 VAE (Matrix-Game-2.0's codec, dit/wan_vae.h) as
// Matrix-Game-2.0 uses it: the encoder on one image and on the image condition
// [image, zeros x 4 (N - 1)], and the streaming decoder chunk by chunk (3 latents -> 9 frames for
// the first chunk of a rollout, 12 after), per dtype.
//   wm_bench_vae                                   # dim 96, random weights, 352x640, f32 and bf16
//   wm_bench_vae --dtype float32,bfloat16,float16 --chunks 3 --cond-latents 3 --threads 2
//   wm_bench_vae --weights Wan2.1_VAE.pth
//   wm_bench_vae --check DIR   # DIR/wan_vae.pth + DIR/io.safetensors from make_vae_fixtures.py --full
#include <CLI/CLI.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dit/wan_vae.h"
#include "runtime/clock.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/pth.h"
#include "runtime/safetensors.h"
#include "tools/cli/error_text.h"
#include "tools/cli/proc_status.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_bench_vae {

namespace {

using Clock = std::chrono::steady_clock;
using wm::dit::WanVae;
using wm::dit::WanVaeParts;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

void sync(const at::Tensor& t) { (void)t.sum().item<double>(); }

// Peak resident memory of the process in MB (Linux; 0 elsewhere).
double peak_rss_mb() { return wm::cli::proc_status_bytes("VmHWM:") / (1024.0 * 1024.0); }

struct Args {
  std::string weights;
  int dim = 96;
  int height = 352, width = 640;
  std::string dtypes = "float32,bfloat16";
  int chunks = 3;
  int latents_per_chunk = 3;
  int cond_latents = 3;
  bool no_encode = false;
  std::string device = "cpu";
  int threads = 0;
  uint64_t seed = 0;
  std::string check;
};

const char* dtype_name(at::ScalarType t) {
  return t == at::kFloat ? "float32" : t == at::kBFloat16 ? "bfloat16" : t == at::kHalf ? "float16" : "?";
}

// A full VAE state dict with random weights of a sensible scale (conv weights N(0, 1 / fan_in),
// biases 0.05 N(0, 1), RMS gammas uniform in [0.5, 1.5]), float32 on the CPU.
std::map<std::string, at::Tensor> random_state_dict(int64_t dim, uint64_t seed) {
  wm::dit::WanVaeConfig cfg;
  cfg.dim = dim;
  WanVae vae(cfg, WanVaeParts::Full);
  at::Generator g = at::detail::createCPUGenerator(seed);
  std::map<std::string, at::Tensor> sd;
  for (const auto& p : vae->named_parameters(true)) {
    const std::string& k = p.key();
    const at::Tensor& w = p.value();
    at::Tensor v;
    if (k.size() >= 5 && k.compare(k.size() - 5, 5, "gamma") == 0)
      v = at::rand(w.sizes(), g).add_(0.5);
    else if (k.size() >= 4 && k.compare(k.size() - 4, 4, "bias") == 0)
      v = at::randn(w.sizes(), g).mul_(0.05);
    else
      v = at::randn(w.sizes(), g).div_(std::sqrt(double(w[0].numel())));
    sd.emplace(k, v);
  }
  return sd;
}

std::vector<at::ScalarType> parse_dtypes(const std::string& list) {
  std::vector<at::ScalarType> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if (item == "all") {
      out.insert(out.end(), {at::kFloat, at::kBFloat16, at::kHalf});
      continue;
    }
    out.push_back(wm::parse_compute_dtype(item));
  }
  WM_CHECK(!out.empty(), "--dtype names no dtype: '", list, "'");
  return out;
}

// Wall and process CPU time of a step. On a shared machine the wall time counts the time other
// processes hold the cores; cpu / threads is what the step would take with the cores to itself
// (an estimate: waiting threads may spin and add CPU time).
struct Timer {
  Clock::time_point wall = Clock::now();
  double cpu = wm::process_cpu_ms();
};

void row(const char* dt, const std::string& what, int64_t frames, const Timer& t, int threads) {
  const double ms = ms_since(t.wall), cpu = wm::process_cpu_ms() - t.cpu;
  std::printf("%-9s %-28s %7lld %11.1f %11.1f %9.3f %11.3f\n", dt, what.c_str(), static_cast<long long>(frames), ms,
              cpu, frames * 1000.0 / ms, frames * 1000.0 * threads / cpu);
  std::fflush(stdout);
}

int run(const Args& a) {
  wm::keep_freed_memory();
  const int threads = wm::init_threads(a.threads);
  at::NoGradGuard ng;
  const at::Device dev = wm::parse_device(a.device);
  WM_CHECK(a.height % 8 == 0 && a.width % 8 == 0, "--height and --width must be multiples of 8");
  const auto dtypes = parse_dtypes(a.dtypes);

  auto t_load = Clock::now();
  std::map<std::string, at::Tensor> sd = a.weights.empty() ? random_state_dict(a.dim, a.seed)
                                                             : wm::load_state_dict(a.weights);
  const wm::dit::WanVaeConfig cfg = wm::dit::WanVaeConfig::from_state_dict(sd, a.weights.empty() ? "random" : a.weights);
  int64_t n_params = 0;
  for (const auto& kv : sd) n_params += kv.second.numel();
  std::printf("Wan2.1 VAE: dim %lld, z_dim %lld, %.1f M parameters (%s), ready in %.1f s\n",
              static_cast<long long>(cfg.dim), static_cast<long long>(cfg.z_dim), n_params / 1e6,
              a.weights.empty() ? "random weights" : a.weights.c_str(), ms_since(t_load) / 1000.0);
  std::printf("frames %dx%d, latents %dx%d, %s, %d threads\n", a.height, a.width, a.height / 8, a.width / 8,
              wm::describe_device(dev).c_str(), threads);
  std::printf("%-9s %-28s %7s %11s %11s %9s %11s\n", "dtype", "step", "frames", "wall_ms", "cpu_ms", "frames/s",
              "cpu_frames/s");
  std::fflush(stdout);

  at::Generator g = at::detail::createCPUGenerator(a.seed + 1);
  at::Tensor image = at::rand({1, 3, 1, a.height, a.width}, g).mul_(2).sub_(1);
  at::Tensor latents = at::randn({1, int64_t(a.chunks) * a.latents_per_chunk, cfg.z_dim, a.height / 8, a.width / 8}, g);
  for (at::ScalarType dt : dtypes) {
    const char* dn = dtype_name(dt);
    if (!a.no_encode) {
      WanVae enc = wm::dit::make_wan_vae(sd, WanVaeParts::Encoder, dt, dev);
      Timer t0;
      sync(enc->encode(image.to(dev)));
      row(dn, "encode image", 1, t0, threads);
      if (a.cond_latents > 1) {
        const int64_t T = 1 + 4 * int64_t(a.cond_latents - 1);
        at::Tensor video = at::zeros({1, 3, T, a.height, a.width});
        video.narrow(2, 0, 1).copy_(image);
        Timer t1;
        sync(enc->encode(video.to(dev)));
        row(dn, "encode condition N=" + std::to_string(a.cond_latents), T, t1, threads);
      }
    }
    WanVae dec = wm::dit::make_wan_vae(sd, WanVaeParts::Decoder, dt, dev);
    wm::dit::WanVaeDecodeState st;
    double steady_ms = 0, steady_cpu = 0;
    int64_t steady_frames = 0;
    for (int c = 0; c < a.chunks; ++c) {
      at::Tensor z = latents.narrow(1, int64_t(c) * a.latents_per_chunk, a.latents_per_chunk).to(dev);
      Timer t0;
      at::Tensor frames = dec->decode_chunk(z, st);
      sync(frames);
      row(dn, "decode chunk " + std::to_string(c) + " (" + std::to_string(a.latents_per_chunk) + " latents)",
          frames.size(1), t0, threads);
      if (c > 0) {
        steady_ms += ms_since(t0.wall);
        steady_cpu += wm::process_cpu_ms() - t0.cpu;
        steady_frames += frames.size(1);
      }
    }
    if (a.chunks > 1)
      std::printf("%-9s decode after the first chunk: %.1f ms per chunk (cpu %.1f ms), %.3f frames/s (cpu-based %.3f)\n",
                  dn, steady_ms / (a.chunks - 1), steady_cpu / (a.chunks - 1), steady_frames * 1000.0 / steady_ms,
                  steady_frames * 1000.0 * threads / steady_cpu);
  }
  std::printf("peak resident memory %.0f MB\n", peak_rss_mb());
  return 0;
}

// Against the upstream code's output at full size (make_vae_fixtures.py --full DIR): the encode of
// enc.video and the streamed decode of dec.latents in chunks, float32, worst relative difference
// max |ours - upstream| / max |upstream| per output, and our times.
int run_check(const Args& a) {
  wm::keep_freed_memory();
  const int threads = wm::init_threads(a.threads);
  at::NoGradGuard ng;
  const at::Device dev = wm::parse_device(a.device);
  const std::string dir = a.check;
  std::map<std::string, at::Tensor> sd = wm::load_state_dict(dir + "/wan_vae.pth");
  wm::SafeTensors io = wm::SafeTensors::open(dir + "/io.safetensors");
  std::printf("check against %s/io.safetensors, %s, %d threads\n", dir.c_str(), wm::describe_device(dev).c_str(),
              threads);
  auto rel = [](const at::Tensor& got, const at::Tensor& want) {
    at::Tensor g = got.to(at::kCPU, at::kDouble), w = want.to(at::kDouble);
    WM_CHECK(g.sizes() == w.sizes(), "shape ", g.sizes(), " against upstream ", w.sizes());
    return (g - w).abs().max().item<double>() / w.abs().max().item<double>();
  };
  auto upstream_ms = [&](const std::string& k) {
    return io.contains(k) ? io.get(k).item<double>() : std::nan("");
  };
  double worst = 0;
  {
    WanVae enc = wm::dit::make_wan_vae(sd, WanVaeParts::Encoder, at::kFloat, dev, dir + "/wan_vae.pth");
    Timer t0;
    at::Tensor mu = enc->encode(io.get("enc.video").to(dev));
    sync(mu);
    const double ms = ms_since(t0.wall), cpu = wm::process_cpu_ms() - t0.cpu, r = rel(mu, io.get("enc.mu"));
    worst = std::max(worst, r);
    std::printf("encode %s: max rel diff %.3g; ours %.0f ms (cpu %.0f ms), upstream %.0f ms (cpu %.0f ms)\n",
                wm::str_cat(io.get("enc.video").sizes()).c_str(), r, ms, cpu, upstream_ms("enc.ms"),
                upstream_ms("enc.cpu_ms"));
  }
  WanVae dec = wm::dit::make_wan_vae(sd, WanVaeParts::Decoder, at::kFloat, dev, dir + "/wan_vae.pth");
  wm::dit::WanVaeDecodeState st;
  at::Tensor latents = io.get("dec.latents");
  const int64_t per = io.get("dec.latents_per_chunk").item<int64_t>();
  for (int64_t c = 0; c * per < latents.size(1); ++c) {
    Timer t0;
    at::Tensor frames = dec->decode_chunk(latents.narrow(1, c * per, per).to(dev), st);
    sync(frames);
    const double ms = ms_since(t0.wall), cpu = wm::process_cpu_ms() - t0.cpu,
                 r = rel(frames, io.get("dec.frames." + std::to_string(c)));
    worst = std::max(worst, r);
    std::printf("decode chunk %lld (%lld frames): max rel diff %.3g; ours %.0f ms (cpu %.0f ms), upstream %.0f ms "
                "(cpu %.0f ms)\n",
                static_cast<long long>(c), static_cast<long long>(frames.size(1)), r, ms, cpu,
                upstream_ms("dec.ms." + std::to_string(c)), upstream_ms("dec.cpu_ms." + std::to_string(c)));
    std::fflush(stdout);
  }
  std::printf("worst max rel diff %.3g; peak resident memory %.0f MB\n", worst, peak_rss_mb());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_bench_vae: the Wan2.1 VAE (Matrix-Game-2.0's codec) timed as Matrix-Game-2.0 uses it: the encoder "
               "on one image and on the image condition, the streaming decoder per chunk"};
  Args a;
  app.add_option("--weights", a.weights, "Wan2.1_VAE.pth or a .safetensors of it (default: random weights)")
      ->check(CLI::ExistingFile);
  app.add_option("--dim", a.dim, "base width of the random-weight VAE (Wan2.1: 96)")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--height", a.height, "frame height (multiple of 8)")->capture_default_str()->check(CLI::Range(8, 8192));
  app.add_option("--width", a.width, "frame width (multiple of 8)")->capture_default_str()->check(CLI::Range(8, 8192));
  app.add_option("--dtype", a.dtypes, "comma-separated: float32, bfloat16, float16 (or all)")->capture_default_str();
  app.add_option("--chunks", a.chunks, "decoder chunks of one rollout")->capture_default_str()->check(CLI::Range(0, 10000));
  app.add_option("--latents-per-chunk", a.latents_per_chunk, "latent frames per decoder chunk")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--cond-latents", a.cond_latents,
                 "also encode the condition [image, zeros x 4 (N - 1)] for N latents (<= 1: only the image)")
      ->capture_default_str()->check(CLI::Range(0, 1000));
  app.add_flag("--no-encode", a.no_encode, "time only the decoder");
  app.add_option("--device", a.device, "cpu, cuda, cuda:N, auto")->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads (0: all cores)")->capture_default_str()->check(CLI::Range(0, 1024));
  app.add_option("--seed", a.seed, "seed of the random weights and inputs")->capture_default_str();
  app.add_option("--check", a.check,
                 "compare with the upstream code's output instead: DIR/wan_vae.pth and DIR/io.safetensors written by "
                 "tools/mg2_fixtures/make_vae_fixtures.py --full DIR (float32)")
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);
  try {
    return a.check.empty() ? run(a) : run_check(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_bench_vae: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
}

}  // namespace wm_tool_bench_vae
