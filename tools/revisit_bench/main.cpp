// wm_revisit_bench: revisit fidelity of the memory policies. For every episode of a suite and
// every policy, the model is rolled out along the trajectory; at each revisit pair (frame j shows
// the view of frame i again) the frame generated at j is compared with the one generated at i
// (does the world stay the same?) and with the ground truth. Also: generation speed against
// rollout length, window and bank bytes. Output: a table, JSON, CSV and PNG plots.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_folder.h"
#include "tools/cli/progress.h"
#include "tools/media/metrics.h"
#include "tools/media/png.h"
#include "tools/media/upscale.h"
#include "tools/rollout/cli_options.h"
#include "tools/rollout/episode_runner.h"
#include "tools/rollout/plot.h"
#include "tools/rollout/world_adapter.h"
#include "tools/world/raycaster.h"
#include "tools/world/suite.h"

namespace fs = std::filesystem;

namespace {

struct EpisodeScore {
  std::string name;
  int frames = 0, pairs = 0;
  double revisit_psnr = 0, revisit_ssim = 0;  // generated j vs generated i, mean over pairs
  double gt_psnr = 0, gt_ssim = 0;            // generated j vs ground truth j, over the pairs
  double gt_psnr_all = 0;                     // every generated frame vs its ground truth
  double fps_last = 0, fps_mean = 0;
  double memory_ms = 0;  // mean per generated chunk: the memory's retrieval, placement, banking
  size_t peak_window = 0, bank[3] = {0, 0, 0};
  std::vector<double> chunk_ms;
};

struct PolicyScore {
  std::string policy;
  std::vector<EpisodeScore> eps;
  double mean(double EpisodeScore::*f, bool with_pairs_only = false) const {
    double s = 0;
    int n = 0;
    for (auto& e : eps)
      if (!with_pairs_only || e.pairs > 0) s += e.*f, ++n;
    return n ? s / n : std::nan("");
  }
};

wm::Image side_by_side(const std::vector<const wm::Image*>& ims, int scale) {
  const int w = ims[0]->width, h = ims[0]->height;
  wm::Image out(w * scale * static_cast<int>(ims.size()), h * scale);
  for (size_t k = 0; k < ims.size(); ++k) wm::media::upscale_into(*ims[k], scale, out, static_cast<int>(k) * w * scale, 0);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_revisit_bench: revisit fidelity, speed and memory of the KV-memory policies"};
  std::string model_path = "assets/models/tiny/model.safetensors";
  std::string suite_spec = "assets/suites/revisit60.json";
  std::vector<std::string> policies = {"full_kv", "sliding_window", "sink_recent", "worldkv", "worldkv_c"};
  wm::rollout::RolloutOptions ro;
  std::string out_dir = "bench_out", dump_dir;
  int episodes = 0, max_seconds = 0, threads = 0, dump_max = 20;
  bool no_prompt = false;
  uint64_t noise_seed = 0;
  std::string device = "auto";
  app.add_option("--model", model_path, "model weights (safetensors with its config)");
  app.add_option("--suite", suite_spec, "suite file, or gen:SEED:COUNT to generate one");
  app.add_option("--episodes", episodes, "use the first N episodes (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--max-seconds", max_seconds, "roll out at most N seconds of each episode (0: all)")
      ->check(CLI::Range(0, 86400));
  app.add_option("--policies", policies, "policies to compare")->expected(1, -1)
      ->check(CLI::IsMember(wm::worldkv::policy_names()));
  ro.add_to(app);
  app.add_option("--noise-seed", noise_seed, "seed of the sampler's noise (the same for every policy)");
  app.add_option("--out-dir", out_dir,
                 "where results.json, results.csv and the plots go (moved in when the whole run succeeds)");
  app.add_option("--dump-dir", dump_dir, "write revisit pairs as PNG (first visit | revisit | ground truth)");
  app.add_option("--dump-max", dump_max, "at most this many pairs per episode and policy in --dump-dir")
      ->check(CLI::Range(1, 1000000));
  app.add_flag("--no-prompt", no_prompt, "generate chunk 0 too instead of starting from the ground-truth first chunk");
  app.add_option("--device", device, "auto, cpu, cuda, cuda:N");
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  try {
    wm::init_threads(threads);
    wm::keep_freed_memory();  // K/V chunks come and go every chunk: no mmap/munmap each time
    const at::Device dev = wm::parse_device(device);
    // Outputs are whole or absent: written into temporary folders, moved in at the end.
    wm::cli::OutputFolder results(out_dir);
    std::unique_ptr<wm::cli::OutputFolder> dumps;
    if (!dump_dir.empty()) dumps = std::make_unique<wm::cli::OutputFolder>(dump_dir);
    if (!fs::exists(model_path)) throw wm::Error("no model at '" + model_path + "' (train one with wm_train, or pass --model)");
    wm::world::Suite suite = wm::world::load_or_generate_suite(suite_spec);
    if (episodes > 0 && episodes < static_cast<int>(suite.episodes.size())) suite.episodes.resize(episodes);
    std::vector<wm::worldkv::Policy> pols;
    for (auto& p : policies) pols.push_back(wm::worldkv::parse_policy(p));

    wm::dit::CausalDit model = wm::worldkv::load_world_model(model_path, dev);
    const auto& mc = model->config();
    const wm::world::RenderSpec rs = wm::rollout::render_spec_of(mc);
    wm::worldkv::SessionConfig sc;
    ro.apply(sc);

    int total_frames = 0;
    for (auto& ep : suite.episodes) total_frames += wm::rollout::covered_frames(ep, mc.frames_per_chunk, max_seconds * suite.fps);
    std::fprintf(stderr, "wm_revisit_bench: %zu episodes, %d frames each policy, %zu policies, %s\n",
                 suite.episodes.size(), total_frames, pols.size(), wm::describe_device(dev).c_str());

    std::vector<PolicyScore> scores;
    const auto t_all = std::chrono::steady_clock::now();
    int done_frames = 0;
    wm::cli::ProgressLine progress;
    const int all_frames = total_frames * static_cast<int>(pols.size());
    for (auto pol : pols) scores.push_back({wm::worldkv::policy_name(pol), {}});
    for (size_t e = 0; e < suite.episodes.size(); ++e) {
      const auto& ep = suite.episodes[e];
      const wm::world::Scene scene = wm::world::scene_of(ep);
      wm::world::Raycaster ray(scene, rs);
      const int n = wm::rollout::covered_frames(ep, mc.frames_per_chunk, max_seconds * suite.fps);
      std::vector<wm::Image> gt;
      for (int f = 0; f < n; ++f) gt.push_back(ray.render(ep.poses[f]));
      std::vector<wm::world::RevisitPair> pairs;
      for (auto& p : ep.revisits)
        if (p.revisit < n) pairs.push_back(p);
      for (size_t pi = 0; pi < pols.size(); ++pi) {
        sc.memory.policy = pols[pi];
        wm::worldkv::WorldSession session(model, sc, dev);
        auto run = wm::rollout::run_episode(session, ep, noise_seed, n, [&](const auto& c, const auto&) {
          done_frames += mc.frames_per_chunk;
          if (c.index % 20 == 0 || done_frames == all_frames) {
            const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_all).count();
            progress.show(done_frames == all_frames, "  episode %zu/%zu  %-14s chunk %lld  %5.1f%%  eta %.0f s", e + 1,
                          suite.episodes.size(), scores[pi].policy.c_str(), static_cast<long long>(c.index),
                          100.0 * done_frames / all_frames, el / done_frames * (all_frames - done_frames));
          }
        }, !no_prompt);
        // Pairs whose first visit lies in the prompt would compare with the ground truth itself.
        std::vector<wm::world::RevisitPair> scored;
        for (auto& p : pairs)
          if (p.first >= run.prompt_frames) scored.push_back(p);
        EpisodeScore s;
        s.name = ep.name;
        s.frames = n;
        s.pairs = static_cast<int>(scored.size());
        int dumped = 0;
        for (auto& p : scored) {
          const wm::Image &a = run.frames[p.first], &b = run.frames[p.revisit];
          s.revisit_psnr += wm::media::capped_psnr(b, a) / scored.size();
          s.revisit_ssim += wm::media::ssim(b, a) / scored.size();
          s.gt_psnr += wm::media::capped_psnr(b, gt[p.revisit]) / scored.size();
          s.gt_ssim += wm::media::ssim(b, gt[p.revisit]) / scored.size();
          if (!dump_dir.empty() && dumped < dump_max && (scored.size() <= static_cast<size_t>(dump_max) ||
                                                        (&p - &scored[0]) % (scored.size() / dump_max) == 0)) {
            char name[256];
            std::snprintf(name, sizeof name, "%s_ep%03zu_%05d_%05d.png", scores[pi].policy.c_str(), e, p.first,
                          p.revisit);
            wm::media::write_png(dumps->file(name), side_by_side({&a, &b, &gt[p.revisit]}, 4));
            ++dumped;
          }
        }
        for (int f = run.prompt_frames; f < n; ++f)
          s.gt_psnr_all += wm::media::capped_psnr(run.frames[f], gt[f]) / std::max(1, n - run.prompt_frames);
        // Speed of generated chunks only (the prompt chunk is an encode and one pass).
        double sum = 0;
        for (auto& c : run.chunks)
          if (!c.prompt) sum += c.ms, s.chunk_ms.push_back(c.ms), s.memory_ms += c.memory_ms;
        if (!s.chunk_ms.empty()) s.memory_ms /= static_cast<double>(s.chunk_ms.size());
        // Speed at the end of the rollout: the median of the last 10 chunks (a shared machine's
        // hiccups move a mean of a few chunks by 20%).
        const size_t k = std::min<size_t>(10, s.chunk_ms.size());
        std::vector<double> tail(s.chunk_ms.end() - static_cast<std::ptrdiff_t>(k), s.chunk_ms.end());
        std::sort(tail.begin(), tail.end());
        const double last = k == 0 ? 0 : (k % 2 ? tail[k / 2] : 0.5 * (tail[k / 2 - 1] + tail[k / 2]));
        s.fps_last = k ? 1000.0 * mc.frames_per_chunk / last : 0;
        s.fps_mean = s.chunk_ms.empty() ? 0 : 1000.0 * mc.frames_per_chunk * s.chunk_ms.size() / sum;
        s.peak_window = run.peak_window_bytes;
        for (int t = 0; t < 3; ++t) s.bank[t] = run.chunks.back().bank_bytes[t];
        scores[pi].eps.push_back(std::move(s));
      }
    }
    progress.finish();

    // Table.
    std::printf("\nRevisit fidelity on %zu episodes (%d frames each policy; PSNR capped at %.0f dB)\n",
                suite.episodes.size(), total_frames, wm::media::kPsnrCap);
    std::printf("%-15s %9s %8s | %9s %8s %9s | %8s %8s | %10s %10s %9s %9s\n", "policy", "rev PSNR", "rev SSIM",
                "GT PSNR", "GT SSIM", "GT all", "FPS last", "FPS mean", "window KiB", "dev KiB", "host KiB",
                "disk KiB");
    nlohmann::json J;
    J["suite"] = suite_spec;
    J["model"] = model_path;
    J["episodes"] = suite.episodes.size();
    J["max_seconds"] = max_seconds;
    J.update(ro.to_json());
    std::ofstream csv(results.file("results.csv"));
    csv << "policy,revisit_psnr,revisit_ssim,gt_psnr,gt_ssim,gt_psnr_all,fps_last,fps_mean,memory_ms,peak_window_bytes,"
           "bank_device_bytes,bank_host_bytes,bank_disk_bytes\n";
    std::vector<std::pair<std::string, double>> bars;
    std::vector<wm::rollout::Series> fps_series;
    for (auto& ps : scores) {
      size_t peak = 0, bank[3] = {0, 0, 0};
      for (auto& e : ps.eps) {
        peak = std::max(peak, e.peak_window);
        for (int t = 0; t < 3; ++t) bank[t] = std::max(bank[t], e.bank[t]);
      }
      const double rp = ps.mean(&EpisodeScore::revisit_psnr, true), rss = ps.mean(&EpisodeScore::revisit_ssim, true),
                   gp = ps.mean(&EpisodeScore::gt_psnr, true), gs = ps.mean(&EpisodeScore::gt_ssim, true),
                   ga = ps.mean(&EpisodeScore::gt_psnr_all), fl = ps.mean(&EpisodeScore::fps_last),
                   fm = ps.mean(&EpisodeScore::fps_mean), mm = ps.mean(&EpisodeScore::memory_ms);
      std::printf("%-15s %9.2f %8.4f | %9.2f %8.4f %9.2f | %8.1f %8.1f | %10zu %10zu %9zu %9zu\n", ps.policy.c_str(), rp,
                  rss, gp, gs, ga, fl, fm, peak / 1024, bank[0] / 1024, bank[1] / 1024, bank[2] / 1024);
      if (std::isnan(rp) && &ps == &scores.back())
        std::printf("(no revisit pair lies inside the frames rolled out: raise --max-seconds)\n");
      csv << ps.policy << "," << rp << "," << rss << "," << gp << "," << gs << "," << ga << "," << fl << "," << fm << ","
          << mm << "," << peak << "," << bank[0] << "," << bank[1] << "," << bank[2] << "\n";
      nlohmann::json pj = {{"policy", ps.policy}, {"revisit_psnr", rp}, {"revisit_ssim", rss}, {"gt_psnr", gp},
                           {"gt_ssim", gs},       {"gt_psnr_all", ga},  {"fps_last", fl},      {"fps_mean", fm},
                           {"memory_ms", mm}, {"peak_window_bytes", peak}, {"bank_bytes", {bank[0], bank[1], bank[2]}}};
      for (auto& e : ps.eps)
        pj["episodes"].push_back({{"name", e.name}, {"frames", e.frames}, {"pairs", e.pairs},
                                  {"revisit_psnr", e.revisit_psnr}, {"revisit_ssim", e.revisit_ssim},
                                  {"gt_psnr", e.gt_psnr}, {"gt_ssim", e.gt_ssim}, {"gt_psnr_all", e.gt_psnr_all},
                                  {"fps_last", e.fps_last}, {"fps_mean", e.fps_mean}, {"memory_ms", e.memory_ms},
                                  {"chunk_ms", e.chunk_ms}});
      J["policies"].push_back(pj);
      bars.push_back({ps.policy, rp});
      // FPS against rollout length: per chunk index, the mean over the episodes that reach it,
      // smoothed over 5 chunks.
      size_t longest = 0;
      for (auto& e : ps.eps) longest = std::max(longest, e.chunk_ms.size());
      wm::rollout::Series s{ps.policy, {}};
      for (size_t c = 0; c < longest; ++c) {
        double sum = 0;
        int cnt = 0;
        for (auto& e : ps.eps)
          for (size_t d = (c >= 2 ? c - 2 : 0); d <= c + 2 && d < e.chunk_ms.size(); ++d) sum += e.chunk_ms[d], ++cnt;
        if (cnt) s.points.push_back({(c + 2) * mc.frames_per_chunk / static_cast<double>(suite.fps), 1000.0 * mc.frames_per_chunk / (sum / cnt)});
      }
      fps_series.push_back(s);
    }
    csv.close();
    if (!csv) throw wm::Error("writing " + out_dir + "/results.csv failed");
    std::ofstream json(results.file("results.json"));
    json << J.dump(2) << "\n";
    json.close();
    if (!json) throw wm::Error("writing " + out_dir + "/results.json failed");
    wm::rollout::bar_chart(results.file("revisit_psnr.png"),
                           "Revisit PSNR: frame at the revisit vs frame at the first visit", "PSNR (dB)", bars);
    wm::rollout::line_chart(results.file("fps_vs_length.png"), "Generation speed against rollout length",
                            "rollout length (s of video)", "generated frames / s", fps_series);
    if (dumps) dumps->commit();
    results.commit();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_all).count();
    std::printf("\nwrote %s/results.json, results.csv, revisit_psnr.png, fps_vs_length.png%s; %.0f s\n", out_dir.c_str(),
                dump_dir.empty() ? "" : (", pairs in " + dump_dir).c_str(), wall);
  } catch (const std::exception& e) {
    std::cerr << "wm_revisit_bench: error: " << wm::cli::error_text(e) << "\n";
    return 1;
  }
  return 0;
}
