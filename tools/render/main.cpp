// wm_render: rolls the world model out along a trajectory and writes the video to MP4, optionally
// side by side with the ground truth, with a strip that shows which chunks the memory holds.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <iostream>

#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/output_folder.h"
#include "tools/cli/progress.h"
#include "tools/cli/validators.h"
#include "tools/media/mp4_writer.h"
#include "tools/media/png.h"
#include "tools/media/upscale.h"
#include "tools/rollout/cli_options.h"
#include "tools/rollout/episode_runner.h"
#include "tools/rollout/lingbot_start.h"
#include "tools/render/lingbot_render.h"
#include "tools/render/mg2_render.h"
#include "tools/rollout/world_adapter.h"
#include "tools/world/raycaster.h"
#include "tools/world/suite.h"
#include "worldkv/tiny_dit_adapter.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_render {

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

// The command line: the Matrix-Game-2.0 path's own options, then this program's.
struct Options {
  wm::render::Mg2RenderOptions mg2;
  wm::render::LingbotRenderOptions lingbot;
  std::string model_path = "assets/models/tiny/model.safetensors";
  std::string suite = "assets/suites/revisit60.json";
  int index = 0;
  int64_t seed = -1;
  std::string policy = "worldkv";
  wm::rollout::RolloutOptions ro;
  std::string out = "rollout.mp4";
  std::string png_dir;
  std::string tile;
  int tile_every = 60, tile_columns = 4;
  int upscale = 6, fps = 16, max_seconds = 0, threads = 0;
  double context_t = 0;
  bool side_by_side = false, strip = false, no_prompt = false;
  uint64_t noise_seed = 0;
  std::string device = "auto";
};

const char* const kDescription =
    "wm_render: roll the world model out along a trajectory and write an MP4. With --model naming a "
    "Matrix-Game-2.0 folder (config.json + safetensors, as the hub has it), the MG2 path: --image or --latents, "
    "--actions or --trajectory, --policy native or a memory policy; with a LingBot-World-Fast folder (config.json, "
    "diffusion_pytorch_model shards + index), its path: --image, --prompt or --text-context, --poses or "
    "--trajectory";

// Registers every option (in --help order).
void add_options(CLI::App& app, Options& o) {
  o.mg2.add_to(app);
  o.lingbot.add_to(app);
  app.add_option("--model", o.model_path, "model weights (safetensors with its config)");
  auto* suite_opt = app.add_option("--suite", o.suite, "suite file, or gen:SEED:COUNT to generate one");
  auto* index_opt = app.add_option("--index", o.index, "episode of the suite")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "instead of a suite: generate one episode from this seed")
      ->check(CLI::NonNegativeNumber)->excludes(suite_opt)->excludes(index_opt);
  app.add_option("--policy", o.policy,
                 "full_kv, sliding_window, sink_recent, worldkv, worldkv_c, worldkv_attn (Matrix-Game-2.0 also: "
                 "native, upstream's own window, its default)");
  o.ro.add_to(app);
  app.add_option("-o,--out", o.out,
                 "output MP4 (written whole or not at all: a failed run leaves nothing under this name)");
  app.add_option("--png-dir", o.png_dir, "also write every output frame as PNG here (moved in when the run succeeds)");
  app.add_option("--tile", o.tile,
                 "also write a PNG contact sheet of every --tile-every'th output frame (frame 0 first), "
                 "--tile-columns to a row, in time order");
  app.add_option("--tile-every", o.tile_every, "frames between the tile's cells")->check(CLI::Range(1, 1 << 20));
  app.add_option("--tile-columns", o.tile_columns, "cells per row of the tile")->check(CLI::Range(1, 64));
  app.add_option("--upscale", o.upscale, "integer nearest-neighbour upscale")->check(CLI::Range(1, 32));
  app.add_option("--fps", o.fps, "frame rate of the MP4")->check(CLI::Range(1, 240));
  app.add_option("--max-seconds", o.max_seconds, "render only the first N seconds (0: all)")
      ->check(CLI::Range(0, 86400));
  app.add_option("--context-t", o.context_t, "noise level of the refill pass (0: clean)")
      ->check(wm::cli::FiniteRange(0.0, 0.5));
  app.add_option("--noise-seed", o.noise_seed, "seed of the sampler's noise");
  app.add_flag("--side-by-side", o.side_by_side, "ground truth to the right of the model's frames");
  app.add_flag("--strip", o.strip, "a strip under the frames: chunks in the window (green), retrieved (orange)");
  app.add_flag("--no-prompt", o.no_prompt,
               "generate chunk 0 too instead of starting from the ground-truth first chunk");
  app.add_option("--device", o.device, "auto, cpu, cuda, cuda:N");
  app.add_option("--threads", o.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
}

