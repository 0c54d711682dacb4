#include "tools/bench_dit/mg2_bench.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "dit/mg2_sampler.h"
#include "dit/mg2_weights.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tools/bench_dit/bench_util.h"
#include "tools/bench_dit/fixture_inputs.h"
#include "tools/cli/output_file.h"

namespace wm::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using wm::dit::Mg2ChunkKv;
using wm::dit::Mg2Config;
using wm::dit::Mg2Dit;
using wm::dit::Mg2DitImpl;

// The CPU's model name from /proc/cpuinfo ("" elsewhere).
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      return c == std::string::npos ? "" : line.substr(line.find_first_not_of(" \t", c + 1));
    }
  return "";
}

void write_json(wm::cli::OutputFile& f, const json& j) {
  f.stream() << j.dump(2) << "\n";
  f.commit();
}

int64_t count_params(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace

void randomize_mg2(Mg2DitImpl& m, uint64_t seed, const std::string& label) {
  at::NoGradGuard ng;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t total = count_params(m);
  int64_t done = 0;
  int next_report = 10;
  for (const auto& item : m.named_modules()) {
    torch::nn::Module& mod = *item.value();
    const bool norm = mod.as<torch::nn::LayerNormImpl>() || mod.as<wm::dit::Mg2RmsNormImpl>() ||
                      mod.as<wm::dit::Mg2UnusedWeightImpl>();
    for (const auto& p : mod.named_parameters(/*recurse=*/false)) {
      at::Tensor t = p.value();
      if (norm)
        p.key() == "weight" ? t.fill_(1.0) : t.zero_();
      else
        t.normal_(0.0, 0.02, gen);
      done += t.numel();
      while (next_report <= 100 && done * 100 >= next_report * total) {
        std::fprintf(stderr, "[%s] random weights %d%%\n", label.c_str(), next_report);
        next_report += 10;
      }
    }
  }
}

namespace {

// A chunk's K/V of the shapes the refresh pass writes (random values), for frames
// first_frame .. first_frame + F - 1: main per block k, v [heads, F * 880, head_dim], pos, logw;
// per action block keyboard [F, heads, d] and mouse [880, F, heads, d].
Mg2ChunkKv synthetic_chunk_kv(Mg2DitImpl& m, int64_t first_frame, int64_t F, at::Generator& gen) {
  const Mg2Config& c = m.config();
  const auto dt = m.dtype();
  const auto dev = m.device();
  const int64_t P = c.tokens_per_frame(), n = F * P;
  auto rnd = [&](at::IntArrayRef shape) { return at::randn(shape, gen).to(dev, dt); };
  Mg2ChunkKv kv;
  const at::Tensor pos = m.positions(first_frame, F);
  for (int l = 0; l < c.num_layers; ++l) {
    wm::LayerKv lk;
    lk.k = rnd({c.num_heads, n, c.head_dim()});
    lk.v = rnd({c.num_heads, n, c.head_dim()});
    lk.pos = pos;
    lk.logw = at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(dev));
    kv.main.push_back(lk);
  }
  if (c.action) {
    const auto& a = *c.action;
    for (size_t s = 0; s < m.action_blocks().size(); ++s) {
      if (a.enable_keyboard) {
        kv.action.kb_k.push_back(rnd({F, a.heads_num, a.keyboard_head_dim()}));
        kv.action.kb_v.push_back(rnd({F, a.heads_num, a.keyboard_head_dim()}));
      }
      if (a.enable_mouse) {
        kv.action.ms_k.push_back(rnd({P, F, a.heads_num, a.mouse_head_dim()}));
        kv.action.ms_v.push_back(rnd({P, F, a.heads_num, a.mouse_head_dim()}));
      }
    }
  }
  return kv;
}

// "name[slot] [sizes] dtype" for every tensor of a chunk's K/V, slot by slot.
std::vector<std::string> kv_layout(const Mg2ChunkKv& kv) {
  std::vector<std::string> out;
  auto add = [&](const char* name, const std::vector<at::Tensor>& ts) {
    for (size_t i = 0; i < ts.size(); ++i)
      out.push_back(str_cat(name, "[", i, "] ", ts[i].sizes(), " ", ts[i].scalar_type()));
  };
  for (size_t l = 0; l < kv.main.size(); ++l) {
    add("main.k", {kv.main[l].k});
    add("main.v", {kv.main[l].v});
  }
  add("keyboard.k", kv.action.kb_k);
  add("keyboard.v", kv.action.kb_v);
  add("mouse.k", kv.action.ms_k);
  add("mouse.v", kv.action.ms_v);
  return out;
}

// Throws wm::Error naming the first difference unless the refresh pass wrote the synthetic layout.
void check_same_layout(const std::vector<std::string>& got, const std::vector<std::string>& synthetic) {
  for (size_t i = 0; i < std::max(got.size(), synthetic.size()); ++i) {
    const std::string g = i < got.size() ? got[i] : "nothing", w = i < synthetic.size() ? synthetic[i] : "nothing";
    WM_CHECK(g == w, "the synthetic context holds ", w, " where the refresh pass writes ", g);
  }
}

struct ChunkTimes {
  std::vector<double> step_s;
  double refresh_s = 0, total_s = 0;
};

// One chunk through mg2_generate_chunk, each DiT call timed apart (synchronised on its result):
// the denoising steps, then the t = 0 refresh pass that writes *kv.
ChunkTimes time_chunk(Mg2DitImpl& m, const at::Tensor& noise, const at::Tensor& cond, const wm::dit::Mg2Visual& vis,
                      const wm::dit::Mg2Actions& actions, int64_t first_frame, const wm::dit::Mg2Context& ctx,
                      const wm::dit::Mg2Schedule& sched, at::Generator& gen, Mg2ChunkKv* kv,
                      const std::string& label) {
  const size_t n = sched.timesteps.size();
  ChunkTimes r;
  const auto start = Clock::now();
  auto t0 = start;
  wm::dit::Mg2Noise renoise = [&](int, at::IntArrayRef shape) { return at::randn(shape, gen); };
  wm::dit::Mg2AfterCall after = [&](size_t i, const at::Tensor& result) {
    sync(result);
    const double s = seconds_since(t0);
    if (i < n) {
      r.step_s.push_back(s);
      std::fprintf(stderr, "[%s] step %zu/%zu (t %.4g): %.2f s\n", label.c_str(), i + 1, n, sched.timesteps[i], s);
    } else {
      r.refresh_s = s;
    }
    t0 = Clock::now();
  };
  *kv = wm::dit::mg2_generate_chunk(m, noise, cond, vis, actions, first_frame, ctx, sched, renoise, nullptr, after).kv;
  r.total_s = seconds_since(start);
  std::fprintf(stderr, "[%s] refresh pass: %.2f s; chunk %.2f s\n", label.c_str(), r.refresh_s, r.total_s);
  return r;
}

json times_json(const ChunkTimes& t, int video_frames) {
  return {{"step_s", t.step_s},
          {"refresh_s", t.refresh_s},
          {"total_s", t.total_s},
          {"frames_per_s", video_frames / t.total_s}};
}

void print_row(const std::string& dtype, const std::string& run, const ChunkTimes& t, int video_frames) {
  std::printf("%-5s %-6s", dtype.c_str(), run.c_str());
  for (double s : t.step_s) std::printf(" %9.2f", s);
  std::printf(" %10.2f %9.2f %9.3f\n", t.refresh_s, t.total_s, video_frames / t.total_s);
  std::fflush(stdout);
}

}  // namespace

