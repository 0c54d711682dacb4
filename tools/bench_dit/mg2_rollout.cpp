#include "tools/bench_dit/mg2_rollout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "dit/codec.h"
#include "dit/wan_vae.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/bench_dit/mg2_bench.h"
#include "tools/cli/output_file.h"
#include "worldkv/mg2_adapter.h"
#include "worldkv/session.h"

namespace wm::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// A Wan VAE codec with the release's shape and libtorch's default initialisation.
std::unique_ptr<dit::Codec> random_vae(at::Device dev) {
  dit::WanVae vae(dit::WanVaeConfig{});
  std::map<std::string, at::Tensor> sd;
  for (const auto& p : vae->named_parameters()) sd[p.key()] = p.value().detach();
  for (const auto& b : vae->named_buffers()) sd[b.key()] = b.value().detach();
  dit::WanVaeCodecOptions vo;
  vo.device = dev;
  return std::make_unique<dit::WanVaeCodec>(sd, vo, "random Wan VAE");
}

struct Checkpoint {
  double seconds = 0;
  int64_t chunks = 0, frames = 0;
  double wall_s = 0, fps = 0, recent_fps = 0;
  double dit_ms = 0, decode_ms = 0, other_ms = 0;  // per chunk over the last 10 chunks
  size_t window_bytes = 0, action_bytes = 0;
  std::array<size_t, 3> bank_bytes{};
};

json to_json(const Checkpoint& c) {
  return {{"seconds", c.seconds},       {"chunks", c.chunks},     {"frames", c.frames},
          {"wall_s", c.wall_s},         {"fps", c.fps},           {"fps_last_10_chunks", c.recent_fps},
          {"dit_ms", c.dit_ms},         {"decode_ms", c.decode_ms},  {"memory_and_other_ms", c.other_ms},
          {"window_bytes", c.window_bytes}, {"action_bytes", c.action_bytes},
          {"bank_bytes", {c.bank_bytes[0], c.bank_bytes[1], c.bank_bytes[2]}}};
}

// The chunk times so far of one policy's rollout.
struct Times {
  std::vector<double> chunk_ms, dit_ms, decode_ms;
  int64_t frames = 0;
  double wall_ms = 0;
};

// The checkpoint at `seconds` after chunk index k: over the whole rollout so far and its last
// 10 chunks, and the memory's sizes after the chunk.
Checkpoint checkpoint(double seconds, int64_t k, const Times& t, const worldkv::ChunkOutput& out, int per_chunk) {
  Checkpoint cp;
  cp.seconds = seconds;
  cp.chunks = k + 1;
  cp.frames = t.frames;
  cp.wall_s = t.wall_ms / 1000;
  cp.fps = t.frames / cp.wall_s;
  const size_t n = std::min<size_t>(10, t.chunk_ms.size());
  double last = 0, last_dit = 0, last_dec = 0;
  for (size_t i = t.chunk_ms.size() - n; i < t.chunk_ms.size(); ++i) {
    last += t.chunk_ms[i];
    last_dit += t.dit_ms[i];
    last_dec += t.decode_ms[i];
  }
  cp.recent_fps = double(per_chunk) * n / (last / 1000);
  cp.dit_ms = last_dit / n;
  cp.decode_ms = last_dec / n;
  cp.other_ms = (last - last_dit - last_dec) / n;
  cp.window_bytes = out.window_bytes;
  cp.action_bytes = out.state_bytes;
  cp.bank_bytes = out.bank_bytes;
  return cp;
}

void print_checkpoint(const std::string& policy, const Checkpoint& cp) {
  std::printf("%-14s %6.0f %6lld %7lld %8.1f %8.2f %9.2f %8.0f %9.0f %9.0f %10.0f %10.0f %10.0f\n", policy.c_str(),
              cp.seconds, static_cast<long long>(cp.chunks), static_cast<long long>(cp.frames), cp.wall_s, cp.fps,
              cp.recent_fps, cp.dit_ms, cp.decode_ms, cp.other_ms, cp.window_bytes / 1e6, cp.bank_bytes[0] / 1e6,
              (cp.bank_bytes[1] + cp.bank_bytes[2]) / 1e6);
  std::fflush(stdout);
}

