// wm_bench_core: figures of the shared KV-memory core.
//  1. Block save and restore through the bank (window -> host tier / disk tier -> window)
//     against a plain memcpy of the same bytes, timed interleaved in one run, as a ratio.
//  2. Attention over windows of 1k..64k keys: tokens per second.
//  3. worldkv_c's compression of one chunk as it enters the bank, by merge mode (drop, votes,
//     merge), timed interleaved in one run.
// Or (--window-gib) a window larger than memory kept in files: fill and read rates.
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/attention.h"
#include "runtime/block_store.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/mapped_storage.h"
#include "runtime/window.h"
#include "tools/cli/cleanup.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/proc_status.h"
#include "worldkv/compression.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_bench_core {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Shape {
  std::string name;
  int layers, kv_heads, head_dim;
  at::ScalarType dtype;
};

wm::KvSpec spec_of(const Shape& s) {
  wm::KvSpec k;
  k.n_layers = s.layers;
  k.n_kv_heads = s.kv_heads;
  k.head_dim = s.head_dim;
  k.dtype = s.dtype;
  k.rope = wm::RopeSpec::text1d(s.head_dim);
  return k;
}

struct SaveRestoreRow {
  std::string shape;
  int tokens;
  size_t bytes;
  double memcpy_ms, host_save_ms, host_restore_ms, disk_save_ms, disk_restore_ms;
};

// One block of `tokens` tokens sits in a window; each repetition saves it to the bank (extract
// from the window + put into the tier) and restores it (get + place back), next to a memcpy of
// the same bytes. Medians over the repetitions.
SaveRestoreRow bench_save_restore(const Shape& sh, int tokens, int reps, const std::string& spill_dir) {
  wm::KvSpec spec = spec_of(sh);
  wm::KvWindow window(spec, {"blocks"});
  window.reserve(tokens);
  std::vector<at::Tensor> k, v;
  for (int l = 0; l < sh.layers; ++l) {
    k.push_back(at::randn({sh.kv_heads, tokens, sh.head_dim}).to(sh.dtype));
    v.push_back(at::randn({sh.kv_heads, tokens, sh.head_dim}).to(sh.dtype));
  }
  wm::Block b = wm::make_block("blk", k, v, at::arange(tokens, at::kLong).unsqueeze(1));
  window.place("blocks", b);
  const size_t bytes = b.nbytes();
  std::vector<char> src(bytes, 1), dst(bytes, 0);

  wm::StoreConfig cfg;
  cfg.spill_dir = spill_dir;
  wm::BlockStore store(cfg);
  std::vector<double> mc, hs, hr, ds, dr;
  for (int r = 0; r < reps + 1; ++r) {  // the first repetition warms up
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double m = seconds_since(t0);

    t0 = Clock::now();
    store.put(window.remove("blk"), wm::Tier::Host);
    const double s1 = seconds_since(t0);
    t0 = Clock::now();
    window.place("blocks", store.get("blk"));
    store.erase("blk");
    const double r1 = seconds_since(t0);

    t0 = Clock::now();
    store.put(window.remove("blk"), wm::Tier::Disk);
    const double s2 = seconds_since(t0);
    t0 = Clock::now();
    window.place("blocks", store.get("blk"));
    store.erase("blk");
    const double r2 = seconds_since(t0);
    if (r == 0) continue;
    mc.push_back(m);
    hs.push_back(s1);
    hr.push_back(r1);
    ds.push_back(s2);
    dr.push_back(r2);
  }
  return {sh.name, tokens, bytes, 1e3 * median(mc), 1e3 * median(hs), 1e3 * median(hr), 1e3 * median(ds),
          1e3 * median(dr)};
}

struct AttentionRow {
  int keys, queries;
  double ms, tokens_per_s;
};

AttentionRow bench_attention(int n_keys, int n_q, int heads, int kv_heads, int d, int reps, at::Device dev) {
  auto opt = at::TensorOptions().device(dev);
  at::Tensor q = at::randn({heads, n_q, d}, opt);
  at::Tensor k = at::randn({kv_heads, n_keys, d}, opt), v = at::randn({kv_heads, n_keys, d}, opt);
  at::Tensor logw = at::zeros({n_keys}, opt);
  wm::AttentionOptions ao;
  ao.n_window = n_keys - n_q;
  ao.mask.kind = wm::AttentionMask::Causal;
  std::vector<double> t;
  for (int r = 0; r < reps + 1; ++r) {
    auto t0 = Clock::now();
    auto out = wm::attention(q, k, v, logw, ao);
    (void)out.out.sum().item<float>();  // forces completion on any device
    if (r > 0) t.push_back(seconds_since(t0));
  }
  const double s = median(t);
  return {n_keys, n_q, 1e3 * s, n_q / s};
}

