// wm_render: rolls the world model out along a trajectory and writes the video to MP4, optionally
// side by side with the ground truth, with a strip that shows which chunks the memory holds.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_folder.h"
#include "tools/cli/progress.h"
#include "tools/cli/validators.h"
#include "tools/media/mp4_writer.h"
#include "tools/media/png.h"
#include "tools/media/upscale.h"
#include "tools/rollout/cli_options.h"
#include "tools/rollout/episode_runner.h"
#include "tools/render/mg2_render.h"
#include "tools/rollout/world_adapter.h"
#include "tools/world/raycaster.h"
#include "tools/world/suite.h"

namespace {

void fill(wm::Image& im, int x0, int y0, int x1, int y1, uint8_t r, uint8_t g, uint8_t b) {
  for (int y = std::max(0, y0); y < std::min(im.height, y1); ++y)
    for (int x = std::max(0, x0); x < std::min(im.width, x1); ++x) {
      uint8_t* q = im.pixel(x, y);
      q[0] = r, q[1] = g, q[2] = b;
    }
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wm_render: roll the world model out along a trajectory and write an MP4. With --model naming a "
      "Matrix-Game-2.0 folder (config.json + safetensors, as the hub has it), the MG2 path: --image or --latents, "
      "--actions or --trajectory, --policy native or a memory policy"};
  wm::render::Mg2RenderOptions mg2;
  mg2.add_to(app);
  std::string model_path = "assets/models/tiny/model.safetensors";
  std::string suite = "assets/suites/revisit60.json";
  int index = 0;
  int64_t seed = -1;
  std::string policy = "worldkv";
  wm::rollout::RolloutOptions ro;
  std::string out = "rollout.mp4";
  std::string png_dir;
  int upscale = 6, fps = 16, max_seconds = 0, threads = 0;
  bool side_by_side = false, strip = false, no_prompt = false;
  uint64_t noise_seed = 0;
  std::string device = "auto";
  app.add_option("--model", model_path, "model weights (safetensors with its config)");
  auto* suite_opt = app.add_option("--suite", suite, "suite file, or gen:SEED:COUNT to generate one");
  auto* index_opt = app.add_option("--index", index, "episode of the suite")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "instead of a suite: generate one episode from this seed")
      ->check(CLI::NonNegativeNumber)->excludes(suite_opt)->excludes(index_opt);
  auto* policy_opt =
      app.add_option("--policy", policy,
                     "full_kv, sliding_window, sink_recent, worldkv, worldkv_c, worldkv_attn (Matrix-Game-2.0 also: "
                     "native, upstream's own window, its default)");
  ro.add_to(app);
  app.add_option("-o,--out", out, "output MP4 (written whole or not at all: a failed run leaves nothing under this name)");
  app.add_option("--png-dir", png_dir, "also write every output frame as PNG here (moved in when the run succeeds)");
  app.add_option("--upscale", upscale, "integer nearest-neighbour upscale")->check(CLI::Range(1, 32));
  app.add_option("--fps", fps, "frame rate of the MP4")->check(CLI::Range(1, 240));
  app.add_option("--max-seconds", max_seconds, "render only the first N seconds (0: all)")->check(CLI::Range(0, 86400));
  double context_t = 0;
  app.add_option("--context-t", context_t, "noise level of the refill pass (0: clean)")
      ->check(wm::cli::FiniteRange(0.0, 0.5));
  app.add_option("--noise-seed", noise_seed, "seed of the sampler's noise");
  app.add_flag("--side-by-side", side_by_side, "ground truth to the right of the model's frames");
  app.add_flag("--strip", strip, "a strip under the frames: chunks in the window (green), retrieved (orange)");
  app.add_flag("--no-prompt", no_prompt, "generate chunk 0 too instead of starting from the ground-truth first chunk");
  app.add_option("--device", device, "auto, cpu, cuda, cuda:N");
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  try {
    wm::init_threads(threads);
    const bool is_mg2 = std::filesystem::is_directory(model_path) || !mg2.mode.empty() || !mg2.image.empty() ||
                        !mg2.latents_in.empty();
    if (is_mg2) {
      mg2.model = model_path;
      mg2.out = app.count("--out") ? out : "";
      if (policy_opt->count()) mg2.policy = policy;
      mg2.placement = ro.placement;
      mg2.seed = noise_seed;
      mg2.device = device;
      if (app.count("--fps")) mg2.fps = fps;
      return wm::render::run_mg2_render(mg2);
    }
    wm::keep_freed_memory();  // K/V chunks come and go every chunk: no mmap/munmap each time
    const at::Device dev = wm::parse_device(device);
    if (!std::filesystem::exists(model_path))
      throw wm::Error("no model at '" + model_path + "' (train one with wm_train, or pass --model)");
    wm::world::Episode ep;
    int episode_fps = 0;  // the trajectory's frame rate: the suite's, or the generator's default
    if (seed >= 0) {
      const wm::world::TrajectoryOptions generated;
      ep = wm::world::generate_episode(static_cast<uint64_t>(seed), generated);
      episode_fps = generated.fps;
    } else {
      wm::world::Suite s = wm::world::load_or_generate_suite(suite);
      if (index < 0 || index >= static_cast<int>(s.episodes.size()))
        throw wm::Error(wm::str_cat("--index ", index, " out of range: the suite has ", s.episodes.size(), " episodes"));
      ep = s.episodes[index];
      episode_fps = s.fps;
    }
    const wm::world::Scene scene = wm::world::scene_of(ep);

    wm::worldkv::SessionConfig sc;
    sc.memory.policy = wm::worldkv::parse_policy(policy);
    ro.apply(sc);
    sc.seed = noise_seed;
    sc.sampler.context_t = context_t;
    wm::worldkv::WorldSession session(wm::worldkv::load_world_model(model_path, dev), sc, dev);
    const int F = session.frames_per_chunk();
    const int n = wm::rollout::covered_frames(ep, F, max_seconds * episode_fps);
    const int n_chunks = n / F;

    const wm::world::RenderSpec rs = wm::rollout::render_spec_of(session.model()->config());
    wm::world::Raycaster ray(scene, rs);
    const int fw = rs.width * upscale, fh = rs.height * upscale;
    const int strip_h = strip ? std::max(12, 3 * upscale) : 0;
    int W = fw * (side_by_side ? 2 : 1), H = fh + strip_h;
    W += W % 2;
    H += H % 2;
    wm::media::Mp4Writer writer(out, W, H, fps, 1);
    std::unique_ptr<wm::cli::OutputFolder> png_folder;
    std::unique_ptr<wm::media::PngSequenceWriter> pngs;
    if (!png_dir.empty()) {
      png_folder = std::make_unique<wm::cli::OutputFolder>(png_dir);
      pngs = std::make_unique<wm::media::PngSequenceWriter>(png_folder->staging());
    }
    std::fprintf(stderr, "wm_render: episode '%s', %d frames (%d chunks), policy %s, %s\n", ep.name.c_str(), n,
                 n_chunks, policy.c_str(), wm::describe_device(dev).c_str());

    std::vector<double> ms;
    double memory_ms = 0;
    wm::cli::ProgressLine progress;
    auto on_chunk = [&](const wm::worldkv::ChunkOutput& c, const wm::rollout::EpisodeRun&) {
      if (!c.prompt) ms.push_back(c.ms), memory_ms += c.memory_ms;
      const auto& mem = session.memory();
      std::vector<std::string> in_window;
      for (auto r : mem.window().layout().region_names())
        for (auto& id : mem.region_ids(r)) in_window.push_back(id);
      for (int f = 0; f < F; ++f) {
        const int frame = static_cast<int>(c.index) * F + f;
        wm::Image canvas(W, H);
        wm::media::upscale_into(c.frames[f], upscale, canvas, 0, 0);
        if (side_by_side) wm::media::upscale_into(ray.render(ep.poses[frame]), upscale, canvas, fw, 0);
        if (strip) {
          // One cell per chunk of the whole rollout: in the window green, retrieved orange, the
          // current chunk white, past chunks grey.
          for (int k = 0; k <= c.index; ++k) {
            const int x0 = static_cast<int>(static_cast<int64_t>(k) * W / n_chunks),
                      x1 = std::max(x0 + 1, static_cast<int>(static_cast<int64_t>(k + 1) * W / n_chunks));
            const std::string id = wm::worldkv::WorldMemory::chunk_id(k);
            uint8_t r = 90, g = 90, b = 90;
            if (std::find(in_window.begin(), in_window.end(), id) != in_window.end()) r = 40, g = 170, b = 60;
            if (std::find(c.retrieved.begin(), c.retrieved.end(), id) != c.retrieved.end()) r = 250, g = 150, b = 20;
            if (k == c.index) r = g = b = 255;
            fill(canvas, x0, fh + 2, x1, H, r, g, b);
          }
        }
        writer.write(canvas);
        if (pngs) pngs->write(canvas);
      }
      if (c.index % 10 == 0 || c.index + 1 == n_chunks)
        progress.show(c.index + 1 == n_chunks, "  chunk %lld/%d  %.0f ms  window %zu KiB  bank %zu KiB",
                      static_cast<long long>(c.index + 1), n_chunks, c.ms, mem.window_bytes() / 1024,
                      (mem.bank().bytes(wm::Tier::Device) + mem.bank().bytes(wm::Tier::Host) +
                       mem.bank().bytes(wm::Tier::Disk)) / 1024);
    };
    const auto t0 = std::chrono::steady_clock::now();
    wm::rollout::run_episode(session, ep, noise_seed, n, on_chunk, !no_prompt);
    // Every output complete before any takes its final name.
    writer.finish();
    if (png_folder) png_folder->commit();
    writer.close();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double sum = 0;
    for (double m : ms) sum += m;
    progress.finish();
    std::fprintf(stderr,
                 "wm_render: wrote %s (%dx%d, %d frames at %d fps)\n"
                 "  chunk ms: mean %.1f (memory %.2f), p50 %.1f, p90 %.1f, last %.1f; generated %.1f frames/s; wall %.1f s\n",
                 out.c_str(), W, H, writer.frames_written(), fps, sum / ms.size(), memory_ms / ms.size(),
                 percentile(ms, 0.5), percentile(ms, 0.9), ms.empty() ? 0.0 : ms.back(), 1000.0 * F * ms.size() / sum,
                 wall);
  } catch (const std::exception& e) {
    std::cerr << "wm_render: error: " << wm::cli::error_text(e) << "\n";
    return 1;
  }
  return 0;
}