// A model folder, or any of the MG2-only inputs, selects the Matrix-Game-2.0 path (or LingBot-World-Fast's,
// by the folder's files).
bool is_mg2_run(const Options& o) {
  return std::filesystem::is_directory(o.model_path) || !o.mg2.mode.empty() || !o.mg2.image.empty() ||
         !o.mg2.latents_in.empty();
}

// The Matrix-Game-2.0 and LingBot-World-Fast paths: the shared options passed on (--out, --policy
// and --fps only where given, so that each path's own defaults hold otherwise).
int run_mg2(const Options& o, const CLI::App& app) {
  const bool lingbot = wm::rollout::is_lingbot_folder(o.model_path);
  const char* name = lingbot ? "LingBot-World-Fast's" : "Matrix-Game-2.0's";
  if (app.count("--bank-host-mib") || app.count("--kv-store") || app.count("--spill-dir"))
    throw wm::Error(wm::str_cat("--bank-host-mib, --spill-dir and --kv-store are for the embedded model's path, not ",
                                name));
  if (app.count("--tile") || app.count("--png-dir"))
    throw wm::Error(wm::str_cat("--tile and --png-dir are for the embedded model's path, not ", name));
  if (!lingbot && (app.count("--text-context") || app.count("--prompt") || app.count("--poses") || app.count("--size") ||
                   app.count("--stream-blocks")))
    throw wm::Error("--prompt, --text-context, --poses, --size and --stream-blocks are for a LingBot-World-Fast model folder");
  wm::render::Mg2RenderOptions mg2 = o.mg2;
  mg2.model = o.model_path;
  mg2.out = app.count("--out") ? o.out : "";
  if (app.count("--policy")) mg2.policy = o.policy;
  mg2.placement = o.ro.placement;
  mg2.seed = o.noise_seed;
  mg2.device = o.device;
  if (app.count("--fps")) mg2.fps = o.fps;
  if (!lingbot) return wm::render::run_mg2_render(mg2);
  wm::render::LingbotRenderOptions lb = o.lingbot;
  if (app.count("--fps")) lb.fps = o.fps;
  return wm::render::run_lingbot_render(mg2, lb);
}

// The episode to roll out and its trajectory's frame rate (the suite's, or the generator's default).
struct ChosenEpisode {
  wm::world::Episode ep;
  int fps = 0;
};

ChosenEpisode choose_episode(const Options& o) {
  ChosenEpisode chosen;
  if (o.seed >= 0) {
    const wm::world::TrajectoryOptions generated;
    chosen.ep = wm::world::generate_episode(static_cast<uint64_t>(o.seed), generated);
    chosen.fps = generated.fps;
  } else {
    wm::world::Suite s = wm::world::load_or_generate_suite(o.suite);
    if (o.index < 0 || o.index >= static_cast<int>(s.episodes.size()))
      throw wm::Error(
          wm::str_cat("--index ", o.index, " out of range: the suite has ", s.episodes.size(), " episodes"));
    chosen.ep = s.episodes[o.index];
    chosen.fps = s.fps;
  }
  return chosen;
}

