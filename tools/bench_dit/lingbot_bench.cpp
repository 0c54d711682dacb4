#include "tools/bench_dit/lingbot_bench.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <sys/resource.h>
#include <torch/nn/modules/normalization.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "dit/lingbot_sampler.h"
#include "dit/lingbot_weights.h"
#include "dit/umt5_prompt.h"
#include "dit/umt5_tokenizer.h"
#include "dit/wan_layers.h"
#include "tools/bench_dit/bench_util.h"
#include "tools/bench_dit/random_umt5.h"
#include "tools/bench_dit/random_wan_vae.h"
#include "tools/cli/proc_status.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/mapped_storage.h"
#include "runtime/safetensors.h"

namespace wm::bench {
namespace {

using Clock = std::chrono::steady_clock;
using wm::dit::LingbotConfig;
using wm::dit::LingbotDit;

double gib(double bytes) { return bytes / double(1ull << 30); }

// The process's peak resident set so far, bytes.
double peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) * 1024.0;
}

// The process's anonymous resident memory now (RssAnon: what it holds, without the file pages
// of the mapped shards, which the kernel may drop), bytes; 0 where /proc says nothing.
double anon_rss() { return wm::cli::proc_status_bytes("RssAnon:"); }

double param_bytes(torch::nn::Module& m) {
  double n = 0;
  for (const auto& p : m.parameters()) n += double(p.nbytes());
  return n;
}

// The umT5 files of a hub folder: the random encoder, and the tokenizer copied in when given.
void write_hub_umt5(const LingbotHubOptions& o, const LingbotConfig& c) {
  const std::filesystem::path dir(o.dir);
  int64_t vocab = 0;
  if (!o.spiece.empty()) {
    vocab = wm::dit::Umt5Tokenizer(o.spiece).vocab_size();
    const std::filesystem::path tok = dir / wm::dit::kUmt5TokenizerDir / wm::dit::kUmt5SpieceModel;
    std::filesystem::create_directories(tok.parent_path());
    std::filesystem::copy_file(o.spiece, tok, std::filesystem::copy_options::overwrite_existing);
  }
  const wm::dit::Umt5Config uc = lingbot_hub_umt5_config(c, o.layers, vocab);
  save_safetensors((dir / wm::dit::kUmt5ConvertedCheckpoint).string(), random_umt5(uc, o.seed + 2));
  std::printf("wrote %s (umT5 encoder, dim %lld, %lld blocks, vocabulary %lld, random)%s%s\n",
              (dir / wm::dit::kUmt5ConvertedCheckpoint).string().c_str(), static_cast<long long>(uc.dim),
              static_cast<long long>(uc.num_layers), static_cast<long long>(uc.vocab),
              o.spiece.empty() ? "; no tokenizer (--umt5-spiece)" : " and its tokenizer ",
              o.spiece.empty() ? "" : (dir / wm::dit::kUmt5TokenizerDir).string().c_str());
}

// A window of `frames` latent frames ending just before first_frame: random K/V of the shapes
// the clean pass writes, one block per layer.
// With `files`, the K/V are tensors of that storage (CPU only).
dit::LingbotChunkKv synthetic_window(const LingbotConfig& c, int64_t frames, int64_t first_frame, int64_t gh,
                                     int64_t gw, at::ScalarType dt, at::Device dev, at::Generator& gen,
                                     const MappedStorage* files) {
  dit::LingbotChunkKv kv;
  const int64_t n = frames * gh * gw;
  const at::Tensor pos = dit::wan_positions(first_frame - frames, frames, gh, gw);
  auto make = [&] {
    at::Tensor r = at::randn({c.num_heads, n, c.head_dim()}, gen);
    return files ? files->empty(r.sizes(), dt).copy_(r) : r.to(dev, dt);
  };
  for (int l = 0; l < c.num_layers; ++l) {
    LayerKv lk;
    lk.k = make();
    lk.v = make();
    lk.pos = pos.to(dev);
    lk.logw = at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(dev));
    kv.main.push_back(std::move(lk));
  }
  return kv;
}