Mg2Config mg2_release_config(const std::string& mode, int layers) {
  Mg2Config cfg = mg2_release_config(mode);
  if (layers > 0 && layers < cfg.num_layers) {
    cfg.num_layers = layers;
    auto& b = cfg.action->blocks;
    b.erase(std::remove_if(b.begin(), b.end(), [&](int x) { return x >= layers; }), b.end());
    if (b.empty()) cfg.action.reset();
  }
  return cfg;
}

Mg2Config mg2_release_config(const std::string& mode) {
  WM_CHECK(mode == "universal" || mode == "gta_drive" || mode == "templerun", "unknown Matrix-Game-2.0 mode '", mode,
           "' (universal, gta_drive, templerun)");
  Mg2Config c;
  c.model_type = "i2v";
  c.dim = 1536;
  c.ffn_dim = 8960;
  c.freq_dim = 256;
  c.num_heads = 12;
  c.num_layers = 30;
  c.in_dim = 36;
  c.out_dim = 16;
  c.eps = 1e-6;
  c.local_attn_size = mode == "gta_drive" ? 4 : 6;
  c.sink_size = 0;
  wm::dit::Mg2ActionConfig a;
  for (int b = 0; b < 15; ++b) a.blocks.push_back(b);
  a.enable_keyboard = true;
  a.enable_mouse = mode != "templerun";
  a.heads_num = 16;
  a.hidden_size = 128;
  a.img_hidden_size = 1536;
  a.keyboard_dim_in = mode == "universal" ? 4 : mode == "gta_drive" ? 2 : 7;
  a.keyboard_hidden_dim = 1024;
  a.mouse_dim_in = 2;
  a.mouse_hidden_dim = 1024;
  a.rope_dim_list = {8, 28, 28};
  a.mouse_qk_dim_list = {8, 28, 28};
  a.rope_theta = 256;
  a.vae_time_compression_ratio = 4;
  a.windows_size = 3;
  a.qk_norm = true;
  a.qkv_bias = false;
  c.action = a;
  c.validate();
  WM_CHECK(c.mode() == mode, "the config built for '", mode, "' reads as '", c.mode(), "'");
  return c;
}