wm::worldkv::SessionConfig session_config(const Options& o) {
  wm::worldkv::SessionConfig sc;
  sc.memory.policy = wm::worldkv::parse_policy(o.policy);
  sc.memory.kv_files_dir = o.mg2.kv_files;
  o.ro.apply(sc);
  sc.seed = o.noise_seed;
  return sc;
}

wm::dit::SamplerConfig sampler_config(const Options& o) {
  wm::dit::SamplerConfig s = o.ro.sampler();
  s.context_t = o.context_t;
  return s;
}

// The output frame: the model's frame (fw x fh) at the left, the ground truth to its right with
// --side-by-side, the strip below with --strip; W and H rounded up to even for the encoder.
struct Layout {
  int fw = 0, fh = 0, W = 0, H = 0;
};

Layout layout_of(const wm::world::RenderSpec& rs, const Options& o) {
  Layout l;
  l.fw = rs.width * o.upscale, l.fh = rs.height * o.upscale;
  const int strip_h = o.strip ? std::max(12, 3 * o.upscale) : 0;
  l.W = l.fw * (o.side_by_side ? 2 : 1), l.H = l.fh + strip_h;
  l.W += l.W % 2;
  l.H += l.H % 2;
  return l;
}

// The MP4 and, with --png-dir, the PNG sequence (staged, moved in by commit()).
struct Outputs {
  wm::media::Mp4Writer writer;
  std::unique_ptr<wm::cli::OutputFolder> png_folder;
  std::unique_ptr<wm::media::PngSequenceWriter> pngs;
  std::unique_ptr<wm::cli::OutputPath> tile_file;
  std::vector<wm::Image> cells;  // the tile's frames
  int tile_every = 0, tile_columns = 1, written = 0;

  Outputs(const Options& o, const Layout& l) : writer(o.out, l.W, l.H, o.fps, 1) {
    if (!o.png_dir.empty()) {
      png_folder = std::make_unique<wm::cli::OutputFolder>(o.png_dir);
      pngs = std::make_unique<wm::media::PngSequenceWriter>(png_folder->staging());
    }
    if (!o.tile.empty()) {
      tile_file = std::make_unique<wm::cli::OutputPath>(o.tile);
      // Found out now, not after the rollout: can the folder take the file?
      if (!std::ofstream(tile_file->tmp(), std::ios::binary))
        throw wm::Error(wm::str_cat("--tile: cannot write ", o.tile, ": ", std::strerror(errno)));
      tile_every = o.tile_every;
      tile_columns = o.tile_columns;
    }
  }
  void write(const wm::Image& canvas) {
    writer.write(canvas);
    if (pngs) pngs->write(canvas);
    if (tile_file && written % tile_every == 0) cells.push_back(canvas);
    ++written;
  }
  // The contact sheet: cells in rows of tile_columns, 2 pixels of black between them.
  void write_tile() {
    const int gap = 2, cw = cells[0].width, ch = cells[0].height;
    const int cols = std::min<int>(tile_columns, static_cast<int>(cells.size()));
    const int rows = (static_cast<int>(cells.size()) + cols - 1) / cols;
    wm::Image sheet(cols * cw + (cols - 1) * gap, rows * ch + (rows - 1) * gap);
    for (size_t i = 0; i < cells.size(); ++i) {
      const int x0 = static_cast<int>(i % cols) * (cw + gap), y0 = static_cast<int>(i / cols) * (ch + gap);
      for (int y = 0; y < ch; ++y)
        std::copy_n(cells[i].rgb.begin() + static_cast<size_t>(y) * cw * 3, cw * 3,
                    sheet.rgb.begin() + (static_cast<size_t>(y0 + y) * sheet.width + x0) * 3);
    }
    wm::media::write_png(tile_file->tmp(), sheet);
  }
  // Every output complete before any takes its final name.
  void commit() {
    writer.finish();
    if (tile_file && !cells.empty()) write_tile();
    if (png_folder) png_folder->commit();
    if (tile_file && !cells.empty()) tile_file->commit();
    writer.close();
  }
};