// One steady-state chunk: per call seconds (4 steps, then the clean pass).
std::vector<double> time_chunk(dit::LingbotDitImpl& m, const LingbotBenchOptions& o, const dit::LingbotText& text,
                               const dit::LingbotNativeCache& cache, at::Generator& gen) {
  const auto& c = m.config();
  const int64_t F = c.frames_per_chunk, first = o.window_frames, h = o.latent_height, w = o.latent_width;
  const at::Device dev = m.device();
  const at::Tensor cond = at::cat({at::zeros({F, 4, h, w}), at::randn({F, 16, h, w}, gen)}, 1).to(dev);
  const at::Tensor cam = at::randn({F, c.camera_channels(), h, w}, gen).to(dev);
  const dit::LingbotSchedule sched = dit::lingbot_schedule();
  std::vector<double> secs;
  at::Tensor x = at::randn({F, c.out_dim, h, w}, gen).to(dev);
  for (size_t i = 0; i <= sched.timesteps.size(); ++i) {
    const int64_t t = i < sched.timesteps.size() ? sched.timesteps[i] : 0;
    dit::LingbotChunkKv kv;
    const auto t0 = Clock::now();
    at::Tensor flow = m.forward_chunk(x, at::full({1}, t, at::TensorOptions().dtype(at::kLong)), cond, cam, text,
                                      first, cache.context(), i == sched.timesteps.size() ? &kv : nullptr);
    sync(flow);
    secs.push_back(seconds_since(t0));
    std::fprintf(stderr, "  %s (t %lld): %.2f s\n", i < sched.timesteps.size() ? "step" : "clean pass",
                 static_cast<long long>(t), secs.back());
    // x0 stands in for the re-noised input of the next call (the time does not depend on it).
    if (i < sched.timesteps.size()) x = (x - double(sched.x0_sigmas[i]) * flow.to(at::kFloat));
    if (!kv.main.empty() && !cache.main().empty())
      WM_CHECK(kv.main[0].k.size(0) == cache.main()[0].k.size(0) && kv.main[0].k.size(2) == cache.main()[0].k.size(2) &&
                   kv.main[0].k.scalar_type() == cache.main()[0].k.scalar_type(),
               "the clean pass wrote ", kv.main[0].k.sizes(), " ", kv.main[0].k.scalar_type(),
               ", the synthetic window holds ", cache.main()[0].k.sizes(), " ", cache.main()[0].k.scalar_type());
  }
  return secs;
}

}  // namespace

LingbotConfig lingbot_bench_config(const std::string& size, int layers) {
  LingbotConfig c;
  if (size == "14b") {
    c.model_type = "i2v";
    c.in_dim = 36;
    c.dim = 5120;
    c.ffn_dim = 13824;
    c.num_heads = 40;
    c.num_layers = 40;
  } else if (size == "tiny") {
    c.model_type = "i2v";
    c.in_dim = 36;
    c.dim = 32;
    c.ffn_dim = 64;
    c.num_heads = 2;
    c.num_layers = 2;
    c.text_dim = 32;
    c.text_len = 16;
    c.local_attn_size = 9;
    c.sink_size = 3;
  } else {
    c = dit::load_lingbot_config(size);
  }
  if (layers > 0) c.num_layers = std::min(c.num_layers, layers);
  c.validate();
  return c;
}

namespace {

bool is_norm(torch::nn::Module& mod) { return mod.as<torch::nn::LayerNormImpl>() || mod.as<dit::WanRmsNormImpl>(); }

// randomize_lingbot's rule for one parameter (`name` its name in its module).
void randomize_parameter(at::Tensor t, bool norm, const std::string& name, at::Generator& gen) {
  if (norm)
    name == "weight" ? t.fill_(1.0) : t.zero_();
  else
    t.normal_(0.0, 0.02, gen);
}

}  // namespace

void randomize_lingbot(dit::LingbotDitImpl& m, uint64_t seed) {
  at::NoGradGuard ng;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (const auto& item : m.named_modules()) {
    const bool norm = is_norm(*item.value());
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      randomize_parameter(p.value(), norm, p.key(), gen);
  }
}

wm::dit::Umt5Config lingbot_hub_umt5_config(const LingbotConfig& c, int layers, int64_t vocab) {
  wm::dit::Umt5Config u = wm::dit::umt5_xxl_config();
  if (c.text_dim == u.dim) {
    if (layers > 0) u.num_layers = std::min<int64_t>(u.num_layers, layers);
  } else {
    u = small_umt5_config(c.text_dim, 512);
  }
  if (vocab > 0) u.vocab = vocab;
  return u;
}

