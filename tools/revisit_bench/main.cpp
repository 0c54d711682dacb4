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
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
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
#include "tools/rollout/lingbot_start.h"
#include "tools/rollout/plot.h"
#include "tools/rollout/world_adapter.h"
#include "tools/revisit_bench/lingbot_rollouts.h"
#include "tools/world/raycaster.h"
#include "tools/world/suite.h"
#include "worldkv/tiny_dit_adapter.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_revisit_bench {

namespace fs = std::filesystem;

namespace {

// The command line.
struct Options {
  std::string model_path = "assets/models/tiny/model.safetensors";
  std::string suite_spec = "assets/suites/revisit60.json";
  std::vector<std::string> policies = {"full_kv", "sliding_window", "sink_recent", "worldkv", "worldkv_c"};
  wm::rollout::RolloutOptions ro;
  std::string out_dir = "bench_out", dump_dir;
  int episodes = 0, max_seconds = 0, threads = 0, dump_max = 20;
  bool no_prompt = false;
  uint64_t noise_seed = 0;
  std::string device = "auto";
  wm::rollout::LingbotBenchModel lingbot;  // with --model naming a LingBot-World-Fast folder
  std::string lingbot_size = "480x832", lingbot_dtype = "f32";
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--model", o.model_path, "model weights (safetensors with its config)");
  app.add_option("--suite", o.suite_spec, "suite file, or gen:SEED:COUNT to generate one");
  app.add_option("--episodes", o.episodes, "use the first N episodes (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--max-seconds", o.max_seconds, "roll out at most N seconds of each episode (0: all)")
      ->check(CLI::Range(0, 86400));
  app.add_option("--policies", o.policies, "policies to compare")->expected(1, -1)
      ->check(CLI::IsMember(wm::worldkv::policy_names()));
  o.ro.add_to(app);
  app.add_option("--noise-seed", o.noise_seed, "seed of the sampler's noise (the same for every policy)");
  app.add_option("--out-dir", o.out_dir,
                 "where results.json, results.csv and the plots go (moved in when the whole run succeeds)");
  app.add_option("--dump-dir", o.dump_dir, "write revisit pairs as PNG (first visit | revisit | ground truth)");
  app.add_option("--dump-max", o.dump_max, "at most this many pairs per episode and policy in --dump-dir")
      ->check(CLI::Range(1, 1000000));
  app.add_flag("--no-prompt", o.no_prompt, "generate chunk 0 too instead of starting from the ground-truth first chunk");
  app.add_option("--device", o.device, "auto, cpu, cuda, cuda:N");
  app.add_option("--threads", o.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--vae", o.lingbot.vae, "LingBot-World-Fast: the Wan VAE (default: beside the model folder)");
  CLI::Option* file = app.add_option("--text-context", o.lingbot.text_context,
                                     "LingBot-World-Fast: safetensors with `context` [L, 4096] (umT5's output; "
                                     "without it or --prompt: zero rows)");
  app.add_option("--prompt", o.lingbot.prompt,
                 "LingBot-World-Fast: the prompt, through the umT5 encoder and tokenizer beside the model folder "
                 "(models_t5_umt5-xxl-enc-bf16.pth, google/umt5-xxl/), once at the start, in --dtype")
      ->excludes(file);
  app.add_option("--video-size", o.lingbot_size, "LingBot-World-Fast: video and ground-truth size HxW (multiples of 16)");
  app.add_option("--cond-latents", o.lingbot.cond_latents,
                 "LingBot-World-Fast: latent frames of the image condition to encode (0: all; later ones reuse the last)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--dtype", o.lingbot_dtype, "LingBot-World-Fast: DiT precision, f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
}

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
  std::vector<double> chunk_cpu_ms;  // the process's CPU time per generated chunk (all threads)
  double max_step = 0;       // the largest ratio of a generated chunk's time to the one before it
  size_t max_step_chunk = 0;  // where it happened (index into chunk_ms)
  double max_step_cpu = 0;   // the same for CPU time, which other processes on the machine do not move
  size_t max_step_cpu_chunk = 0;
};

// The largest ratio of one time to the one before it, and where (0, 0 for fewer than two).
std::pair<double, size_t> largest_step(const std::vector<double>& t) {
  std::pair<double, size_t> best{0.0, 0};
  for (size_t i = 1; i < t.size(); ++i)
    if (t[i - 1] > 0 && t[i] / t[i - 1] > best.first) best = {t[i] / t[i - 1], i};
  return best;
}

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

// An episode's frames that every policy rolls out, and their ground truth.
struct EpisodeTruth {
  const wm::world::Episode* ep = nullptr;
  size_t index = 0;                           // in the suite
  int frames = 0;                             // whole chunks within --max-seconds
  std::vector<wm::Image> gt;                  // the ground-truth render of each frame
  std::vector<wm::world::RevisitPair> pairs;  // the revisit pairs inside those frames
};

EpisodeTruth ground_truth(const wm::world::Episode& ep, size_t index, const wm::world::RenderSpec& rs, int frames) {
  EpisodeTruth t;
  t.ep = &ep;
  t.index = index;
  t.frames = frames;
  const wm::world::Scene scene = wm::world::scene_of(ep);
  wm::world::Raycaster ray(scene, rs);
  for (int f = 0; f < frames; ++f) t.gt.push_back(ray.render(ep.poses[f]));
  for (auto& p : ep.revisits)
    if (p.revisit < frames) t.pairs.push_back(p);
  return t;
}

// What every rollout shares: the model (an adapter made per rollout: the tiny DiT, or
// LingBot-World-Fast from the episode's first ground-truth frame), the session's settings (the
// policy is set per rollout), the ground truth's render settings, the chunk's size in latent
// frames and the codec's temporal stride, whether chunk 0 is the ground truth (a prompt).
struct Rollouts {
  std::function<std::unique_ptr<wm::worldkv::ModelAdapter>(const EpisodeTruth&)> make_model;
  wm::worldkv::SessionConfig session;
  wm::world::RenderSpec render;
  int frames_per_chunk = 3, temporal_stride = 1;
  bool prompt = true;
  // Video frames a chunk makes after the first.
  int video_frames_per_chunk() const { return frames_per_chunk * temporal_stride; }
};

// The progress line over every policy's rollouts, updated chunk by chunk, and the clock of the
// whole run.
class BenchProgress {
 public:
  BenchProgress(int all_frames, size_t episodes) : all_frames_(all_frames), episodes_(episodes) {}