// The ids of the chunks in the memory's window, all regions together.
std::vector<std::string> window_chunk_ids(const wm::worldkv::WorldMemory& mem) {
  std::vector<std::string> in_window;
  for (auto r : mem.window().layout().region_names())
    for (auto& id : mem.region_ids(r)) in_window.push_back(id);
  return in_window;
}

// One cell per chunk of the whole rollout: in the window green, retrieved orange, the current chunk
// white, past chunks grey.
void draw_strip(wm::Image& canvas, const Layout& l, const wm::worldkv::ChunkOutput& c, int n_chunks,
                const std::vector<std::string>& in_window) {
  const int W = l.W;
  for (int k = 0; k <= c.index; ++k) {
    const int x0 = static_cast<int>(static_cast<int64_t>(k) * W / n_chunks),
              x1 = std::max(x0 + 1, static_cast<int>(static_cast<int64_t>(k + 1) * W / n_chunks));
    const std::string id = wm::worldkv::WorldMemory::chunk_id(k);
    uint8_t r = 90, g = 90, b = 90;
    if (std::find(in_window.begin(), in_window.end(), id) != in_window.end()) r = 40, g = 170, b = 60;
    if (std::find(c.retrieved.begin(), c.retrieved.end(), id) != c.retrieved.end()) r = 250, g = 150, b = 20;
    if (k == c.index) r = g = b = 255;
    fill(canvas, x0, l.fh + 2, x1, l.H, r, g, b);
  }
}

void show_progress(wm::cli::ProgressLine& progress, const wm::worldkv::ChunkOutput& c, int n_chunks,
                   const wm::worldkv::WorldMemory& mem) {
  progress.show(c.index + 1 == n_chunks, "  chunk %lld/%d  %.0f ms  window %zu KiB  bank %zu KiB",
                static_cast<long long>(c.index + 1), n_chunks, c.ms, mem.window_bytes() / 1024,
                (mem.bank().bytes(wm::Tier::Device) + mem.bank().bytes(wm::Tier::Host) +
                 mem.bank().bytes(wm::Tier::Disk) + mem.bank().bytes(wm::Tier::Remote)) / 1024);
}

// The generated chunks' wall times (the prompt's left out) and the memory's share of them.
struct ChunkTimes {
  std::vector<double> ms;
  double memory_ms = 0;
};

void print_summary(const Options& o, const Layout& l, int frames_written, int F, const ChunkTimes& t, double wall) {
  const std::vector<double>& ms = t.ms;
  double sum = 0;
  for (double m : ms) sum += m;
  std::fprintf(stderr,
               "wm_render: wrote %s (%dx%d, %d frames at %d fps)\n"
               "  chunk ms: mean %.1f (memory %.2f), p50 %.1f, p90 %.1f, last %.1f; "
               "generated %.1f frames/s; wall %.1f s\n",
               o.out.c_str(), l.W, l.H, frames_written, o.fps, sum / ms.size(), t.memory_ms / ms.size(),
               percentile(ms, 0.5), percentile(ms, 0.9), ms.empty() ? 0.0 : ms.back(), 1000.0 * F * ms.size() / sum,
               wall);
}

