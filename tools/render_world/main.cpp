// wm_render_world: renders a trajectory of the ground-truth procedural world to an MP4 (and
// optionally PNG frames) so a person can look at it; also measures the raycaster's speed.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_folder.h"
#include "tools/cli/progress.h"
#include "tools/cli/validators.h"
#include "tools/media/mp4_writer.h"
#include "tools/media/png.h"
#include "tools/world/raycaster.h"
#include "tools/world/suite.h"

namespace {

using namespace wm::world;

// Frames per second of single-threaded rendering along the episode's poses.
double bench(const Raycaster& rc, const std::vector<Pose>& poses, int frames) {
  wm::Image img;
  rc.render(poses[0], img);  // warm up
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < frames; ++i) rc.render(poses[static_cast<size_t>(i) % poses.size()], img);
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return frames / dt;
}

// Side-by-side image of two frames (for revisit pairs).
wm::Image side_by_side(const wm::Image& a, const wm::Image& b) {
  wm::Image o(a.width * 2 + 2, a.height);
  for (int y = 0; y < a.height; ++y) {
    for (int x = 0; x < a.width; ++x)
      for (int k = 0; k < 3; ++k) {
        o.pixel(x, y)[k] = a.pixel(x, y)[k];
        o.pixel(a.width + 2 + x, y)[k] = b.pixel(x, y)[k];
      }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_render_world: render a ground-truth trajectory of the procedural world to MP4 (and PNG frames).\n"
               "Pick a trajectory from a suite (file or gen:SEED:COUNT) by --index, or generate one from --seed."};
  std::string suite_spec, out, png_dir, pairs_dir;
  int index = 0, upscale = 8, png_every = 1, bench_frames = 0, max_frames = 0;
  int64_t seed = -1;
  int width = 0, height = 0, supersample = 0;
  double fov = 0;
  bool list = false, print_map = false;
  auto* suite_opt =
      app.add_option("-s,--suite", suite_spec, "suite: a JSON file (e.g. assets/suites/revisit60.json) or gen:SEED:COUNT");
  app.add_option("-i,--index", index, "episode index in the suite")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "instead of a suite: generate one episode from this seed")
      ->check(CLI::NonNegativeNumber)->excludes(suite_opt);
  app.add_option("-o,--out", out, "output MP4 path");
  app.add_option("--png-dir", png_dir, "also write PNG frames (frame_00000.png ...) into this folder");
  app.add_option("--png-every", png_every, "write every k-th frame as PNG")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--pairs-dir", pairs_dir, "write each revisit pair side by side as PNG (pair_FIRST_REVISIT.png) into this folder");
  app.add_option("--upscale", upscale, "MP4 nearest-neighbour upscale factor")->capture_default_str()->check(CLI::Range(1, 32));
  app.add_option("--width", width, "render width (0: the suite's)")->check(CLI::Range(0, 4096));
  app.add_option("--height", height, "render height (0: the suite's)")->check(CLI::Range(0, 4096));
  app.add_option("--fov", fov, "horizontal field of view in degrees (0: the suite's)")->check(wm::cli::FiniteRange(0, 179));
  app.add_option("--supersample", supersample, "supersampling factor (0: the suite's)")->check(CLI::Range(0, 16));
  app.add_option("--max-frames", max_frames, "render at most this many frames (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--bench", bench_frames, "also time this many renders on one thread and print frames/s")
      ->check(CLI::Range(0, 100000000));
  app.add_flag("--list", list, "list the suite's episodes and exit");
  app.add_flag("--map", print_map, "print the episode's map (ASCII) to stderr");
  app.footer("Outputs are whole or absent: the MP4 and the PNG folders take their final names only when the "
             "whole run succeeded.");
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();

  try {
    if (suite_spec.empty() == (seed < 0))
      throw wm::Error("give exactly one of --suite SPEC or --seed N (see --help)");
    Suite suite;
    if (seed >= 0) {
      suite.name = "seed-" + std::to_string(seed);
      suite.episodes.push_back(generate_episode(static_cast<uint64_t>(seed)));
      suite.episodes.back().name = suite.name;
    } else {
      std::fprintf(stderr, "loading suite %s\n", suite_spec.c_str());
      suite = load_or_generate_suite(suite_spec);
    }
    if (list) {
      for (size_t i = 0; i < suite.episodes.size(); ++i) {
        const Episode& e = suite.episodes[i];
        std::printf("%3zu %-20s %-6s %2dx%-2d %4d frames (%.1f s) %4zu revisit pairs\n", i, e.name.c_str(), e.world.layout.c_str(),
                    e.world.width, e.world.height, e.frames(), e.frames() / double(suite.fps), e.revisits.size());
      }
      return 0;
    }
    if (index < 0 || index >= static_cast<int>(suite.episodes.size()))
      throw wm::Error("--index " + std::to_string(index) + ": expected 0.." + std::to_string(suite.episodes.size() - 1));
    if (out.empty() && png_dir.empty() && pairs_dir.empty() && bench_frames == 0)
      throw wm::Error("nothing to do: give --out FILE.mp4, --png-dir DIR, --pairs-dir DIR or --bench N");
    const Episode& ep = suite.episodes[static_cast<size_t>(index)];
    RenderSpec spec = suite.render;
    if (width) spec.width = width;
    if (height) spec.height = height;
    if (fov) spec.fov_deg = fov;
    if (supersample) spec.supersample = supersample;
    Scene scene = scene_of(ep);
    Raycaster rc(scene, spec);
    std::fprintf(stderr, "episode %s: %s layout %dx%d (seed %llu), %d frames (%.1f s at %d fps), %zu revisit pairs, %d landmarks\n",
                 ep.name.c_str(), ep.world.layout.c_str(), scene.width, scene.height,
                 static_cast<unsigned long long>(ep.world.seed), ep.frames(), ep.frames() / double(suite.fps), suite.fps,
                 ep.revisits.size(), scene.landmark_count());
    if (print_map) std::fprintf(stderr, "%s", scene.ascii().c_str());

    if (bench_frames > 0) {
      double fps = bench(rc, ep.poses, bench_frames);
      std::printf("render speed: %.0f frames/s (%dx%d, fov %.0f, supersample %d, one thread, %d frames)\n", fps, spec.width,
                  spec.height, spec.fov_deg, spec.supersample, bench_frames);
    }
    int n = ep.frames();
    if (max_frames > 0) n = std::min(n, max_frames);
    // Every output opened before any work, committed together at the end.
    std::unique_ptr<wm::media::Mp4Writer> mp4;
    if (!out.empty()) mp4 = std::make_unique<wm::media::Mp4Writer>(out, spec.width, spec.height, suite.fps, upscale);
    std::unique_ptr<wm::cli::OutputFolder> pngs, pairs;
    if (!png_dir.empty()) pngs = std::make_unique<wm::cli::OutputFolder>(png_dir);
    if (!pairs_dir.empty()) pairs = std::make_unique<wm::cli::OutputFolder>(pairs_dir);
    if (mp4 || pngs) {
      wm::Image img;
      auto t0 = std::chrono::steady_clock::now();
      wm::cli::ProgressLine progress;
      for (int t = 0; t < n; ++t) {
        rc.render(ep.poses[static_cast<size_t>(t)], img);
        if (mp4) mp4->write(img);
        if (pngs && t % png_every == 0) {
          char name[64];
          std::snprintf(name, sizeof name, "frame_%05d.png", t);
          wm::media::write_png(pngs->file(name), img);
        }
        if ((t + 1) % 64 == 0 || t + 1 == n) progress.show(t + 1 == n, "frame %d/%d", t + 1, n);
      }
      if (mp4) mp4->finish();
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress.finish();
      std::fprintf(stderr, "rendered %d frames in %.2f s\n", n, dt);
    }
    int pairs_written = 0;
    if (pairs) {
      for (const RevisitPair& p : ep.revisits) {
        if (p.revisit >= n) continue;
        wm::Image a = rc.render(ep.poses[static_cast<size_t>(p.first)]), b = rc.render(ep.poses[static_cast<size_t>(p.revisit)]);
        char name[64];
        std::snprintf(name, sizeof name, "pair_%05d_%05d.png", p.first, p.revisit);
        wm::media::write_png(pairs->file(name), side_by_side(a, b));
        ++pairs_written;
      }
    }
    if (pngs) pngs->commit();
    if (pairs) pairs->commit();
    if (mp4) mp4->close();
    if (mp4) std::fprintf(stderr, "wrote %s\n", out.c_str());
    if (pngs) std::fprintf(stderr, "wrote PNG frames in %s\n", png_dir.c_str());
    if (pairs) std::fprintf(stderr, "wrote %d revisit pair images to %s\n", pairs_written, pairs_dir.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_render_world: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
  return 0;
}