// What every policy's rollout shares: the model, the condition, the lengths, the options.
struct Rollout {
  const Mg2RolloutOptions& o;
  dit::Mg2Dit model;
  at::Device dev;
  at::Tensor image_latents, clip;
  std::vector<double> seconds;  // sorted
  int64_t n_chunks = 0;
};

// One chunk's inputs: W held and the camera turning (yaw +0.05 a video frame).
std::vector<worldkv::FrameControl> walk_and_turn(int n, int keyboard_dim) {
  std::vector<worldkv::FrameControl> in(static_cast<size_t>(n));
  for (auto& x : in) {
    x.mg2.keyboard.assign(std::max(1, keyboard_dim), 0.0f);
    x.mg2.keyboard[0] = 1;  // forward (templerun: "nomove" stands, the runner still runs)
    x.mg2.yaw = 0.05f;
  }
  return in;
}

// One policy's rollout: its checkpoints printed and returned as JSON; a failure (the device's
// memory outgrown) recorded with the chunk it came at.
json roll_policy(const Rollout& r, const std::string& policy) {
  const Mg2RolloutOptions& o = r.o;
  worldkv::SessionConfig sc;
  sc.set_policy(policy);
  sc.seed = o.seed;
  sc.memory.bank.device = r.dev;
  sc.memory.bank.pin_host = o.pin_host;
  if (!r.dev.is_cpu()) sc.memory.bank.device_budget = size_t(o.bank_device_gib * double(1ull << 30));
  json row = {{"policy", policy}, {"checkpoints", json::array()}};
  Times t;
  try {
    worldkv::WorldSession session(std::make_unique<worldkv::Mg2Adapter>(r.model, o.decode ? random_vae(r.dev) : nullptr,
                                                                        r.image_latents, r.clip, worldkv::Mg2Options{}, r.dev),
                                  sc);
    const int per_chunk = session.controls_for_chunk(1);
    size_t next_cp = 0;
    for (int64_t k = 0; k < r.n_chunks && next_cp < r.seconds.size(); ++k) {
      const auto in = walk_and_turn(session.controls_for_next_chunk(), r.model->config().keyboard_dim());
      worldkv::ChunkOutput out = session.next(in);
      t.frames += int64_t(in.size());
      t.wall_ms += out.ms;
      t.chunk_ms.push_back(out.ms);
      t.dit_ms.push_back(out.model_ms);
      t.decode_ms.push_back(out.decode_ms);
      std::fprintf(stderr, "[%s] chunk %lld: %.0f ms (DiT %.0f ms), %lld frames\n", policy.c_str(),
                   static_cast<long long>(k), out.ms, out.model_ms, static_cast<long long>(t.frames));
      while (next_cp < r.seconds.size() &&
             (t.frames >= std::ceil(r.seconds[next_cp] * o.video_fps) || k + 1 == r.n_chunks)) {
        const Checkpoint cp = checkpoint(r.seconds[next_cp++], k, t, out, per_chunk);
        print_checkpoint(policy, cp);
        row["checkpoints"].push_back(to_json(cp));
      }
    }
  } catch (const std::exception& e) {
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    std::printf("%-14s failed after %zu chunks (%lld frames): %s\n", policy.c_str(), t.chunk_ms.size(),
                static_cast<long long>(t.frames), msg.c_str());
    std::fflush(stdout);
    row["failed"] = {{"after_chunks", t.chunk_ms.size()}, {"error", msg}};
  }
  return row;
}