// The world-model path: the episode rolled out chunk by chunk, every frame composed and written.
void render_episode(const Options& o) {
  wm::keep_freed_memory();  // K/V chunks come and go every chunk: no mmap/munmap each time
  const at::Device dev = wm::parse_device(o.device);
  if (!std::filesystem::exists(o.model_path))
    throw wm::Error("no model at '" + o.model_path + "' (train one with wm_train, or pass --model)");
  const ChosenEpisode chosen = choose_episode(o);
  const wm::world::Episode& ep = chosen.ep;
  const wm::world::Scene scene = wm::world::scene_of(ep);

  o.ro.validate();
  const std::shared_ptr<wm::RemoteStore> remote = o.ro.open_bank_store(o.model_path);
  wm::worldkv::SessionConfig sc = session_config(o);
  o.ro.apply_bank(sc, dev, remote);
  wm::worldkv::WorldSession session(std::make_unique<wm::worldkv::TinyDitAdapter>(
                                        wm::worldkv::load_world_model(o.model_path, dev), sampler_config(o), dev),
                                    sc);
  const int F = session.frames_per_chunk();
  const int n = wm::rollout::covered_frames(ep, F, o.max_seconds * chosen.fps);
  const int n_chunks = n / F;

  const wm::world::RenderSpec rs = wm::rollout::render_spec_of(session.info());
  wm::world::Raycaster ray(scene, rs);
  const Layout l = layout_of(rs, o);
  Outputs outputs(o, l);
  std::fprintf(stderr, "wm_render: episode '%s', %d frames (%d chunks), policy %s, %s\n", ep.name.c_str(), n,
               n_chunks, o.policy.c_str(), wm::describe_device(dev).c_str());

  ChunkTimes times;
  wm::cli::ProgressLine progress;
  auto on_chunk = [&](const wm::worldkv::ChunkOutput& c, const wm::rollout::EpisodeRun&) {
    if (!c.prompt) times.ms.push_back(c.ms), times.memory_ms += c.memory_ms;
    const auto& mem = *session.memory();
    const std::vector<std::string> in_window = window_chunk_ids(mem);
    for (int f = 0; f < F; ++f) {
      const int frame = static_cast<int>(c.index) * F + f;
      wm::Image canvas(l.W, l.H);
      wm::media::upscale_into(c.frames[f], o.upscale, canvas, 0, 0);
      if (o.side_by_side) wm::media::upscale_into(ray.render(ep.poses[frame]), o.upscale, canvas, l.fw, 0);
      if (o.strip) draw_strip(canvas, l, c, n_chunks, in_window);
      outputs.write(canvas);
    }
    if (c.index % 10 == 0 || c.index + 1 == n_chunks) show_progress(progress, c, n_chunks, mem);
  };
  const auto t0 = std::chrono::steady_clock::now();
  wm::rollout::run_episode(session, ep, o.noise_seed, n, on_chunk, !o.no_prompt);
  outputs.commit();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.finish();
  print_summary(o, l, outputs.writer.frames_written(), F, times, wall);
  if (remote) {
    const wm::RemoteStats s = remote->stats();
    const auto& bank = session.memory()->bank();
    std::fprintf(stderr,
                 "  bank: %zu chunks in host memory (%zu KiB), %zu in %s (%zu KiB); %lld values written, %lld read, "
                 "%lld writes failed (kept in host memory), %lld damaged or foreign, %lld outages; %lld retrievals "
                 "skipped (chunk lost)\n",
                 bank.count(wm::Tier::Host), bank.bytes(wm::Tier::Host) / 1024, bank.count(wm::Tier::Remote),
                 remote->endpoint().url.c_str(), bank.bytes(wm::Tier::Remote) / 1024, static_cast<long long>(s.puts),
                 static_cast<long long>(s.hits), static_cast<long long>(s.put_failed),
                 static_cast<long long>(s.corrupt + s.foreign), static_cast<long long>(s.outages),
                 static_cast<long long>(session.memory()->lost_fetches()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kDescription};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  try {
    wm::init_threads(o.threads);
    if (is_mg2_run(o)) return run_mg2(o, app);
    if (app.count("--text-context") || app.count("--prompt") || app.count("--poses") || app.count("--size"))
      throw wm::Error("--prompt, --text-context, --poses and --size are for a LingBot-World-Fast model folder");
    render_episode(o);
  } catch (const std::exception& e) {
    std::cerr << "wm_render: error: " << wm::cli::error_text(e) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_render
