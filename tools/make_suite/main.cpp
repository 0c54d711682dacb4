// wm_make_suite: generates a benchmark suite of scene-trajectory pairs (procedural world +
// camera trajectory with loop closures) from a seed and a count, checks every revisit pair by
// rendering it, writes the suite JSON and prints statistics.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>

#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/progress.h"
#include "tools/cli/validators.h"
#include "tools/world/suite.h"

namespace {

using namespace wm::world;

void print_stats(const Suite& s, const RenderSpec& check_spec, double min_required) {
  int min_f = 1 << 30, max_f = 0;
  long total_f = 0, pairs = 0;
  double min_psnr = INFINITY;
  int finite = 0, with_pairs = 0;
  std::map<std::string, int> kinds, layouts;
  std::vector<int> gaps;
  int mid = 0;  // pairs whose first visit is not in the first second
  for (const Episode& ep : s.episodes) {
    for (const RevisitPair& p : ep.revisits) {
      gaps.push_back(p.revisit - p.first);
      mid += p.first >= s.fps;
    }
    min_f = std::min(min_f, ep.frames());
    max_f = std::max(max_f, ep.frames());
    total_f += ep.frames();
    pairs += static_cast<long>(ep.revisits.size());
    with_pairs += !ep.revisits.empty();
    layouts[ep.world.layout]++;
    for (const Segment& g : ep.segments) kinds[g.kind]++;
    Scene scene = scene_of(ep);
    for (double p : revisit_psnrs(ep, scene, check_spec)) {
      min_psnr = std::min(min_psnr, p);
      finite += std::isfinite(p);
    }
  }
  std::fprintf(stderr, "suite %s: %zu episodes, %ld frames (%.1f min at %d fps), length %.1f..%.1f s\n", s.name.c_str(),
               s.episodes.size(), total_f, total_f / double(s.fps) / 60.0, s.fps, min_f / double(s.fps), max_f / double(s.fps));
  std::fprintf(stderr, "revisit pairs: %ld (episodes with >= 1: %d/%zu); min PSNR of pairs %.2f dB (%d pairs not bit-identical); required >= %.1f\n",
               pairs, with_pairs, s.episodes.size(), min_psnr, finite, min_required);
  std::sort(gaps.begin(), gaps.end());
  if (!gaps.empty())
    std::fprintf(stderr, "revisit gap (frames): min %d, median %d, max %d; pairs with the first visit after 1 s: %d\n", gaps.front(),
                 gaps[gaps.size() / 2], gaps.back(), mid);
  std::fprintf(stderr, "layouts:");
  for (auto& [k, n] : layouts) std::fprintf(stderr, " %s=%d", k.c_str(), n);
  std::fprintf(stderr, "\nsegments:");
  for (auto& [k, n] : kinds) std::fprintf(stderr, " %s=%d", k.c_str(), n);
  std::fprintf(stderr, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_make_suite: generate a suite of scene-trajectory pairs with loop closures (revisits) as JSON.\n"
               "Each episode is a procedural raycast world (seeded layout and appearance) and a camera trajectory\n"
               "of W/A/S/D + mouse-yaw actions at 16 fps, with revisit pairs checked by rendering (PSNR)."};
  uint64_t seed = 60;
  int count = 60;
  std::string out, name;
  int min_s = 10, max_s = 60, pose_every = 1, decimals = 3;
  int width = 64, height = 64, supersample = 2;
  double fov = 90, min_psnr = 30;
  bool no_segments = false, no_check = false;
  app.add_option("--seed", seed, "suite seed")->capture_default_str();
  app.add_option("--count", count, "number of episodes")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("-o,--out", out, "output JSON path (e.g. assets/suites/revisit60.json)")->required();
  app.add_option("--name", name, "suite name (default: file stem)");
  app.add_option("--min-seconds", min_s, "shortest trajectory, seconds")->capture_default_str()->check(CLI::Range(1, 3600));
  app.add_option("--max-seconds", max_s, "longest trajectory, seconds")->capture_default_str()->check(CLI::Range(1, 3600));
  app.add_option("--width", width, "render width recorded in the suite (and used for the PSNR check)")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--height", height, "render height")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--fov", fov, "horizontal field of view, degrees")->capture_default_str()
      ->check(wm::cli::FiniteRange(1, 179));
  app.add_option("--supersample", supersample, "render supersampling factor (s x s per pixel)")->capture_default_str()
      ->check(CLI::Range(1, 16));
  app.add_option("--min-psnr", min_psnr, "drop revisit pairs whose ground-truth renders agree less (dB)")
      ->capture_default_str()->check(wm::cli::FiniteRange(0, 1000));
  app.add_option("--pose-every", pose_every, "store every k-th pose for verification (0: none; poses are re-derived from actions)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_option("--pose-decimals", decimals, "rounding of stored poses")->capture_default_str()->check(CLI::Range(0, 12));
  app.add_flag("--no-segments", no_segments, "do not store the generator's segment list");
  app.add_flag("--no-check", no_check, "skip parsing the written text back to verify it");
  app.footer("The suite file is written whole (a temporary name, then a rename) once it is verified, or not at all.");
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();

  try {
    if (min_s > max_s) throw wm::Error("--min-seconds " + std::to_string(min_s) + " > --max-seconds " + std::to_string(max_s));
    wm::cli::OutputFile file(out);  // opened first: a bad path fails before the work
    SuiteOptions so;
    if (name.empty()) {
      std::string stem = out.substr(out.find_last_of('/') + 1);
      name = stem.substr(0, stem.rfind(".json") == std::string::npos ? stem.size() : stem.rfind(".json"));
    }
    so.name = name;
    so.trajectory.min_seconds = min_s;
    so.trajectory.max_seconds = max_s;
    so.trajectory.render = RenderSpec{width, height, fov, supersample};
    so.trajectory.min_psnr_db = min_psnr;
    auto t0 = std::chrono::steady_clock::now();
    wm::cli::ProgressLine progress;
    Suite s = generate_suite(seed, count, so, [&](int done, int n) { progress.show(done == n, "generating %d/%d", done, n); });
    progress.finish();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SaveOptions save;
    save.pose_every = pose_every;
    save.pose_decimals = decimals;
    save.segments = !no_segments;
    const std::string text = suite_to_json(s, save);
    if (!no_check) {
      Suite back = suite_from_json(text, out);
      if (back.episodes.size() != s.episodes.size()) throw wm::Error(out + ": re-load gave a different episode count");
      for (size_t i = 0; i < s.episodes.size(); ++i)
        if (back.episodes[i].actions != s.episodes[i].actions || !(back.episodes[i].revisits == s.episodes[i].revisits))
          throw wm::Error(out + ": re-load of episode " + std::to_string(i) + " differs");
    }
    file.stream() << text;
    file.commit();
    std::fprintf(stderr, "wrote %s in %.1f s%s\n", out.c_str(), dt, no_check ? "" : " (parsed back and verified)");
    print_stats(s, so.trajectory.render, min_psnr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_make_suite: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
  return 0;
}