struct CompressionRow {
  std::string shape;
  int tokens;
  double drop_ms, votes_ms, merge_ms;
};

// One chunk of `frames` x `tpf` tokens per layer, random K/V, compressed at the default keep
// ratio in each merge mode in turn, every repetition. Medians over the repetitions.
CompressionRow bench_compression(const Shape& sh, int frames, int tpf, int reps, at::Device dev) {
  const int n = frames * tpf;
  auto opt = at::TensorOptions().device(dev).dtype(sh.dtype);
  std::vector<at::Tensor> k, v;
  for (int l = 0; l < sh.layers; ++l) {
    k.push_back(at::randn({sh.kv_heads, n, sh.head_dim}, opt));
    v.push_back(at::randn({sh.kv_heads, n, sh.head_dim}, opt));
  }
  wm::Block b = wm::make_block("chunk:0", k, v, at::arange(n, at::kLong).unsqueeze(1));
  const wm::worldkv::MergeMode modes[] = {wm::worldkv::MergeMode::Drop, wm::worldkv::MergeMode::Votes,
                                          wm::worldkv::MergeMode::Merge};
  std::vector<double> t[3];
  for (int r = 0; r < reps + 1; ++r)  // the first repetition warms up
    for (int m = 0; m < 3; ++m) {
      wm::worldkv::CompressionConfig cfg;
      cfg.merge = modes[m];
      auto t0 = Clock::now();
      wm::Block c = wm::worldkv::compress_chunk(b, tpf, cfg);
      (void)c.layers.back().v.sum().item<float>();  // forces completion on any device
      if (r > 0) t[m].push_back(seconds_since(t0));
    }
  return {sh.name, n, 1e3 * median(t[0]), 1e3 * median(t[1]), 1e3 * median(t[2])};
}

// A fresh folder under the system's temporary folder for the disk tier's spill files, removed
// with everything in it when the program ends, by an error or a termination signal too.
class SpillFolder {
 public:
  SpillFolder() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "wm_bench_core.XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw wm::Error("cannot create a spill folder " + tmpl + ": " + std::strerror(errno));
    path_ = tmpl;
    slot_ = wm::cli::register_temporary(path_, /*folder=*/true);
  }
  ~SpillFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    wm::cli::unregister_temporary(slot_);
  }
  SpillFolder(const SpillFolder&) = delete;
  SpillFolder& operator=(const SpillFolder&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int slot_ = -1;
};

// /proc/self/status's field `name` (e.g. "RssAnon:") in GiB, 0 when absent.
double status_gib(const char* name) { return wm::cli::proc_status_bytes(name) / double(int64_t{1} << 30); }

// --window-gib: a window of `layers` layers (LingBot-World-Fast's 40 kv heads of 128, bfloat16)
// filled to `gib` GiB a layer at a time, then read `passes` times a layer at a time, as the
// DiT's blocks read it at each call, in files of `dir` (runtime/mapped_storage.h) or, when dir
// is empty, in memory. Prints each pass's rate and the resident memory (anonymous and file pages).
void bench_window_in_files(const std::string& dir, double gib, int layers, int passes) {
  wm::KvSpec spec = spec_of({"", layers, 40, 128, at::kBFloat16});
  const double per_token = double(spec.bytes_per_token_layer()) * layers;
  const int64_t tokens = int64_t(gib * double(int64_t{1} << 30) / per_token);
  WM_CHECK(tokens > 0, "--window-gib ", gib, " holds no token");
  wm::KvWindow w(spec, {"recent"});
  if (!dir.empty()) w.use_storage(std::make_shared<wm::MappedStorage>(dir));
  w.reserve(tokens);
  std::printf("window: %d layers x 40 kv heads x 128, bf16, %lld tokens (%.2f GiB) %s%s\n", layers,
              static_cast<long long>(tokens), tokens * per_token / double(int64_t{1} << 30),
              dir.empty() ? "in memory" : "in files in ", dir.c_str());
  const int64_t piece = std::min<int64_t>(tokens, 1560);  // a latent frame of 480 x 832
  const at::Tensor kv = at::randn({40, piece, 128}, at::detail::createCPUGenerator(1)).to(at::kBFloat16);
  const at::Tensor pos = at::zeros({piece, spec.rope.n_axes()}, at::kLong);
  const double bytes = tokens * per_token;
  auto t0 = Clock::now();
  for (int l = 0; l < layers; ++l)
    for (int64_t done = 0; done < tokens; done += piece) {
      const int64_t n = std::min(piece, tokens - done);
      w.append("recent", "chunk", l, kv.narrow(1, 0, n), kv.narrow(1, 0, n), pos.narrow(0, 0, n));
    }
  std::printf("  fill     %7.2f s  %6.2f GB/s  RssAnon %.2f GiB  RssFile %.2f GiB\n", seconds_since(t0),
              bytes / seconds_since(t0) / 1e9, status_gib("RssAnon:"), status_gib("RssFile:"));
  for (int p = 0; p < passes; ++p) {
    t0 = Clock::now();
    double sum = 0;
    for (int l = 0; l < layers; ++l) sum += w.k(l).sum().item<double>() + w.v(l).sum().item<double>();
    std::printf("  read %-3d %7.2f s  %6.2f GB/s  RssAnon %.2f GiB  RssFile %.2f GiB  (sum %.3g)\n", p + 1,
                seconds_since(t0), bytes / seconds_since(t0) / 1e9, status_gib("RssAnon:"), status_gib("RssFile:"),
                sum);
    std::fflush(stdout);
  }
}

