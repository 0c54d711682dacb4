// wm_render_world: renders a trajectory of the ground-truth procedural world to an MP4 (and
// optionally PNG frames) so a person can look at it; also measures the raycaster's speed.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

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

struct Options {
  std::string suite_spec, out, png_dir, pairs_dir;
  int index = 0, upscale = 8, png_every = 1, bench_frames = 0, max_frames = 0;
  int64_t seed = -1;
  int width = 0, height = 0, supersample = 0;
  double fov = 0;
  bool list = false, print_map = false;
};

void add_options(CLI::App& app, Options& o) {
  auto* suite_opt =
      app.add_option("-s,--suite", o.suite_spec, "suite: a JSON file (e.g. assets/suites/revisit60.json) or gen:SEED:COUNT");
  app.add_option("-i,--index", o.index, "episode index in the suite")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "instead of a suite: generate one episode from this seed")
      ->check(CLI::NonNegativeNumber)->excludes(suite_opt);
  app.add_option("-o,--out", o.out, "output MP4 path");
  app.add_option("--png-dir", o.png_dir, "also write PNG frames (frame_00000.png ...) into this folder");
  app.add_option("--png-every", o.png_every, "write every k-th frame as PNG")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--pairs-dir", o.pairs_dir, "write each revisit pair side by side as PNG (pair_FIRST_REVISIT.png) into this folder");
  app.add_option("--upscale", o.upscale, "MP4 nearest-neighbour upscale factor")->capture_default_str()->check(CLI::Range(1, 32));
  app.add_option("--width", o.width, "render width (0: the suite's)")->check(CLI::Range(0, 4096));
  app.add_option("--height", o.height, "render height (0: the suite's)")->check(CLI::Range(0, 4096));
  app.add_option("--fov", o.fov, "horizontal field of view in degrees (0: the suite's)")->check(wm::cli::FiniteRange(0, 179));
  app.add_option("--supersample", o.supersample, "supersampling factor (0: the suite's)")->check(CLI::Range(0, 16));
  app.add_option("--max-frames", o.max_frames, "render at most this many frames (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--bench", o.bench_frames, "also time this many renders on one thread and print frames/s")
      ->check(CLI::Range(0, 100000000));
  app.add_flag("--list", o.list, "list the suite's episodes and exit");
  app.add_flag("--map", o.print_map, "print the episode's map (ASCII) to stderr");
  app.footer("Outputs are whole or absent: the MP4 and the PNG folders take their final names only when the "
             "whole run succeeded.");
}

// The suite --suite names, or one episode generated from --seed. Throws wm::Error without
// exactly one of them.
Suite load_suite(const Options& o) {
  if (o.suite_spec.empty() == (o.seed < 0)) throw wm::Error("give exactly one of --suite SPEC or --seed N (see --help)");
  Suite suite;
  if (o.seed >= 0) {
    suite.name = "seed-" + std::to_string(o.seed);
    suite.episodes.push_back(generate_episode(static_cast<uint64_t>(o.seed)));
    suite.episodes.back().name = suite.name;
  } else {
    std::fprintf(stderr, "loading suite %s\n", o.suite_spec.c_str());
    suite = load_or_generate_suite(o.suite_spec);
  }
  return suite;
}

void list_episodes(const Suite& suite) {
  for (size_t i = 0; i < suite.episodes.size(); ++i) {
    const Episode& e = suite.episodes[i];
    std::printf("%3zu %-20s %-6s %2dx%-2d %4d frames (%.1f s) %4zu revisit pairs\n", i, e.name.c_str(), e.world.layout.c_str(),
                e.world.width, e.world.height, e.frames(), e.frames() / double(suite.fps), e.revisits.size());
  }
}