std::vector<at::ScalarType> parse_mg2_dtypes(const std::string& s) {
  if (s == "both") return {at::kFloat, at::kBFloat16};
  if (s == "f32" || s == "fp32" || s == "float32") return {at::kFloat};
  if (s == "bf16" || s == "bfloat16") return {at::kBFloat16};
  throw Error(str_cat("--dtype: '", s, "' is not one of f32, bf16, both (Matrix-Game-2.0 modes)"));
}

namespace {

// The model of a mode (random weights) or of a folder, in the first dtype asked for.
Mg2Dit build_model(const Mg2BenchOptions& o, at::Device dev, const std::string& what) {
  if (!o.model_dir.empty()) {
    std::fprintf(stderr, "[%s] loading\n", what.c_str());
    return wm::dit::load_mg2_dit(o.model_dir, dev, o.dtypes[0]);
  }
  const Mg2Config cfg = mg2_release_config(o.mode, o.layers);
  std::fprintf(stderr, "[%s] building the model (%d blocks)\n", what.c_str(), cfg.num_layers);
  Mg2Dit model(cfg);
  randomize_mg2(*model, o.seed, what);
  model->to(dev, o.dtypes[0]);
  model->eval();
  return model;
}

// Where the timed chunk sits: chunk 2, whose native window is full.
struct SteadyChunk {
  int F = 0, P = 0, keep = 0, video_frames = 0;
  int64_t first_frame = 0, n_video = 0;
  wm::dit::Mg2Schedule sched;
};

SteadyChunk steady_chunk(const Mg2Config& c) {
  SteadyChunk k;
  k.F = c.frames_per_chunk;
  k.P = c.tokens_per_frame();
  k.keep = c.local_attn_size - k.F;
  k.first_frame = 2 * k.F;  // chunk 2: the native window is full from here on
  k.video_frames = k.F * (c.action ? c.action->vae_time_compression_ratio : 4);
  k.n_video = 1 + 4 * (k.first_frame + k.F - 1);
  k.sched = wm::dit::mg2_schedule(wm::dit::mg2_default_steps(c));
  return k;
}

void print_header(const Mg2BenchOptions& o, Mg2DitImpl& model, at::Device dev, const SteadyChunk& k, double build_s) {
  const Mg2Config& c = model.config();
  std::printf("Matrix-Game-2.0 %s (%s): dim %d, %d blocks (%zu with an action module), %d heads, ffn %d, "
              "%.3f B parameters; %s in %.1f s\n",
              c.mode().c_str(), o.model_dir.empty() ? "random weights N(0, 0.02^2), norms 1" : o.model_dir.c_str(),
              c.dim, c.num_layers, model.action_blocks().size(), c.num_heads, c.ffn_dim, count_params(model) / 1e9,
              o.model_dir.empty() ? "built" : "loaded", build_s);
  std::printf("%s, %d threads%s%s\n", wm::describe_device(dev).c_str(), at::get_num_threads(),
              dev.is_cpu() ? ", " : "", dev.is_cpu() ? cpu_model().c_str() : "");
  std::printf("chunk 2 (latent frames %lld..%lld, %d video frames), context %d latent frames (%d tokens) + the "
              "chunk's %d; %zu steps (t",
              static_cast<long long>(k.first_frame), static_cast<long long>(k.first_frame + k.F - 1), k.video_frames,
              k.keep, k.keep * k.P, k.F * k.P, k.sched.timesteps.size());
  for (float t : k.sched.timesteps) std::printf(" %.4g", t);
  std::printf(") + the t = 0 refresh pass; %d warm-up, %d measured chunk(s) per dtype\n\n", o.warmup, o.repeats);
  std::printf("%-5s %-6s", "dtype", "run");
  for (size_t i = 0; i < k.sched.timesteps.size(); ++i)
    std::printf(" %9s", ("step" + std::to_string(i) + "_s").c_str());
  std::printf(" %10s %9s %9s\n", "refresh_s", "total_s", "frames/s");
  std::fflush(stdout);
}

// The chunk's inputs: seeded noise, condition (mask | image latent), CLIP tokens, random keys and
// mouse.
struct ChunkInputs {
  at::Tensor noise, cond, clip;
  wm::dit::Mg2Actions actions;
};

ChunkInputs chunk_inputs(const Mg2Config& c, const SteadyChunk& k, at::Generator& gen) {
  ChunkInputs in;
  in.noise = at::randn({k.F, c.out_dim, c.latent_height, c.latent_width}, gen);
  at::Tensor mask = at::zeros({k.F, 4, c.latent_height, c.latent_width});
  in.cond = at::cat({mask, at::randn({k.F, c.cond_channels() - 4, c.latent_height, c.latent_width}, gen)}, 1);
  in.clip = at::randn({c.clip_tokens, c.clip_dim}, gen);
  in.actions.keyboard = at::rand({k.n_video, std::max(1, c.keyboard_dim())}, gen).gt(0.5).to(at::kFloat);
  if (c.mouse_dim() > 0) in.actions.mouse = (at::rand({k.n_video, c.mouse_dim()}, gen) - 0.5) * 0.2;
  return in;
}

// One dtype: the weights converted in place if needed, the CLIP K/V, a synthetic full native
// window, then the warm-up and measured chunks. Prints a row per measured chunk (and the mean).
json time_dtype(const Mg2BenchOptions& o, Mg2DitImpl& model, at::Device dev, at::ScalarType dt, const std::string& what,
                const SteadyChunk& k, const ChunkInputs& in, at::Generator& gen) {
  const std::string label = what + " " + dtype_name(dt);
  const auto t_conv = Clock::now();
  if (model.dtype() != dt) {
    std::fprintf(stderr, "[%s] converting the weights\n", label.c_str());
    model.to(dev, dt);
  }
  const double convert_s = seconds_since(t_conv);
  const auto t_vis = Clock::now();
  const wm::dit::Mg2Visual vis = model.encode_visual(in.clip);
  sync(vis.k.back());
  const double visual_s = seconds_since(t_vis);

  wm::dit::Mg2NativeCache cache(k.keep, k.P);
  std::vector<std::string> synthetic_layout;
  {
    const Mg2ChunkKv prev = synthetic_chunk_kv(model, k.first_frame - k.F, k.F, gen);
    synthetic_layout = kv_layout(prev);
    cache.commit(prev);  // the cache keeps its own copy of the last `keep` frames
  }
  const wm::dit::Mg2Context ctx = cache.context();

  json runs = json::array();
  ChunkTimes sum;
  for (int r = 0; r < o.warmup + o.repeats; ++r) {
    const bool warm = r < o.warmup;
    const std::string run_label =
        label + (warm ? " warm-up " + std::to_string(r + 1) : " run " + std::to_string(r - o.warmup + 1));
    Mg2ChunkKv kv;
    const ChunkTimes t = time_chunk(model, in.noise, in.cond, vis, in.actions, k.first_frame, ctx, k.sched, gen, &kv,
                                    run_label);
    if (r == 0) check_same_layout(kv_layout(kv), synthetic_layout);
    if (warm) continue;
    print_row(dtype_name(dt), std::to_string(r - o.warmup + 1), t, k.video_frames);
    runs.push_back(times_json(t, k.video_frames));
    sum.step_s.resize(t.step_s.size());
    for (size_t i = 0; i < t.step_s.size(); ++i) sum.step_s[i] += t.step_s[i] / o.repeats;
    sum.refresh_s += t.refresh_s / o.repeats;
    sum.total_s += t.total_s / o.repeats;
  }
  if (o.repeats > 1) print_row(dtype_name(dt), "mean", sum, k.video_frames);
  return {{"dtype", dtype_name(dt)},
          {"convert_s", convert_s},
          {"visual_s", visual_s},
          {"runs", runs},
          {"mean", times_json(sum, k.video_frames)}};
}

json bench_json(const Mg2BenchOptions& o, Mg2DitImpl& model, at::Device dev, const SteadyChunk& k, double build_s,
                const json& results) {
  const Mg2Config& c = model.config();
  return {{"program", "wm_bench_dit"},
          {"what", "Matrix-Game-2.0 DiT, one steady-state chunk through the sampler"},
          {"mode", c.mode()},
          {"weights", o.model_dir.empty() ? "random: N(0, 0.02^2), norm weights 1, norm biases 0" : o.model_dir},
          {"config", wm::dit::mg2_config_to_json(c)},
          {"parameters", count_params(model)},
          {"build_s", build_s},
          {"device", wm::describe_device(dev)},
          {"threads", at::get_num_threads()},
          {"cpu", dev.is_cpu() ? cpu_model() : ""},
          {"chunk",
           {{"index", 2},
            {"first_latent_frame", k.first_frame},
            {"latent_frames", k.F},
            {"video_frames", k.video_frames},
            {"context_latent_frames", k.keep},
            {"context_tokens", k.keep * k.P},
            {"chunk_tokens", k.F * k.P},
            {"timesteps", k.sched.timesteps}}},
          {"warmup", o.warmup},
          {"repeats", o.repeats},
          {"results", results}};
}

}  // namespace