double write_random_lingbot(const LingbotConfig& c, uint64_t seed, at::ScalarType dt, const std::string& dir,
                            int64_t shard_bytes) {
  WM_CHECK(c.num_layers >= 1, "a model of ", c.num_layers, " blocks");
  LingbotConfig one = c;
  one.num_layers = 1;
  LingbotDit m(one);
  struct Entry {
    at::Tensor param;
    bool norm;
    std::string name, key;  // its name in its module; its key in the model
  };
  std::vector<Entry> entries;
  std::vector<std::pair<std::string, int64_t>> keys;
  std::vector<Entry> block;  // block 0's tensors, emitted once per block
  auto emit = [&](const Entry& e) {
    entries.push_back(e);
    keys.emplace_back(e.key, e.param.numel() * int64_t(c10::elementSize(dt)));
  };
  auto flush_block = [&] {
    for (int b = 0; b < c.num_layers; ++b)
      for (Entry e : block) emit({e.param, e.norm, e.name, "blocks." + std::to_string(b) + e.key.substr(8)});
    block.clear();
  };
  for (const auto& item : m->named_modules()) {  // pre-order, as named_parameters and randomize_lingbot
    const bool norm = is_norm(*item.value());
    const bool in_block = item.key().rfind("blocks.0", 0) == 0;
    if (!in_block && !block.empty()) flush_block();
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      Entry e{p.value(), norm, p.key(), item.key().empty() ? p.key() : item.key() + "." + p.key()};
      in_block ? block.push_back(e) : emit(e);
    }
  }
  if (!block.empty()) flush_block();
  at::Generator gen = at::detail::createCPUGenerator(seed);
  size_t expected = 0;
  double bytes = 0;
  dit::save_lingbot_dit_streamed(c, keys, [&](size_t i) {
    WM_CHECK(i == expected++, "tensors asked out of order");
    const Entry& e = entries[i];
    at::Tensor t = e.param.detach();
    randomize_parameter(t, e.norm, e.name, gen);
    bytes += double(keys[i].second);
    return t.scalar_type() == dt ? t.clone() : t.to(dt);  // a tensor of its own: the block's is reused
  }, dir, shard_bytes);
  return bytes;
}

int run_lingbot_hub(const LingbotHubOptions& o) {
  at::NoGradGuard ng;
  const LingbotConfig c = lingbot_bench_config(o.size, o.layers);
  WM_CHECK(o.vae_dim > 0 && o.shard_mib > 0, "--vae-dim and --shard-mib must be > 0");
  const std::string dit_dir = (std::filesystem::path(o.dir) / "lingbot_world_fast").string();
  const double bytes = write_random_lingbot(c, o.seed, o.dtype == "bf16" ? at::kBFloat16 : at::kFloat, dit_dir,
                                            std::max<int64_t>(1, int64_t(o.shard_mib * double(1 << 20))));
  const std::string vae = (std::filesystem::path(o.dir) / "Wan2.1_VAE.safetensors").string();
  save_safetensors(vae, random_wan_vae(o.vae_dim, o.seed + 1));
  std::printf("wrote %s (dim %d, %d blocks, %.1f MB %s) and %s (Wan VAE, base width %d, random)\n", dit_dir.c_str(),
              c.dim, c.num_layers, bytes / 1e6, o.dtype.c_str(), vae.c_str(), o.vae_dim);
  write_hub_umt5(o, c);
  return 0;
}