  // A chunk of `frames` frames of episode e was generated with `policy`.
  void chunk_done(int frames, size_t e, const std::string& policy, int64_t chunk) {
    done_frames_ += frames;
    if (chunk % 20 == 0 || done_frames_ == all_frames_) {
      const double el = seconds();
      line_.show(done_frames_ == all_frames_, "  episode %zu/%zu  %-14s chunk %lld  %5.1f%%  eta %.0f s", e + 1,
                 episodes_, policy.c_str(), static_cast<long long>(chunk), 100.0 * done_frames_ / all_frames_,
                 el / done_frames_ * (all_frames_ - done_frames_));
    }
  }
  void finish() { line_.finish(); }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int all_frames_;
  size_t episodes_;
  int done_frames_ = 0;
  wm::cli::ProgressLine line_;
};

wm::Image side_by_side(const std::vector<const wm::Image*>& ims, int scale) {
  const int w = ims[0]->width, h = ims[0]->height;
  wm::Image out(w * scale * static_cast<int>(ims.size()), h * scale);
  for (size_t k = 0; k < ims.size(); ++k) wm::media::upscale_into(*ims[k], scale, out, static_cast<int>(k) * w * scale, 0);
  return out;
}

// Revisit fidelity of a rollout: at the scored pairs, the generated revisit against the generated
// first visit and against the ground truth (means over the pairs); every generated frame
// against its ground truth (mean over the generated frames).
void score_fidelity(const wm::rollout::EpisodeRun& run, const EpisodeTruth& truth,
                    const std::vector<wm::world::RevisitPair>& scored, EpisodeScore& s) {
  for (auto& p : scored) {
    const wm::Image &a = run.frames[p.first], &b = run.frames[p.revisit];
    s.revisit_psnr += wm::media::capped_psnr(b, a) / scored.size();
    s.revisit_ssim += wm::media::ssim(b, a) / scored.size();
    s.gt_psnr += wm::media::capped_psnr(b, truth.gt[p.revisit]) / scored.size();
    s.gt_ssim += wm::media::ssim(b, truth.gt[p.revisit]) / scored.size();
  }
  const int n = truth.frames;
  for (int f = run.prompt_frames; f < n; ++f)
    s.gt_psnr_all += wm::media::capped_psnr(run.frames[f], truth.gt[f]) / std::max(1, n - run.prompt_frames);
}

// Writes at most dump_max of the scored pairs (all when they are that few, else every
// (count / dump_max)-th) as PNGs: first visit | revisit | ground truth, scaled 4x.
void dump_pairs(const wm::rollout::EpisodeRun& run, const EpisodeTruth& truth,
                const std::vector<wm::world::RevisitPair>& scored, const std::string& policy, int dump_max,
                wm::cli::OutputFolder& dumps) {
  int dumped = 0;
  for (size_t k = 0; k < scored.size(); ++k) {
    if (dumped >= dump_max) break;
    if (scored.size() > static_cast<size_t>(dump_max) && k % (scored.size() / dump_max) != 0) continue;
    const wm::world::RevisitPair& p = scored[k];
    char name[256];
    std::snprintf(name, sizeof name, "%s_ep%03zu_%05d_%05d.png", policy.c_str(), truth.index, p.first, p.revisit);
    wm::media::write_png(dumps.file(name),
                         side_by_side({&run.frames[p.first], &run.frames[p.revisit], &truth.gt[p.revisit]}, 4));
    ++dumped;
  }
}

// Speed of the generated chunks only (the prompt chunk is an encode and one pass), and the
// memory's sizes at the end of the rollout.
void score_speed(const wm::rollout::EpisodeRun& run, EpisodeScore& s) {
  double sum = 0, frames = 0;
  for (auto& c : run.chunks)
    if (!c.prompt) sum += c.ms, s.chunk_ms.push_back(c.ms), s.chunk_cpu_ms.push_back(c.cpu_ms), s.memory_ms += c.memory_ms;
  for (auto& c : run.chunks)
    if (!c.prompt) frames += static_cast<double>(c.poses.size());
  const int frames_per_chunk = run.chunks.empty() ? 0 : static_cast<int>(run.chunks.back().poses.size());
  if (!s.chunk_ms.empty()) s.memory_ms /= static_cast<double>(s.chunk_ms.size());
  // Speed at the end of the rollout: the median of the last 10 chunks (a shared machine's
  // hiccups move a mean of a few chunks by 20%).
  const size_t k = std::min<size_t>(10, s.chunk_ms.size());
  std::vector<double> tail(s.chunk_ms.end() - static_cast<std::ptrdiff_t>(k), s.chunk_ms.end());
  std::sort(tail.begin(), tail.end());
  const double last = k == 0 ? 0 : (k % 2 ? tail[k / 2] : 0.5 * (tail[k / 2 - 1] + tail[k / 2]));
  s.fps_last = k ? 1000.0 * frames_per_chunk / last : 0;
  s.fps_mean = s.chunk_ms.empty() ? 0 : 1000.0 * frames / sum;
  std::tie(s.max_step, s.max_step_chunk) = largest_step(s.chunk_ms);
  std::tie(s.max_step_cpu, s.max_step_cpu_chunk) = largest_step(s.chunk_cpu_ms);
  s.peak_window = run.peak_window_bytes;
  for (int t = 0; t < 3; ++t) s.bank[t] = run.chunks.back().bank_bytes[t];
}

// Rolls the model out along one episode with one policy and scores the rollout.
EpisodeScore roll_out(const Options& o, Rollouts& r, wm::worldkv::Policy policy, const std::string& policy_name,
                      const EpisodeTruth& truth, wm::cli::OutputFolder* dumps, BenchProgress& progress) {
  r.session.memory.policy = policy;
  wm::worldkv::WorldSession session(r.make_model(truth), r.session);
  auto run = wm::rollout::run_episode(session, *truth.ep, o.noise_seed, truth.frames, [&](const auto& c, const auto&) {
    progress.chunk_done(static_cast<int>(c.poses.size()), truth.index, policy_name, c.index);
  }, r.prompt);
  // Pairs whose first visit lies in the prompt would compare with the ground truth itself.
  std::vector<wm::world::RevisitPair> scored;
  for (auto& p : truth.pairs)
    if (p.first >= run.prompt_frames) scored.push_back(p);
  EpisodeScore s;
  s.name = truth.ep->name;
  s.frames = truth.frames;
  s.pairs = static_cast<int>(scored.size());
  score_fidelity(run, truth, scored, s);
  if (dumps) dump_pairs(run, truth, scored, policy_name, o.dump_max, *dumps);
  score_speed(run, s);
  return s;
}

// Every policy on every episode of the suite, episode by episode.
std::vector<PolicyScore> score_policies(const Options& o, const wm::world::Suite& suite,
                                        const std::vector<wm::worldkv::Policy>& policies, Rollouts& r,
                                        wm::cli::OutputFolder* dumps, BenchProgress& progress) {
  std::vector<PolicyScore> scores;
  for (auto pol : policies) scores.push_back({wm::worldkv::policy_name(pol), {}});
  for (size_t e = 0; e < suite.episodes.size(); ++e) {
    const auto& ep = suite.episodes[e];
    const int n = wm::rollout::covered_frames(ep, r.frames_per_chunk, o.max_seconds * suite.fps, r.temporal_stride);
    const EpisodeTruth truth = ground_truth(ep, e, r.render, n);
    for (size_t pi = 0; pi < policies.size(); ++pi)
      scores[pi].eps.push_back(roll_out(o, r, policies[pi], scores[pi].policy, truth, dumps, progress));
  }
  return scores;
}

// A policy's figures over the suite: means over the episodes (the revisit figures over those
// with a scored pair), the largest window and bank sizes.
struct PolicySummary {
  double revisit_psnr, revisit_ssim, gt_psnr, gt_ssim, gt_psnr_all, fps_last, fps_mean, memory_ms;
  size_t peak_window = 0, bank[3] = {0, 0, 0};
};

PolicySummary summarize(const PolicyScore& ps) {
  PolicySummary m;
  for (auto& e : ps.eps) {
    m.peak_window = std::max(m.peak_window, e.peak_window);
    for (int t = 0; t < 3; ++t) m.bank[t] = std::max(m.bank[t], e.bank[t]);
  }
  m.revisit_psnr = ps.mean(&EpisodeScore::revisit_psnr, true);
  m.revisit_ssim = ps.mean(&EpisodeScore::revisit_ssim, true);
  m.gt_psnr = ps.mean(&EpisodeScore::gt_psnr, true);
  m.gt_ssim = ps.mean(&EpisodeScore::gt_ssim, true);
  m.gt_psnr_all = ps.mean(&EpisodeScore::gt_psnr_all);
  m.fps_last = ps.mean(&EpisodeScore::fps_last);
  m.fps_mean = ps.mean(&EpisodeScore::fps_mean);
  m.memory_ms = ps.mean(&EpisodeScore::memory_ms);
  return m;
}

void print_table_header(size_t episodes, int total_frames) {
  std::printf("\nRevisit fidelity on %zu episodes (%d frames each policy; PSNR capped at %.0f dB)\n", episodes,
              total_frames, wm::media::kPsnrCap);
  std::printf("%-15s %9s %8s | %9s %8s %9s | %8s %8s | %10s %10s %9s %9s\n", "policy", "rev PSNR", "rev SSIM",
              "GT PSNR", "GT SSIM", "GT all", "FPS last", "FPS mean", "window KiB", "dev KiB", "host KiB",
              "disk KiB");
}

void print_table_row(const std::string& policy, const PolicySummary& m) {
  std::printf("%-15s %9.2f %8.4f | %9.2f %8.4f %9.2f | %8.1f %8.1f | %10zu %10zu %9zu %9zu\n", policy.c_str(),
              m.revisit_psnr, m.revisit_ssim, m.gt_psnr, m.gt_ssim, m.gt_psnr_all, m.fps_last, m.fps_mean,
              m.peak_window / 1024, m.bank[0] / 1024, m.bank[1] / 1024, m.bank[2] / 1024);
}

const char* const kCsvHeader =
    "policy,revisit_psnr,revisit_ssim,gt_psnr,gt_ssim,gt_psnr_all,fps_last,fps_mean,memory_ms,peak_window_bytes,"
    "bank_device_bytes,bank_host_bytes,bank_disk_bytes\n";

void write_csv_row(std::ostream& csv, const std::string& policy, const PolicySummary& m) {
  csv << policy << "," << m.revisit_psnr << "," << m.revisit_ssim << "," << m.gt_psnr << "," << m.gt_ssim << ","
      << m.gt_psnr_all << "," << m.fps_last << "," << m.fps_mean << "," << m.memory_ms << "," << m.peak_window << ","
      << m.bank[0] << "," << m.bank[1] << "," << m.bank[2] << "\n";
}

nlohmann::json policy_json(const PolicyScore& ps, const PolicySummary& m) {
  nlohmann::json pj = {{"policy", ps.policy},        {"revisit_psnr", m.revisit_psnr}, {"revisit_ssim", m.revisit_ssim},
                       {"gt_psnr", m.gt_psnr},       {"gt_ssim", m.gt_ssim},           {"gt_psnr_all", m.gt_psnr_all},
                       {"fps_last", m.fps_last},     {"fps_mean", m.fps_mean},         {"memory_ms", m.memory_ms},
                       {"peak_window_bytes", m.peak_window}, {"bank_bytes", {m.bank[0], m.bank[1], m.bank[2]}}};
  for (auto& e : ps.eps)
    pj["episodes"].push_back({{"name", e.name}, {"frames", e.frames}, {"pairs", e.pairs},
                              {"revisit_psnr", e.revisit_psnr}, {"revisit_ssim", e.revisit_ssim},
                              {"gt_psnr", e.gt_psnr}, {"gt_ssim", e.gt_ssim}, {"gt_psnr_all", e.gt_psnr_all},
                              {"fps_last", e.fps_last}, {"fps_mean", e.fps_mean}, {"memory_ms", e.memory_ms},
                              {"chunk_ms", e.chunk_ms}, {"chunk_ms_max_step", e.max_step},
                              {"chunk_ms_max_step_at", e.max_step_chunk}, {"chunk_cpu_ms", e.chunk_cpu_ms},
                              {"chunk_cpu_ms_max_step", e.max_step_cpu},
                              {"chunk_cpu_ms_max_step_at", e.max_step_cpu_chunk}});
  return pj;
}

// Chunk times per policy: the first and last generated chunk, the largest step from one chunk
// to the next (a baseline whose time per chunk jumps is no baseline), in wall time and in the
// process's CPU time (on a shared machine a wall-time step can be another process's doing; a
// CPU-time step is the rollout's own), and the speed at the end against full_kv's when it ran.
void print_chunk_times(const std::vector<PolicyScore>& scores) {
  const PolicyScore* full = nullptr;
  for (auto& ps : scores)
    if (ps.policy == "full_kv") full = &ps;
  std::printf("\nChunk times (ms, generated chunks; largest step: a chunk's time over the one before it;\n"
              "CPU: the process's CPU time, all threads)\n");
  std::printf("%-15s %9s %9s %14s %9s %9s %14s %16s\n", "policy", "first", "last", "largest step", "CPU first",
              "CPU last", "CPU step", "FPS last / full");
  auto step_text = [](double step, size_t at) {
    char b[32] = "-";
    if (step > 0) std::snprintf(b, sizeof b, "x%.2f @%zu", step, at);
    return std::string(b);
  };
  for (auto& ps : scores) {
    const EpisodeScore *worst = nullptr, *worst_cpu = nullptr;
    for (auto& e : ps.eps) {
      if (e.chunk_ms.empty()) continue;
      if (!worst || e.max_step > worst->max_step) worst = &e;
      if (!worst_cpu || e.max_step_cpu > worst_cpu->max_step_cpu) worst_cpu = &e;
    }
    if (!worst) continue;
    char ratio[32] = "-";
    const double ff = full ? full->mean(&EpisodeScore::fps_last) : 0;
    if (ff > 0) std::snprintf(ratio, sizeof ratio, "x%.2f", ps.mean(&EpisodeScore::fps_last) / ff);
    std::printf("%-15s %9.0f %9.0f %14s %9.0f %9.0f %14s %16s\n", ps.policy.c_str(), worst->chunk_ms.front(),
                worst->chunk_ms.back(), step_text(worst->max_step, worst->max_step_chunk).c_str(),
                worst_cpu->chunk_cpu_ms.front(), worst_cpu->chunk_cpu_ms.back(),
                step_text(worst_cpu->max_step_cpu, worst_cpu->max_step_cpu_chunk).c_str(), ratio);
  }
}

// FPS against rollout length: per chunk index, the mean over the episodes that reach it,
// smoothed over 5 chunks.
wm::rollout::Series fps_against_length(const PolicyScore& ps, int frames_per_chunk, int fps) {
  size_t longest = 0;
  for (auto& e : ps.eps) longest = std::max(longest, e.chunk_ms.size());
  wm::rollout::Series s{ps.policy, {}};
  for (size_t c = 0; c < longest; ++c) {
    double sum = 0;
    int cnt = 0;
    for (auto& e : ps.eps)
      for (size_t d = (c >= 2 ? c - 2 : 0); d <= c + 2 && d < e.chunk_ms.size(); ++d) sum += e.chunk_ms[d], ++cnt;
    if (cnt) s.points.push_back({(c + 2) * frames_per_chunk / static_cast<double>(fps), 1000.0 * frames_per_chunk / (sum / cnt)});
  }
  return s;
}

// The table on stdout; results.json, results.csv and the two plots into `results`.
void write_results(const Options& o, const wm::world::Suite& suite, int total_frames, int frames_per_chunk,
                   const std::vector<PolicyScore>& scores, wm::cli::OutputFolder& results) {
  print_table_header(suite.episodes.size(), total_frames);
  nlohmann::json J;
  J["suite"] = o.suite_spec;
  J["suite_seed"] = suite.gen_seed;
  J["split"] = wm::world::suite_split(suite);
  J["model"] = o.model_path;
  J["episodes"] = suite.episodes.size();
  J["max_seconds"] = o.max_seconds;
  J.update(o.ro.to_json());
  std::ofstream csv(results.file("results.csv"));
  csv << kCsvHeader;
  std::vector<std::pair<std::string, double>> bars;
  std::vector<wm::rollout::Series> fps_series;
  for (auto& ps : scores) {
    const PolicySummary m = summarize(ps);
    print_table_row(ps.policy, m);
    if (std::isnan(m.revisit_psnr) && &ps == &scores.back())
      std::printf("(no revisit pair lies inside the frames rolled out: raise --max-seconds)\n");
    write_csv_row(csv, ps.policy, m);
    J["policies"].push_back(policy_json(ps, m));
    bars.push_back({ps.policy, m.revisit_psnr});
    fps_series.push_back(fps_against_length(ps, frames_per_chunk, suite.fps));
  }
  print_chunk_times(scores);
  csv.close();
  if (!csv) throw wm::Error("writing " + o.out_dir + "/results.csv failed");
  std::ofstream json(results.file("results.json"));
  json << J.dump(2) << "\n";
  json.close();
  if (!json) throw wm::Error("writing " + o.out_dir + "/results.json failed");
  wm::rollout::bar_chart(results.file("revisit_psnr.png"),
                         "Revisit PSNR: frame at the revisit vs frame at the first visit", "PSNR (dB)", bars);
  wm::rollout::line_chart(results.file("fps_vs_length.png"), "Generation speed against rollout length",
                          "rollout length (s of video)", "generated frames / s", fps_series);
}

// The model of every rollout: the tiny DiT of a weights file, or LingBot-World-Fast of a folder
// (wm_render's test: its files), started from each episode's first ground-truth frame.
Rollouts make_rollouts(const Options& o, at::Device dev) {
  Rollouts r;
  if (!fs::is_directory(o.model_path)) {
    if (o.lingbot.prompt || !o.lingbot.text_context.empty())
      throw wm::Error("--prompt and --text-context are for a LingBot-World-Fast model folder");
    wm::dit::CausalDit model = wm::worldkv::load_world_model(o.model_path, dev);
    const wm::dit::SamplerConfig sampler = o.ro.sampler();
    r.make_model = [model, sampler, dev](const EpisodeTruth&) {
      return std::make_unique<wm::worldkv::TinyDitAdapter>(model, sampler, dev);
    };
    r.render = wm::rollout::render_spec_of(model->config());
    r.frames_per_chunk = model->config().frames_per_chunk;
    r.prompt = !o.no_prompt;
    return r;
  }
  if (!wm::rollout::is_lingbot_folder(o.model_path))
    throw wm::Error("--model " + o.model_path + ": a folder, but not a LingBot-World-Fast one (the benchmark runs the "
                    "tiny model's file or a LingBot-World-Fast folder)");
  wm::rollout::LingbotBenchModel m = o.lingbot;
  m.dir = o.model_path;
  const size_t x = o.lingbot_size.find('x');
  if (x == std::string::npos) throw wm::Error("--video-size must be HxW, got '" + o.lingbot_size + "'");
  m.height = std::stoi(o.lingbot_size.substr(0, x));
  m.width = std::stoi(o.lingbot_size.substr(x + 1));
  m.dtype = o.lingbot_dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  auto lb = std::make_shared<wm::rollout::LingbotRollouts>(m, dev);
  r.make_model = [lb](const EpisodeTruth& t) { return lb->make(*t.ep, t.frames, t.gt.at(0)); };
  r.render = lb->render_spec();
  r.frames_per_chunk = lb->frames_per_chunk();
  r.temporal_stride = 4;
  r.prompt = false;  // its first image is the ground truth's frame 0
  return r;
}

// The whole run; throws wm::Error (or another std::exception) on failure, leaving no output.
void run_bench(const Options& o) {
  wm::init_threads(o.threads);
  wm::keep_freed_memory();  // K/V chunks come and go every chunk: no mmap/munmap each time
  const at::Device dev = wm::parse_device(o.device);
  // Outputs are whole or absent: written into temporary folders, moved in at the end.
  wm::cli::OutputFolder results(o.out_dir);
  std::unique_ptr<wm::cli::OutputFolder> dumps;
  if (!o.dump_dir.empty()) dumps = std::make_unique<wm::cli::OutputFolder>(o.dump_dir);
  if (!fs::exists(o.model_path)) throw wm::Error("no model at '" + o.model_path + "' (train one with wm_train, or pass --model)");
  wm::world::Suite suite = wm::world::load_or_generate_suite(o.suite_spec);
  if (o.episodes > 0 && o.episodes < static_cast<int>(suite.episodes.size())) suite.episodes.resize(o.episodes);
  std::vector<wm::worldkv::Policy> pols;
  for (auto& p : o.policies) pols.push_back(wm::worldkv::parse_policy(p));

  o.ro.validate();
  const std::shared_ptr<wm::RemoteStore> remote = o.ro.open_bank_store(o.model_path);
  Rollouts r = make_rollouts(o, dev);
  o.ro.apply(r.session);
  o.ro.apply_bank(r.session, dev, remote);

  int total_frames = 0;
  for (auto& ep : suite.episodes)
    total_frames += wm::rollout::covered_frames(ep, r.frames_per_chunk, o.max_seconds * suite.fps, r.temporal_stride);
  std::fprintf(stderr, "wm_revisit_bench: %zu episodes of suite seed %llu (%s split), %d frames each policy, %zu "
               "policies, %s\n",
               suite.episodes.size(), static_cast<unsigned long long>(suite.gen_seed), wm::world::suite_split(suite),
               total_frames, pols.size(), wm::describe_device(dev).c_str());

  BenchProgress progress(total_frames * static_cast<int>(pols.size()), suite.episodes.size());
  const std::vector<PolicyScore> scores = score_policies(o, suite, pols, r, dumps.get(), progress);
  progress.finish();
  if (remote) {
    const wm::RemoteStats st = remote->stats();
    std::fprintf(stderr,
                 "wm_revisit_bench: bank beyond host memory in %s: %lld values written, %lld read, %lld writes failed "
                 "(kept in host memory), %lld damaged or foreign, %lld outages\n",
                 remote->endpoint().url.c_str(), static_cast<long long>(st.puts), static_cast<long long>(st.hits),
                 static_cast<long long>(st.put_failed), static_cast<long long>(st.corrupt + st.foreign),
                 static_cast<long long>(st.outages));
  }

  write_results(o, suite, total_frames, r.video_frames_per_chunk(), scores, results);
  if (dumps) dumps->commit();
  results.commit();
  std::printf("\nwrote %s/results.json, results.csv, revisit_psnr.png, fps_vs_length.png%s; %.0f s\n", o.out_dir.c_str(),
              o.dump_dir.empty() ? "" : (", pairs in " + o.dump_dir).c_str(), progress.seconds());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_revisit_bench: revisit fidelity, speed and memory of the KV-memory policies"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  try {
    run_bench(o);
  } catch (const std::exception& e) {
    std::cerr << "wm_revisit_bench: error: " << wm::cli::error_text(e) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_revisit_bench