int run_mg2_bench(const Mg2BenchOptions& o) {
  WM_CHECK(o.mode.empty() != o.model_dir.empty(), "give a mode or a model folder, not both");
  WM_CHECK(!o.dtypes.empty() && o.repeats > 0 && o.warmup >= 0, "bad options");
  WM_CHECK(o.model_dir.empty() || o.layers == 0, "--layers applies to random weights (--mg2), not to --mg2-model");
  std::unique_ptr<wm::cli::OutputFile> json_file;  // opened first: a bad path fails before the work
  if (!o.json_out.empty()) json_file = std::make_unique<wm::cli::OutputFile>(o.json_out);
  wm::keep_freed_memory();
  at::NoGradGuard ng;
  const at::Device dev = wm::parse_device(o.device);
  const std::string what = o.model_dir.empty() ? o.mode : o.model_dir;

  // The model in the first dtype; later dtypes convert it in place (one copy of the weights).
  const auto t_build = Clock::now();
  Mg2Dit model = build_model(o, dev, what);
  const double build_s = seconds_since(t_build);
  const SteadyChunk k = steady_chunk(model->config());
  print_header(o, *model, dev, k, build_s);

  at::Generator gen = at::detail::createCPUGenerator(o.seed + 1);
  const ChunkInputs in = chunk_inputs(model->config(), k, gen);
  json results = json::array();
  for (at::ScalarType dt : o.dtypes) results.push_back(time_dtype(o, *model, dev, dt, what, k, in, gen));
  std::printf("\n(once per rollout, not in the table: the CLIP tokens' cross-attention K/V, ");
  for (const auto& r : results) std::printf("%s %.2f s ", r["dtype"].get<std::string>().c_str(), r["visual_s"].get<double>());
  std::printf(")\n");
  if (json_file) write_json(*json_file, bench_json(o, *model, dev, k, build_s, results));
  return 0;
}