// Throws wm::Error on options out of range; returns the one dtype.
at::ScalarType check_options(const Mg2RolloutOptions& o) {
  WM_CHECK(!o.policies.empty(), "--policies is empty");
  WM_CHECK(!o.seconds.empty(), "--seconds is empty");
  for (double s : o.seconds) WM_CHECK(std::isfinite(s) && s > 0 && s <= 3600, "--seconds must be in (0, 3600], got ", s);
  WM_CHECK(std::isfinite(o.video_fps) && o.video_fps > 0 && o.video_fps <= 240, "--video-fps must be in (0, 240]");
  WM_CHECK(std::isfinite(o.bank_device_gib) && o.bank_device_gib >= 0, "--bank-device-gib must be >= 0");
  const auto dtypes = parse_mg2_dtypes(o.dtype);
  WM_CHECK(dtypes.size() == 1, "--mg2-rollout takes one dtype (f32 or bf16), got '", o.dtype, "'");
  for (const auto& p : o.policies) worldkv::SessionConfig().set_policy(p);  // fail before building anything
  return dtypes[0];
}

// The model at the release's shape with random weights, the lengths and the table's header.
Rollout build(const Mg2RolloutOptions& o, at::ScalarType dtype) {
  Rollout r{o, dit::Mg2Dit(nullptr), wm::parse_device(o.device), {}, {}, o.seconds, 0};
  std::sort(r.seconds.begin(), r.seconds.end());
  const auto t_build = Clock::now();
  std::fprintf(stderr, "[%s] building the model\n", o.mode.c_str());
  r.model = dit::Mg2Dit(mg2_release_config(o.mode, o.layers));
  randomize_mg2(*r.model, o.seed, o.mode);
  r.model->to(r.dev, dtype);
  r.model->eval();
  const dit::Mg2Config& c = r.model->config();
  const int64_t total_frames = int64_t(std::ceil(r.seconds.back() * o.video_fps));
  // 9 video frames in the first chunk, 12 after.
  const int per_chunk = 4 * c.frames_per_chunk;
  r.n_chunks = 1 + std::max<int64_t>(0, (total_frames - (per_chunk - 3) + per_chunk - 1) / per_chunk);
  std::printf("Matrix-Game-2.0 %s rollout (random weights, %d blocks), %s, DiT in %s, %s; %lld chunks (%lld video frames = "
              "%.0f s at %.0f frames/s); built in %.1f s\n",
              o.mode.c_str(), c.num_layers, wm::describe_device(r.dev).c_str(), o.dtype.c_str(),
              o.decode ? "Wan VAE decode in float16 per chunk" : "no decode", static_cast<long long>(r.n_chunks),
              static_cast<long long>(total_frames), r.seconds.back(), o.video_fps,
              std::chrono::duration<double>(Clock::now() - t_build).count());
  std::printf("%-14s %6s %6s %7s %8s %8s %9s %8s %9s %9s %10s %10s %10s\n", "policy", "video_s", "chunks", "frames",
              "wall_s", "fps", "fps_last10", "dit_ms", "decode_ms", "other_ms", "window_MB", "bank_dev_MB",
              "bank_host_MB");
  std::fflush(stdout);
  at::Generator gen = at::detail::createCPUGenerator(o.seed + 1);
  r.image_latents =
      at::randn({1 + (r.n_chunks * c.frames_per_chunk), c.out_dim, c.latent_height, c.latent_width}, gen) * 0.5;
  r.clip = at::randn({c.clip_tokens, c.clip_dim}, gen);
  return r;
}

}  // namespace

int run_mg2_rollout(const Mg2RolloutOptions& o) {
  const at::ScalarType dtype = check_options(o);
  std::unique_ptr<wm::cli::OutputFile> json_file;
  if (!o.json_out.empty()) json_file = std::make_unique<wm::cli::OutputFile>(o.json_out);
  wm::keep_freed_memory();
  at::NoGradGuard ng;
  const Rollout r = build(o, dtype);
  json results = json::array();
  for (const std::string& policy : o.policies) results.push_back(roll_policy(r, policy));
  if (json_file) {
    json j = {{"mode", o.mode},   {"device", wm::describe_device(r.dev)}, {"dtype", o.dtype}, {"decode", o.decode},
              {"video_fps", o.video_fps}, {"policies", results}};
    json_file->stream() << j.dump(2) << "\n";
    json_file->commit();
  }
  return 0;
}

}  // namespace wm::bench