int run_lingbot_bench(const LingbotBenchOptions& o) {
  at::NoGradGuard ng;
  const at::Device dev = parse_device(o.device);
  const bool disk = !o.from_dir.empty();
  const LingbotConfig c =
      disk ? dit::load_lingbot_config(dit::find_lingbot_files(o.from_dir).config) : lingbot_bench_config(o.size, o.layers);
  WM_CHECK(o.latent_height % 2 == 0 && o.latent_width % 2 == 0 && o.latent_height > 0 && o.latent_width > 0,
           "the latent size must be even, got ", o.latent_height, " x ", o.latent_width);
  const int64_t gh = o.latent_height / 2, gw = o.latent_width / 2, tpf = gh * gw;
  WM_CHECK(o.kv_files.empty() || (dev.is_cpu() && o.window_frames > 0),
           "--kv-files keeps a window (--window-frames > 0) in CPU memory's files; the device is ", dev.str(),
           ", the window ", o.window_frames, " frames");
  std::fprintf(stderr, "[lingbot] dim %d, %d heads, FFN %d, %d blocks; latents %lld x %lld (%lld tokens a frame), "
               "window %d frames + the chunk's 3; %s\n", c.dim, c.num_heads, c.ffn_dim, c.num_layers,
               static_cast<long long>(o.latent_height), static_cast<long long>(o.latent_width),
               static_cast<long long>(tpf), o.window_frames, describe_device(dev).c_str());
  LingbotDit m(nullptr);
  if (!disk) {
    m = LingbotDit(c);
    randomize_lingbot(*m, o.seed);
  }
  std::printf("%-5s %9s %9s %9s %9s %9s %9s %9s %10s %10s %9s %9s\n", "dtype", "step0_s", "step1_s", "step2_s", "step3_s",
              "clean_s", "chunk_s", "frames/s", "weights_GB", "window_GB", "rss_GB", "anon_GB");
  for (at::ScalarType dt : o.dtypes) {
    if (disk)
      m = dit::load_lingbot_dit(o.from_dir, dev, dt, /*streamed=*/true);  // one block held, read as each runs
    else
      m->to(dev, dt);
    at::Generator gen = at::detail::createCPUGenerator(o.seed + 1);
    const auto t_text = Clock::now();
    const dit::LingbotText text = m->encode_text(at::randn({c.text_len, c.text_dim}, gen));
    if (disk)
      std::printf("%s: the text K/V, every block read once: %.2f s (%.2f s a block)\n", dtype_name(dt).c_str(),
                  seconds_since(t_text), seconds_since(t_text) / c.num_layers);
    dit::LingbotNativeCache cache(o.window_frames + c.frames_per_chunk, 0, c.frames_per_chunk, tpf);
    std::unique_ptr<MappedStorage> files;
    if (!o.kv_files.empty()) files = std::make_unique<MappedStorage>(o.kv_files);
    if (o.window_frames > 0) {  // the first commit keeps the tensors as given (no copy)
      const auto t_window = Clock::now();
      cache.commit(synthetic_window(c, o.window_frames, o.window_frames, gh, gw, dt, dev, gen, files.get()));
      std::fprintf(stderr, "[lingbot] the synthetic window of %d blocks: %.1f s%s\n", c.num_layers,
                   seconds_since(t_window), files ? (" (in files in " + o.kv_files + ")").c_str() : "");
    }
    double window_bytes = 0;
    for (const LayerKv& l : cache.main()) window_bytes += double(l.k.nbytes() + l.v.nbytes());
    for (int i = 0; i < o.warmup + o.repeats; ++i) {
      const bool measured = i >= o.warmup;
      std::fprintf(stderr, "[lingbot] %s chunk %d%s\n", dtype_name(dt).c_str(), i, measured ? "" : " (warm-up)");
      const std::vector<double> s = time_chunk(*m, o, text, cache, gen);
      if (!measured) continue;
      double chunk = 0;
      for (double x : s) chunk += x;
      std::printf("%-5s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.4f %10.2f %10.3f %9.2f %9.2f\n", dtype_name(dt).c_str(),
                  s[0], s[1], s[2], s[3], s[4], chunk, 12.0 / chunk, gib(param_bytes(*m)), gib(window_bytes),
                  gib(peak_rss()), gib(anon_rss()));
      std::fflush(stdout);
    }
  }
  const double kv_frame = 2.0 * c.num_layers * tpf * c.dim;  // K and V, elements a latent frame
  std::printf("K/V a latent frame: %.1f MB in f32, %.1f MB in bf16 (%d blocks; the release's 40 blocks: %.1f / %.1f MB)\n",
              kv_frame * 4 / 1e6, kv_frame * 2 / 1e6, c.num_layers, kv_frame * 4 / c.num_layers * 40 / 1e6,
              kv_frame * 2 / c.num_layers * 40 / 1e6);
  return 0;
}

int run_lingbot_check(const std::string& dir, const std::string& device) {
  at::NoGradGuard ng;
  const at::Device dev = parse_device(device);
  std::fprintf(stderr, "[lingbot-check] loading %s\n", dir.c_str());
  LingbotDit m = dit::load_lingbot_dit(dir, dev, at::kFloat);
  SafeTensors io = SafeTensors::open((std::filesystem::path(dir) / "io.safetensors").string());
  // Upstream's [C, F, h, w] -> ours [F, C, h, w].
  const at::Tensor x = io.get("x").permute({1, 0, 2, 3}).contiguous().to(dev);
  const at::Tensor cond = io.get("y").permute({1, 0, 2, 3}).contiguous().to(dev);
  const at::Tensor cam = io.get("cam")[0].permute({1, 0, 2, 3}).contiguous().to(dev);
  const at::Tensor want = io.get("flow").permute({1, 0, 2, 3});
  const auto t0 = Clock::now();
  const dit::LingbotText text = m->encode_text(io.get("context").to(dev));
  const at::Tensor flow = m->forward_chunk(x, io.get("t").to(dev), cond, cam, text, 0, dit::WanKvContext{});
  sync(flow);
  const double secs = seconds_since(t0);
  const at::Tensor got = flow.to(at::kCPU, at::kDouble);
  const double scale = want.abs().max().item<double>();
  const double diff = (got - want.to(at::kDouble)).abs().max().item<double>();
  double upstream_s = 0;
  std::ifstream tf(std::filesystem::path(dir) / "time.json");
  if (tf) upstream_s = nlohmann::json::parse(tf).value("forward_s", 0.0);
  const auto& c = m->config();
  std::printf("LingBot-World-Fast, dim %d, %d heads, FFN %d, %d block(s), %lld tokens: max |ours - upstream| / max "
              "|upstream| = %.3g (max |upstream| %.3f)\nforward (text K/V included): ours %.1f s, upstream %.1f s "
              "(time.json), %s\n",
              c.dim, c.num_heads, c.ffn_dim, c.num_layers, static_cast<long long>(x.size(0) * x.size(2) * x.size(3) / 4),
              diff / scale, scale, secs, upstream_s, describe_device(dev).c_str());
  return diff / scale < 1e-4 ? 0 : 1;
}

}  // namespace wm::bench
