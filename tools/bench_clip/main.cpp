// wm_bench_clip: time of Matrix-Game-2.0's conditioning-image path: the preprocessing
// (crop, PIL bilinear resize to 640x352, normalisation, bicubic to 224x224) and the CLIP
// ViT-H/14 vision tower (31 of 32 blocks) with random weights, per image, in float32 and/or
// bfloat16. Median of --reps runs after one warm-up run.
//
//   wm_bench_clip --check DIR --weights FILE   # against make_clip_fixtures.py --full DIR
// loads the tower from FILE (the whole-CLIP .pth) in float32, runs DIR/io.safetensors' pixels once
// and prints max |ours - upstream| / max |upstream| of the tokens and both times; exits 1 when
// that is above --tol (1e-4).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <string>
#include <vector>

#include "dit/clip_vision.h"
#include "dit/mg2_image.h"
#include "runtime/clock.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_bench_clip {

namespace {

using Clock = std::chrono::steady_clock;

struct Timing {
  double wall_ms = 0;  // median wall time
  double cpu_ms = 0;   // median CPU time of the process (all threads)
};

// On a shared machine the wall time depends on the other load; the process's CPU time divided
// by the thread count is what the run would take with its cores to itself.
template <class F>
Timing median_ms(int reps, F&& f) {
  f();  // warm-up
  std::vector<double> wall, cpu;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    const std::clock_t c0 = std::clock();
    f();
    cpu.push_back(1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    wall.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

// The tower loaded from `weights` in float32 against the upstream code's output on the same
// weights (make_clip_fixtures.py --full DIR): one forward of DIR's pixels, timed. Returns the
// exit code: 0 when the worst relative difference is within tol, 1 otherwise.
int run_check(const std::string& dir, const std::string& weights, const at::Device& dev, int threads, double tol) {
  const wm::SafeTensors io = wm::SafeTensors::open(dir + "/io.safetensors");
  const at::Tensor pixels = io.get("pixels"), want = io.get("tokens");
  auto upstream = [&](const std::string& k) { return io.contains(k) ? io.get(k).item<double>() : std::nan(""); };
  wm::dit::ClipVisionOptions opt;
  opt.device = dev;
  opt.dtype = at::kFloat;
  const auto l0 = Clock::now();
  const wm::dit::ClipVision tower = wm::dit::ClipVision::load(weights, wm::dit::ClipVisionConfig::vit_h_14(), opt);
  const double load_s = std::chrono::duration<double>(Clock::now() - l0).count();
  std::printf("check against %s/io.safetensors, weights %s (loaded in %.1f s), %s, %d threads\n", dir.c_str(),
              weights.c_str(), load_s, wm::describe_device(dev).c_str(), threads);
  const at::Tensor x = pixels.to(dev);
  const auto t0 = Clock::now();
  const double c0 = wm::process_cpu_ms();
  const at::Tensor got = tower.forward(x).to(at::kCPU);  // the copy also waits for a GPU
  const double cpu_ms = wm::process_cpu_ms() - c0;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  WM_CHECK(got.sizes() == want.sizes(), "tokens: expected shape ", want.sizes(), " (upstream), got ", got.sizes());
  const at::Tensor w = want.to(at::kDouble);
  const double max_ref = w.abs().max().item<double>();
  const double worst = (got.to(at::kDouble) - w).abs().max().item<double>();
  const double rel = worst / max_ref;
  std::printf("pixels %s -> tokens %s: max |diff| %.3g, max |upstream| %.4g, relative %.3g (tolerance %.1g)\n",
              wm::str_cat(pixels.sizes()).c_str(), wm::str_cat(got.sizes()).c_str(), worst, max_ref, rel, tol);
  std::printf("forward: ours %.0f ms wall, %.0f ms CPU; upstream %.0f ms wall, %.0f ms CPU\n", ms, cpu_ms,
              upstream("ms"), upstream("cpu_ms"));
  const bool ok = std::isfinite(rel) && rel <= tol;
  std::printf("%s\n", ok ? "OK" : "FAILED: above the tolerance");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_bench_clip: MG2 image preprocessing and the CLIP ViT-H/14 vision tower, time per image"};
  int reps = 3, threads = 0, layers = 32, batch = 1;
  std::vector<std::string> dtypes = {"float32", "bfloat16"};
  std::string device = "cpu", check, weights;
  double tol = 1e-4;
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--dtypes", dtypes, "float32 and/or bfloat16");
  app.add_option("--layers", layers, "blocks in the checkpoint (the tower runs layers - 1)")
      ->check(CLI::Range(2, 64));
  app.add_option("--batch", batch, "images per forward")->check(CLI::Range(1, 64));
  app.add_option("--device", device, "cpu, cuda, cuda:N");
  app.add_option("--check", check,
                 "instead of timing: compare with DIR/io.safetensors from "
                 "tools/mg2_fixtures/make_clip_fixtures.py --full DIR (float32)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--weights", weights, "--check: the whole-CLIP checkpoint the reference was made with")
      ->check(CLI::ExistingFile);
  app.add_option("--tol", tol, "--check: largest accepted max |diff| / max |upstream|")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    at::NoGradGuard no_grad;
    wm::keep_freed_memory();
    const int nt = wm::init_threads(threads);
    const at::Device dev = wm::parse_device(device);
    if (!check.empty()) {
      WM_CHECK(!weights.empty(), "--check needs --weights FILE (the checkpoint the reference was made with)");
      return run_check(check, weights, dev, nt, tol);
    }
    std::cout << "wm_bench_clip: " << wm::describe_device(dev) << ", " << nt << " threads, median of "
              << reps << " after a warm-up\n";

    // A 1280x720 frame: crop to 1280x704, PIL resize to 640x352, then CLIP's 224x224 input.
    wm::Image frame(1280, 720);
    for (size_t i = 0; i < frame.rgb.size(); ++i) frame.rgb[i] = static_cast<uint8_t>((i * 2654435761u) >> 24);
    at::Tensor pixels;
    const Timing pre = median_ms(reps, [&] { pixels = wm::dit::mg2_clip_input(wm::dit::mg2_image_tensor(frame)); });
    std::printf("preprocess 1280x720 -> [3, 352, 640] -> [1, 3, 224, 224]: %.1f ms wall, %.1f ms CPU\n",
                pre.wall_ms, pre.cpu_ms);
    pixels = pixels.expand({batch, 3, 224, 224}).contiguous().to(dev);

    wm::dit::ClipVisionConfig cfg = wm::dit::ClipVisionConfig::vit_h_14();
    cfg.layers = layers;
    // Multiply-adds of one forward: the patch matmul, per block qkv, proj, two MLP linears and
    // the two attention matmuls.
    const double L = static_cast<double>(cfg.tokens()) * batch, d = static_cast<double>(cfg.dim);
    const double flops = 2.0 * (L * 3 * 14 * 14 * d +
                                cfg.blocks_run() * (L * d * (4 * d + 2 * cfg.mlp_dim) + 2 * L * cfg.tokens() * d));
    for (const std::string& name : dtypes) {
      WM_CHECK(name == "float32" || name == "bfloat16", "--dtypes: float32 or bfloat16, got ", name);
      wm::dit::ClipVisionOptions opt;
      opt.device = dev;
      opt.dtype = name == "float32" ? at::kFloat : at::kBFloat16;
      const auto t0 = Clock::now();
      const wm::dit::ClipVision tower = wm::dit::ClipVision::random(cfg, 1, opt);
      const double init_s = std::chrono::duration<double>(Clock::now() - t0).count();
      at::Tensor tokens;
      const Timing t = median_ms(reps, [&] {
        tokens = tower.forward(pixels);
        if (dev.is_cuda()) tokens.cpu();
      });
      // The same machine's rate on the tower's largest matmul shape, for reference.
      const at::Tensor a = at::randn({static_cast<int64_t>(L), cfg.dim}).to(dev, *opt.dtype);
      const at::Tensor w = at::randn({cfg.mlp_dim, cfg.dim}).to(dev, *opt.dtype);
      const Timing g = median_ms(reps, [&] {
        const at::Tensor y = at::linear(a, w);
        if (dev.is_cuda()) y.cpu();
      });
      std::printf("tower %s (dim %lld, %lld blocks run, batch %d) -> [%lld, %lld, %lld], random init %.1f s\n",
                  name.c_str(), static_cast<long long>(cfg.dim), static_cast<long long>(cfg.blocks_run()), batch,
                  static_cast<long long>(tokens.size(0)), static_cast<long long>(tokens.size(1)),
                  static_cast<long long>(tokens.size(2)), init_s);
      std::printf("  forward: %.0f ms wall (%.0f per image, %.1f GFLOP/s), %.0f ms CPU (%.0f ms / %d threads)\n",
                  t.wall_ms, t.wall_ms / batch, flops / t.wall_ms * 1e-6, t.cpu_ms, t.cpu_ms / nt, nt);
      std::printf("  one [%lld x %lld] x [%lld x %lld] linear: %.1f GFLOP/s wall, %.1f GFLOP/s per CPU-second / %d\n",
                  static_cast<long long>(L), static_cast<long long>(cfg.dim), static_cast<long long>(cfg.dim),
                  static_cast<long long>(cfg.mlp_dim), 2.0 * L * d * cfg.mlp_dim / g.wall_ms * 1e-6,
                  2.0 * L * d * cfg.mlp_dim / (g.cpu_ms / nt) * 1e-6, nt);
    }
  } catch (const std::exception& e) {
    std::cerr << "wm_bench_clip: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_bench_clip