// --window-gib and its options (bench_window_in_files).
struct WindowBench {
  std::string dir;
  double gib = 0;
  int layers = 40, passes = 3;

  void add_to(CLI::App& app) {
    app.add_option("--window-gib", gib,
                   "instead of the figures above: fill a window of --window-layers layers (40 kv heads of 128, "
                   "bf16) to this many GiB a layer at a time and read it --window-passes times, in files of "
                   "--window-files or in memory; rates and resident memory")
        ->check(CLI::Range(0.001, 4096.0));
    app.add_option("--window-files", dir, "--window-gib: the window's K/V in files in this folder")
        ->check(CLI::ExistingDirectory);
    app.add_option("--window-layers", layers, "--window-gib: layers")->check(CLI::Range(1, 1000));
    app.add_option("--window-passes", passes, "--window-gib: passes reading the window")->check(CLI::Range(1, 1000));
  }
  // Whether this run is the window's; throws wm::Error for its options without --window-gib, or
  // the other figures' options beside it.
  bool asked(const CLI::App& app) const {
    const bool any = app.count("--window-files") || app.count("--window-layers") || app.count("--window-passes");
    if (gib <= 0) {
      if (any) throw wm::Error("--window-files, --window-layers and --window-passes go with --window-gib");
      return false;
    }
    for (const char* o : {"--reps", "--tokens", "--keys", "--json", "--quick", "--device"})
      if (app.count(o)) throw wm::Error(wm::str_cat(o, " is for the other figures, not --window-gib"));
    return true;
  }
  int run(int threads) const {
    wm::init_threads(threads);
    bench_window_in_files(dir, gib, layers, passes);
    return 0;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wm_bench_core: save/restore of KV blocks against memcpy, attention throughput, and worldkv_c's "
               "compression time per chunk"};
  int reps = 5;
  int threads = 0;
  std::string device = "auto";
  std::string json_out;
  std::vector<int> tokens = {20, 80, 320, 1280};
  std::vector<int> keys = {1024, 4096, 16384, 65536};
  bool quick = false;
  app.add_option("--reps", reps, "repetitions per figure (median reported)")->check(CLI::Range(1, 100000));
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--device", device, "auto, cpu, cuda, cuda:N");
  app.add_option("--tokens", tokens, "block sizes in tokens")->check(CLI::Range(1, 16384));
  app.add_option("--keys", keys, "attention window sizes in keys (64 queries attend to the last of them)")
      ->check(CLI::Range(64, 262144));
  app.add_option("--json", json_out, "also write the figures as JSON to this file");
  WindowBench window;
  window.add_to(app);
  app.add_flag("--quick", quick,
               "a smoke run: 2 repetitions, blocks of 20 and 80 tokens, 1024 keys, a smaller compression chunk; "
               "--reps, --tokens and --keys given beside it still apply");
  CLI11_PARSE(app, argc, argv);
  wm::cli::remove_temporaries_on_signal();
  try {
    if (quick) {
      if (!app.count("--reps")) reps = 2;
      if (!app.count("--tokens")) tokens = {20, 80};
      if (!app.count("--keys")) keys = {1024};
    }
    if (window.asked(app)) return window.run(threads);
    std::unique_ptr<wm::cli::OutputFile> json_file;  // opened first: a bad path fails before the work
    if (!json_out.empty()) json_file = std::make_unique<wm::cli::OutputFile>(json_out);
    const int nt = wm::init_threads(threads);
    const at::Device dev = wm::parse_device(device);
    std::cout << "wm_bench_core: " << wm::describe_device(dev) << ", " << nt << " threads, median of " << reps
              << " repetitions\n\n";
    const SpillFolder spill_folder;
    const std::string& spill = spill_folder.path();

    nlohmann::json out;
    const std::vector<Shape> shapes = {{"7B-like (28 layers, 4 kv heads, d 128, fp16)", 28, 4, 128, at::kHalf},
                                       {"tiny (6 layers, 4 kv heads, d 48, fp32)", 6, 4, 48, at::kFloat}};
    std::printf("Block save/restore through the bank vs memcpy of the same bytes (ratio = time / memcpy time)\n");
    std::printf("%-46s %6s %10s %9s | %8s %8s | %8s %8s\n", "shape", "tokens", "bytes", "memcpy ms", "host sv",
                "host rs", "disk sv", "disk rs");
    for (auto& sh : shapes)
      for (int t : tokens) {
        auto r = bench_save_restore(sh, t, reps, spill);
        std::printf("%-46s %6d %10zu %9.3f | %7.2fx %7.2fx | %7.2fx %7.2fx\n", r.shape.c_str(), r.tokens, r.bytes,
                    r.memcpy_ms, r.host_save_ms / r.memcpy_ms, r.host_restore_ms / r.memcpy_ms,
                    r.disk_save_ms / r.memcpy_ms, r.disk_restore_ms / r.memcpy_ms);
        std::fflush(stdout);
        out["save_restore"].push_back({{"shape", r.shape},
                                       {"tokens", r.tokens},
                                       {"bytes", r.bytes},
                                       {"memcpy_ms", r.memcpy_ms},
                                       {"host_save_ms", r.host_save_ms},
                                       {"host_restore_ms", r.host_restore_ms},
                                       {"disk_save_ms", r.disk_save_ms},
                                       {"disk_restore_ms", r.disk_restore_ms}});
      }
    std::printf("\nAttention, one layer, 28 query heads / 4 kv heads, d 128, fp32, log-weights + causal mask\n");
    std::printf("%8s %8s %12s %14s\n", "keys", "queries", "ms", "tokens/s");
    for (int nk : keys)
      for (int nq : {1, 64}) {
        auto r = bench_attention(nk, nq, 28, 4, 128, reps, dev);
        std::printf("%8d %8d %12.3f %14.1f\n", r.keys, r.queries, r.ms, r.tokens_per_s);
        std::fflush(stdout);
        out["attention"].push_back({{"keys", r.keys}, {"queries", r.queries}, {"ms", r.ms}, {"tokens_per_s", r.tokens_per_s}});
      }
    std::printf("\nworldkv_c compression of one chunk (3 frames) by merge mode, ms\n");
    std::printf("%-46s %6s %9s %9s %9s\n", "shape", "tokens", "drop", "votes", "merge");
    const std::vector<std::pair<Shape, int>> chunk_shapes = {
        {{"tiny model (4 layers, 4 heads, d 48, fp32)", 4, 4, 48, at::kFloat}, 64},
        {{"matrix-game-2 (30 layers, 12 heads, d 128, fp32)", 30, 12, 128, at::kFloat}, quick ? 110 : 880}};
    for (auto& [sh, tpf] : chunk_shapes) {
      auto r = bench_compression(sh, 3, tpf, reps, dev);
      std::printf("%-46s %6d %9.3f %9.3f %9.3f\n", r.shape.c_str(), r.tokens, r.drop_ms, r.votes_ms, r.merge_ms);
      std::fflush(stdout);
      out["compression"].push_back(
          {{"shape", r.shape}, {"tokens", r.tokens}, {"drop_ms", r.drop_ms}, {"votes_ms", r.votes_ms}, {"merge_ms", r.merge_ms}});
    }
    if (json_file) {
      json_file->stream() << out.dump(2) << "\n";
      json_file->commit();
    }
  } catch (const std::exception& e) {
    std::cerr << "wm_bench_core: error: " << wm::cli::error_text(e) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace wm_tool_bench_core