namespace {

// The actions of chunk 0 into *actions: io.safetensors' ([1, Nv, k] -> [Nv, k]) where it holds
// them, else the fixture generator's. Returns which, and whether the two agree.
std::string check_actions(const SafeTensors& io, const Mg2Config& c, wm::dit::Mg2Actions* actions) {
  const FixtureActions gen_actions = fixture_actions(c.mode() == "templerun", std::max(1, c.keyboard_dim()));
  auto pick = [&](const char* name, const at::Tensor& generated, at::Tensor& out) {
    if (!io.contains(name)) {
      out = generated;
      return str_cat(name, " from the fixture generator");
    }
    out = io.get(name)[0].to(at::kFloat);
    const bool same = out.sizes() == generated.sizes() && at::equal(out, generated);
    return str_cat(name, " from io.safetensors (", same ? "equal to" : "NOT equal to", " the generator's)");
  };
  std::string from = pick("keyboard_cond", gen_actions.keyboard, actions->keyboard);
  if (c.mouse_dim() > 0) from += ", " + pick("mouse_cond", gen_actions.mouse, actions->mouse);
  return from;
}

// The upstream forward's time and threads from DIR/time.json, when it is there.
void upstream_time(const std::string& dir, double* seconds, int* threads) {
  std::ifstream f(std::filesystem::path(dir) / "time.json");
  if (!f) return;
  const json tj = json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (tj.is_object() && tj.contains("time_s")) *seconds = tj["time_s"].get<double>();
  if (tj.is_object() && tj.contains("threads")) *threads = tj["threads"].get<int>();
}

// One forward of chunk 0 at t0 in dtype dt against upstream's flow `ref` ([1, C, F, h, w]):
// prints the row and returns it as JSON (times, differences overall and per latent frame).
json check_dtype(Mg2DitImpl& model, at::ScalarType dt, at::Device dev, const FixtureInputs& in,
                 const wm::dit::Mg2Actions& actions, float t0, const at::Tensor& ref) {
  const int F = model.config().frames_per_chunk;
  const double ref_max = ref.abs().max().item<double>();
  const std::string label = "check " + dtype_name(dt);
  if (model.dtype() != dt) {
    std::fprintf(stderr, "[%s] converting the weights\n", label.c_str());
    model.to(dev, dt);
  }
  std::fprintf(stderr, "[%s] forward\n", label.c_str());
  const auto ta = Clock::now();
  const wm::dit::Mg2Visual vis = model.encode_visual(in.clip);
  sync(vis.k.back());
  const double visual_s = seconds_since(ta);
  const auto tb = Clock::now();
  at::Tensor flow = model.forward_chunk(in.noise.narrow(0, 0, F), at::full({F}, t0), in.cond.narrow(0, 0, F), vis,
                                        actions, 0, wm::dit::Mg2Context{});
  sync(flow);
  const double forward_s = seconds_since(tb);
  const at::Tensor ours = flow.to(at::kCPU, at::kDouble).permute({1, 0, 2, 3}).unsqueeze(0);
  const at::Tensor diff = (ours - ref).abs();
  const double max_diff = diff.max().item<double>();
  const double rel = ref_max > 0 ? max_diff / ref_max : max_diff;
  std::vector<double> per_frame;
  for (int f = 0; f < F; ++f) {
    const double m = ref.select(2, f).abs().max().item<double>();
    const double d = diff.select(2, f).max().item<double>();
    per_frame.push_back(m > 0 ? d / m : d);
  }
  std::printf("%-5s %9.2f %10.2f %9.2f %10.4f %11.3e %10.3e ", dtype_name(dt).c_str(), visual_s, forward_s,
              visual_s + forward_s, ref_max, max_diff, rel);
  for (double v : per_frame) std::printf(" %.3e", v);
  std::printf("\n");
  std::fflush(stdout);
  return {{"dtype", dtype_name(dt)},
          {"visual_s", visual_s},
          {"forward_s", forward_s},
          {"total_s", visual_s + forward_s},
          {"max_abs_ref", ref_max},
          {"max_abs_diff", max_diff},
          {"rel", rel},
          {"rel_per_frame", per_frame},
          {"mean_abs_diff", diff.mean().item<double>()}};
}

}  // namespace