// The episode's first n frames into the MP4 and (every png_every-th) the PNG folder, either
// may be absent.
void render_frames(const Raycaster& rc, const Episode& ep, int n, wm::media::Mp4Writer* mp4,
                   wm::cli::OutputFolder* pngs, int png_every) {
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

// Each revisit pair within the first n frames, side by side, into the folder; returns how many.
int write_pairs(const Raycaster& rc, const Episode& ep, int n, wm::cli::OutputFolder& pairs) {
  int written = 0;
  for (const RevisitPair& p : ep.revisits) {
    if (p.revisit >= n) continue;
    wm::Image a = rc.render(ep.poses[static_cast<size_t>(p.first)]), b = rc.render(ep.poses[static_cast<size_t>(p.revisit)]);
    char name[64];
    std::snprintf(name, sizeof name, "pair_%05d_%05d.png", p.first, p.revisit);
    wm::media::write_png(pairs.file(name), side_by_side(a, b));
    ++written;
  }
  return written;
}

void run(const Options& o) {
  const Suite suite = load_suite(o);
  if (o.list) {
    list_episodes(suite);
    return;
  }
  if (o.index < 0 || o.index >= static_cast<int>(suite.episodes.size()))
    throw wm::Error("--index " + std::to_string(o.index) + ": expected 0.." + std::to_string(suite.episodes.size() - 1));
  if (o.out.empty() && o.png_dir.empty() && o.pairs_dir.empty() && o.bench_frames == 0)
    throw wm::Error("nothing to do: give --out FILE.mp4, --png-dir DIR, --pairs-dir DIR or --bench N");
  const Episode& ep = suite.episodes[static_cast<size_t>(o.index)];
  RenderSpec spec = suite.render;
  if (o.width) spec.width = o.width;
  if (o.height) spec.height = o.height;
  if (o.fov) spec.fov_deg = o.fov;
  if (o.supersample) spec.supersample = o.supersample;
  Scene scene = scene_of(ep);
  Raycaster rc(scene, spec);
  std::fprintf(stderr, "episode %s: %s layout %dx%d (seed %llu), %d frames (%.1f s at %d fps), %zu revisit pairs, %d landmarks\n",
               ep.name.c_str(), ep.world.layout.c_str(), scene.width, scene.height,
               static_cast<unsigned long long>(ep.world.seed), ep.frames(), ep.frames() / double(suite.fps), suite.fps,
               ep.revisits.size(), scene.landmark_count());
  if (o.print_map) std::fprintf(stderr, "%s", scene.ascii().c_str());

  if (o.bench_frames > 0) {
    double fps = bench(rc, ep.poses, o.bench_frames);
    std::printf("render speed: %.0f frames/s (%dx%d, fov %.0f, supersample %d, one thread, %d frames)\n", fps, spec.width,
                spec.height, spec.fov_deg, spec.supersample, o.bench_frames);
  }
  int n = ep.frames();
  if (o.max_frames > 0) n = std::min(n, o.max_frames);
  // Every output opened before any work, committed together at the end.
  std::unique_ptr<wm::media::Mp4Writer> mp4;
  if (!o.out.empty()) mp4 = std::make_unique<wm::media::Mp4Writer>(o.out, spec.width, spec.height, suite.fps, o.upscale);
  std::unique_ptr<wm::cli::OutputFolder> pngs, pairs;
  if (!o.png_dir.empty()) pngs = std::make_unique<wm::cli::OutputFolder>(o.png_dir);
  if (!o.pairs_dir.empty()) pairs = std::make_unique<wm::cli::OutputFolder>(o.pairs_dir);
  if (mp4 || pngs) render_frames(rc, ep, n, mp4.get(), pngs.get(), o.png_every);
  const int pairs_written = pairs ? write_pairs(rc, ep, n, *pairs) : 0;
  if (pngs) pngs->commit();
  if (pairs) pairs->commit();
  if (mp4) mp4->close();
  if (mp4) std::fprintf(stderr, "wrote %s\n", o.out.c_str());
  if (pngs) std::fprintf(stderr, "wrote PNG frames in %s\n", o.png_dir.c_str());
  if (pairs) std::fprintf(stderr, "wrote %d revisit pair images to %s\n", pairs_written, o.pairs_dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_render_world: render a ground-truth trajectory of the procedural world to MP4 (and PNG frames).\n"
               "Pick a trajectory from a suite (file or gen:SEED:COUNT) by --index, or generate one from --seed."};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  try {
    run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_render_world: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
  return 0;
}