int run_mg2_check(const Mg2CheckOptions& o) {
  namespace fs = std::filesystem;
  WM_CHECK(!o.dtypes.empty(), "no dtype");
  std::unique_ptr<wm::cli::OutputFile> json_file;  // opened first: a bad path fails before the work
  if (!o.json_out.empty()) json_file = std::make_unique<wm::cli::OutputFile>(o.json_out);
  wm::keep_freed_memory();
  at::NoGradGuard ng;
  const at::Device dev = wm::parse_device(o.device);
  const std::string weights = (fs::path(o.dir) / "model.safetensors").string();
  const std::string io_path = (fs::path(o.dir) / "io.safetensors").string();
  WM_CHECK(fs::is_regular_file(io_path), io_path, ": missing (it holds the reference `flow`)");
  SafeTensors io = SafeTensors::open(io_path);
  WM_CHECK(io.contains("flow"), io_path, ": no tensor `flow`");
  const at::Tensor ref = io.get("flow").to(at::kDouble);

  std::fprintf(stderr, "[check] loading %s\n", weights.c_str());
  const auto t_load = Clock::now();
  Mg2Dit model = wm::dit::load_mg2_dit(weights, dev, o.dtypes[0]);
  const double load_s = seconds_since(t_load);
  const Mg2Config& c = model->config();
  const int F = c.frames_per_chunk;
  WM_CHECK(ref.sizes() == at::IntArrayRef({1, c.out_dim, F, c.latent_height, c.latent_width}), io_path,
           ": `flow` is ", ref.sizes(), ", expected [1, ", c.out_dim, ", ", F, ", ", c.latent_height, ", ",
           c.latent_width, "] (chunk 0)");

  // Chunk 0's inputs as the fixture script makes them; the actions from io.safetensors when it
  // holds them (checked against the generator), else from the generator.
  const FixtureInputs in = fixture_inputs();
  wm::dit::Mg2Actions actions;
  const std::string actions_from = check_actions(io, c, &actions);
  const wm::dit::Mg2Schedule sched = wm::dit::mg2_schedule(wm::dit::mg2_default_steps(c));
  const float t0 = sched.timesteps[0];
  if (io.contains("c0.s0.t")) {
    const at::Tensor ut = io.get("c0.s0.t").to(at::kFloat);
    WM_CHECK(at::equal(ut, at::full_like(ut, t0)), io_path, ": c0.s0.t is ", ut, ", the schedule's first step ", t0);
  }

  // Upstream's time (time.json from the fixture script).
  double up_s = -1;
  int up_threads = 0;
  upstream_time(o.dir, &up_s, &up_threads);

  std::printf("Matrix-Game-2.0 %s from %s: %d blocks, dim %d; loaded in %.1f s\n", c.mode().c_str(), o.dir.c_str(),
              c.num_layers, c.dim, load_s);
  std::printf("chunk 0, t = %.4g, empty context; inputs: fixture_uniform (noise 1, image latent 2, CLIP 3); %s\n",
              t0, actions_from.c_str());
  std::printf("%s, %d threads%s%s\n\n", wm::describe_device(dev).c_str(), at::get_num_threads(),
              dev.is_cpu() ? ", " : "", dev.is_cpu() ? cpu_model().c_str() : "");
  std::printf("%-5s %9s %10s %9s %10s %11s %10s  %s\n", "dtype", "visual_s", "forward_s", "total_s", "max|ref|",
              "max|diff|", "rel", "rel per latent frame");
  std::fflush(stdout);

  json rows = json::array();
  for (at::ScalarType dt : o.dtypes) rows.push_back(check_dtype(*model, dt, dev, in, actions, t0, ref));
  if (up_s >= 0)
    std::printf("\nupstream (fp32, time.json): %.2f s on %d threads for the same forward (its CLIP K/V included)\n",
                up_s, up_threads);
  if (json_file) {
    json j = {{"program", "wm_bench_dit"},
              {"what", "Matrix-Game-2.0 DiT, chunk 0 step 0 against the upstream code's flow"},
              {"dir", o.dir},
              {"mode", c.mode()},
              {"timestep", t0},
              {"actions_from", actions_from},
              {"load_s", load_s},
              {"device", wm::describe_device(dev)},
              {"threads", at::get_num_threads()},
              {"cpu", dev.is_cpu() ? cpu_model() : ""},
              {"results", rows}};
    if (up_s >= 0) j["upstream"] = {{"time_s", up_s}, {"threads", up_threads}};
    write_json(*json_file, j);
  }
  return 0;
}

}  // namespace wm::bench
