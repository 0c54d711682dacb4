// LingBot-World-Fast's DiT, sampler and camera preprocessing against the upstream code: fixtures
// made by tools/lingbot_fixtures/make_dit_fixtures.py (upstream WanModelFast, cam_utils and the
// FlowUniPC scheduler of Robbyant/lingbot-world 91ff5f6; reduced widths, random bf16 weights,
// fp32 compute, 5 chunks of 3 latent frames with a rolling cache of 9 frames and a sink of 3).
// Every DiT call's input and output, every chunk's clean latents, the self-attention caches after
// each chunk, the text cross-attention K/V and the camera preprocessing must match within 1e-4 of
// their largest magnitude.
#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dit/lingbot_camera.h"
#include "dit/lingbot_sampler.h"
#include "dit/lingbot_weights.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/temp_dir.h"
#include "tools/bench_dit/fixture_inputs.h"
#if defined(WM_TESTS_LINK_PROGRAMS)
#include "tools/bench_dit/lingbot_bench.h"
#endif

namespace wm::dit {
namespace lingbot_test {
namespace fs = std::filesystem;
using bench::fixture_uniform;

constexpr double kTol = 1e-4;
constexpr int64_t kLatF = 15, kLatH = 6, kLatW = 8, kChunk = 3, kTextTokens = 10;

std::string fixture_dir() { return std::string(WM_SOURCE_DIR) + "/tests/dit/fixtures/lingbot"; }
SafeTensors fixture_io() { return SafeTensors::open(fixture_dir() + "/io.safetensors"); }

// max |a - b| / max |b|.
double rel(const at::Tensor& a, const at::Tensor& b) { return test::rel_diff(a, b); }

// Upstream's [C, F, h, w] -> ours [F, C, h, w].
at::Tensor ours(const at::Tensor& x) { return x.permute({1, 0, 2, 3}); }

// The fixture's camera input [15, 384, 6, 8], made by our preprocessing from its poses.
at::Tensor camera_input(const SafeTensors& io) {
  return lingbot_camera_input(io.get("cam.c2ws"), io.get("cam.intrinsics")[0], 8 * kLatH, 8 * kLatW);
}

TEST(LingbotSchedule, TableAndStepsAreUpstreams) {
  SafeTensors io = fixture_io();
  const LingbotScheduleTable t = lingbot_schedule_table(10.0);
  EXPECT_TRUE(at::equal(t.timesteps, io.get("sched.table_timesteps")));
  EXPECT_TRUE(at::equal(t.sigmas, io.get("sched.table_sigmas")));
  const LingbotSchedule s = lingbot_schedule();
  EXPECT_EQ(s.timesteps, (std::vector<int64_t>{999, 978, 947, 825}));
  EXPECT_TRUE(at::equal(at::tensor(s.timesteps), io.get("sched.timesteps")));
  // x0 takes the first table entry of a repeated timestep, re-noising the second.
  auto sg = io.get("sched.table_sigmas");
  EXPECT_EQ(s.x0_sigmas[1], sg[176].item<float>());
  EXPECT_EQ(s.noise_sigmas[1], sg[177].item<float>());
  EXPECT_EQ(s.x0_sigmas[3], sg[678].item<float>());
  EXPECT_EQ(s.noise_sigmas[3], sg[679].item<float>());
  EXPECT_THROW(lingbot_schedule({179, 0}), Error);
  EXPECT_THROW(lingbot_schedule({1000}), Error);
}

TEST(LingbotCamera, PreprocessingMatchesUpstream) {
  SafeTensors io = fixture_io();
  const at::Tensor c2ws = io.get("cam.c2ws");
  ASSERT_EQ(lingbot_latent_frames(c2ws.size(0)), kLatF);
  const at::Tensor interp = lingbot_interpolate_poses(c2ws, kLatF);
  const double d_interp = (interp - io.get("cam.c2ws_interp")).abs().max().item<double>();
  EXPECT_LT(d_interp, 1e-5);
  const at::Tensor raw = lingbot_relative_poses(interp);
  EXPECT_LT((raw - io.get("cam.relative_unnormalized")).abs().max().item<double>(), 1e-5);
  const at::Tensor rel = lingbot_normalize_translation(raw, lingbot_max_translation(raw));
  const double d_rel = (rel - io.get("cam.relative")).abs().max().item<double>();
  EXPECT_LT(d_rel, 1e-5);
  const at::Tensor K = lingbot_scale_intrinsics(io.get("cam.intrinsics")[0], 480, 832, 8 * kLatH, 8 * kLatW);
  EXPECT_TRUE(at::allclose(K, io.get("cam.Ks"), 0, 1e-6)) << K << io.get("cam.Ks");
  const at::Tensor rays = lingbot_camera_rays(rel, K, 8 * kLatH, 8 * kLatW);
  const double d_rays = (rays.narrow(0, 0, 1) - io.get("cam.rays")).abs().max().item<double>();
  EXPECT_LT(d_rays, 1e-5);
  const at::Tensor cam = camera_input(io);
  ASSERT_EQ(cam.sizes(), (at::IntArrayRef{kLatF, 384, kLatH, kLatW}));
  const double d_cam = (cam.narrow(0, 0, 3) - ours(io.get("cam.plucker")[0])).abs().max().item<double>();
  EXPECT_LT(d_cam, 1e-5);
  // The fold itself: channel (c, row, column) of latent pixel (y, x) is ray c of pixel (8y + row, 8x + column).
  EXPECT_EQ(cam[2][3 * 64 + 5 * 8 + 6][4][7].item<float>(), rays[2][8 * 4 + 5][8 * 7 + 6][3].item<float>());
  std::cout << "[ lingbot camera ] worst |diff|: poses " << d_interp << ", relative " << d_rel << ", rays " << d_rays
            << ", folded " << d_cam << "\n";
}

TEST(LingbotCamera, StillCameraIsNotNormalisedAndShapesAreChecked) {
  at::Tensor still = at::eye(4).unsqueeze(0).repeat({5, 1, 1});
  still.select(2, 3).narrow(1, 0, 3).fill_(2.0);
  const at::Tensor rel = lingbot_relative_poses(still);
  EXPECT_EQ(lingbot_max_translation(rel), 0.0);
  EXPECT_TRUE(at::equal(lingbot_normalize_translation(rel, 0.0), rel));
  EXPECT_THROW(lingbot_relative_poses(at::zeros({3, 3, 4})), Error);
  EXPECT_THROW(lingbot_fold_rays(at::zeros({1, 12, 16, 6}), 8, 8), Error);
  EXPECT_EQ(lingbot_latent_frames(81), 21);
  EXPECT_EQ(lingbot_latent_frames(61), 15);
}

TEST(LingbotCamera, LiveTrajectoryEqualsOfflineOnceTheLongestStepIsSeen) {
  SafeTensors io = fixture_io();
  const at::Tensor poses = io.get("cam.c2ws_interp");  // one a latent frame
  const at::Tensor K = io.get("cam.intrinsics")[0];
  const at::Tensor rel = lingbot_relative_poses(poses);
  const double max_step = lingbot_max_translation(rel);
  const at::Tensor Ks = lingbot_scale_intrinsics(K, 480, 832, 8 * kLatH, 8 * kLatW);
  const at::Tensor rays = lingbot_camera_rays(lingbot_normalize_translation(rel, max_step), Ks, 8 * kLatH, 8 * kLatW);
  const at::Tensor offline = lingbot_fold_rays(rays, 8, 8);
  EXPECT_LT((offline - camera_input(io)).abs().max().item<double>(), 1e-5);  // upstream's path, interpolation aside

  LingbotLiveCamera fixed(K, 8 * kLatH, 8 * kLatW, max_step), running(K, 8 * kLatH, 8 * kLatW);
  int equal_chunks = 0, differing_chunks = 0;
  for (int64_t ch = 0; ch < kLatF / kChunk; ++ch) {
    const at::Tensor want = offline.narrow(0, ch * kChunk, kChunk);
    EXPECT_LT((fixed.push(poses.narrow(0, ch * kChunk, kChunk)) - want).abs().max().item<double>(), 1e-6);
    const at::Tensor got = running.push(poses.narrow(0, ch * kChunk, kChunk));
    const double seen = lingbot_max_translation(rel.narrow(0, 0, (ch + 1) * kChunk));
    EXPECT_EQ(running.scale(), seen);
    if (seen == max_step) {
      EXPECT_LT((got - want).abs().max().item<double>(), 1e-6) << "chunk " << ch;
      ++equal_chunks;
    } else {
      EXPECT_GT((got - want).abs().max().item<double>(), 1e-3) << "chunk " << ch;
      ++differing_chunks;
    }
  }
  // The fixture's walk speeds up: its longest step comes after the first chunk.
  EXPECT_GT(equal_chunks, 0);
  EXPECT_GT(differing_chunks, 0);
  EXPECT_EQ(running.frames(), kLatF);
}

TEST(LingbotConformance, EveryCallAndCacheMatchesUpstream) {
  at::NoGradGuard ng;
  LingbotDit model = load_lingbot_dit(fixture_dir(), at::kCPU, at::kFloat);
  const LingbotConfig& c = model->config();
  SafeTensors io = fixture_io();
  EXPECT_TRUE(at::equal(io.get("check.uniform"), fixture_uniform(7, {16})));

  const at::Tensor noise = ours(fixture_uniform(1, {16, kLatF, kLatH, kLatW}));
  at::Tensor mask = at::zeros({kLatF, 4, kLatH, kLatW});
  mask[0].fill_(1.0);
  const at::Tensor cond = at::cat({mask, ours(fixture_uniform(2, {16, kLatF, kLatH, kLatW}))}, 1);
  const at::Tensor cam = camera_input(io);
  const LingbotText text = model->encode_text(fixture_uniform(3, {kTextTokens, c.text_dim}));
  double worst_text = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "cross" + std::to_string(l);
    worst_text = std::max({worst_text, rel(text.k[l][0].transpose(0, 1), io.get(p + ".k")),
                           rel(text.v[l][0].transpose(0, 1), io.get(p + ".v"))});
  }
  EXPECT_LT(worst_text, kTol);

  const LingbotSchedule sched = lingbot_schedule();
  const int64_t tpf = kLatH * kLatW / 4;
  LingbotNativeCache cache(c.local_attn_size, c.sink_size, kChunk, tpf);
  double worst_flow = 0, worst_x = 0, worst_cache = 0;
  for (int ch = 0; ch < kLatF / kChunk; ++ch) {
    const int64_t sf = ch * kChunk;
    LingbotNoise renoise = [&](int step, at::IntArrayRef shape) {
      return fixture_uniform(100 + 10 * ch + step, shape.vec());
    };
    LingbotChunkTrace trace;
    LingbotChunkResult r = lingbot_generate_chunk(*model, noise.narrow(0, sf, kChunk), cond.narrow(0, sf, kChunk),
                                                  cam.narrow(0, sf, kChunk), text, sf, cache.context(), sched,
                                                  renoise, &trace);
    ASSERT_EQ(trace.flow.size(), sched.timesteps.size() + 1);
    for (size_t s = 0; s < trace.flow.size(); ++s) {
      const std::string p = "c" + std::to_string(ch) + ".s" + std::to_string(s);
      SCOPED_TRACE(p);
      EXPECT_EQ(trace.t[s].to(at::kDouble).item<double>(), io.get(p + ".t").to(at::kDouble).item<double>());
      if (s < sched.timesteps.size()) {
        const double dx = rel(trace.x[s], ours(io.get(p + ".x")));
        EXPECT_LT(dx, kTol);
        worst_x = std::max(worst_x, dx);
      }
      const double df = rel(trace.flow[s], ours(io.get(p + ".flow")));
      EXPECT_LT(df, kTol);
      worst_flow = std::max(worst_flow, df);
    }
    const std::string pc = "c" + std::to_string(ch);
    const double d0 = rel(r.latents, ours(io.get(pc + ".x0")));
    EXPECT_LT(d0, kTol);
    worst_x = std::max(worst_x, d0);
    // Upstream's cache after the clean pass holds what this chunk attended to and the chunk itself.
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string pk = pc + ".kv" + std::to_string(l);
      SCOPED_TRACE(pk);
      at::Tensor k = r.kv.main[l].k, v = r.kv.main[l].v;
      if (cache.frames() > 0) {
        k = at::cat({cache.main()[l].k, k}, 1);
        v = at::cat({cache.main()[l].v, v}, 1);
      }
      const at::Tensor end = io.get(pk + ".end");
      ASSERT_EQ(k.size(1), end[1].item<int64_t>()) << "tokens in the window";
      const at::Tensor idx = at::arange(0, k.size(1), 5, at::TensorOptions().dtype(at::kLong));
      const double dk = rel(k.transpose(0, 1).index_select(0, idx), io.get(pk + ".k_sub"));
      const double dv = rel(v.transpose(0, 1).index_select(0, idx), io.get(pk + ".v_sub"));
      EXPECT_LT(dk, kTol);
      EXPECT_LT(dv, kTol);
      worst_cache = std::max({worst_cache, dk, dv});
    }
    cache.commit(r.kv);
  }
  EXPECT_EQ(cache.frames(), 6);  // sink 3 + recent 3 (local_attn_size 9 less a chunk)
  std::cout << "[ lingbot ] worst relative difference: DiT outputs " << worst_flow << ", latents " << worst_x
            << ", caches " << worst_cache << ", text K/V " << worst_text << "\n";
}

TEST(LingbotModel, PerTokenTimestepsEqualOnePerChunk) {
  at::NoGradGuard ng;
  LingbotDit model = load_lingbot_dit(fixture_dir(), at::kCPU, at::kFloat);
  const LingbotText text = model->encode_text(fixture_uniform(3, {kTextTokens, model->config().text_dim}));
  const at::Tensor x = fixture_uniform(11, {kChunk, 16, kLatH, kLatW});
  const at::Tensor cond = fixture_uniform(12, {kChunk, 20, kLatH, kLatW});
  const at::Tensor cam = fixture_uniform(13, {kChunk, 384, kLatH, kLatW});
  const at::Tensor one = model->forward_chunk(x, at::full({1}, 947, at::kLong), cond, cam, text, 0, WanKvContext{});
  const at::Tensor per_token = model->forward_chunk(x, at::full({kChunk * kLatH * kLatW / 4}, 947, at::kLong), cond,
                                                    cam, text, 0, WanKvContext{});
  EXPECT_LT(rel(per_token, one), 1e-6);
  // The camera changes the output (the injection is live).
  const at::Tensor no_cam = model->forward_chunk(x, at::full({1}, 947, at::kLong), cond, at::Tensor(), text, 0,
                                                 WanKvContext{});
  EXPECT_GT(rel(no_cam, one), 1e-2);
  EXPECT_THROW(model->forward_chunk(x, at::full({2}, 947, at::kLong), cond, cam, text, 0, WanKvContext{}), Error);
  EXPECT_THROW(model->forward_chunk(x, at::full({1}, 947, at::kLong), cond, cam.narrow(1, 0, 383), text, 0,
                                    WanKvContext{}),
               Error);
}

// The fixture model re-saved as the hub shards it: two shards and an index, in a folder `dir` of
// a scratch folder `root` of its own.
struct ShardedCopy {
  ShardedCopy() {
    root = wm::testing::make_temp_dir("wm_lingbot_");
    dir = root / "model";
    fs::create_directories(dir);
    fs::copy_file(fixture_dir() + "/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
    SafeTensors st = SafeTensors::open(fixture_dir() + "/diffusion_pytorch_model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> a, b;
    for (const auto& n : st.names()) (n.rfind("blocks.", 0) == 0 ? b : a).emplace_back(n, st.get(n));
    for (const auto& kv : a) index["weight_map"][kv.first] = kShard1;
    for (const auto& kv : b) index["weight_map"][kv.first] = kShard2;
    index["metadata"] = {{"total_size", 0}};
    shard1 = a;
    shard2 = b;
    write();
  }
  ~ShardedCopy() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  void write() const {
    save_safetensors((dir / kShard1).string(), shard1);
    save_safetensors((dir / kShard2).string(), shard2);
    std::ofstream(dir / "diffusion_pytorch_model.safetensors.index.json") << index.dump(2);
  }
  std::string load_error() const {
    try {
      load_lingbot_dit(dir.string(), at::kCPU);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  static constexpr const char* kShard1 = "diffusion_pytorch_model-00001-of-00002.safetensors";
  static constexpr const char* kShard2 = "diffusion_pytorch_model-00002-of-00002.safetensors";
  fs::path root, dir;
  nlohmann::json index;
  std::vector<std::pair<std::string, at::Tensor>> shard1, shard2;
};

TEST(LingbotWeights, ShardedCheckpointLoadsAsTheSingleFile) {
  ShardedCopy m;
  LingbotDit a = load_lingbot_dit(m.dir.string(), at::kCPU);
  LingbotDit b = load_lingbot_dit(fixture_dir(), at::kCPU);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& p : pa) EXPECT_TRUE(at::equal(p.value(), pb[p.key()])) << p.key();
  EXPECT_GT(pa.size(), 50u);
}

#if defined(WM_TESTS_LINK_PROGRAMS)
// wm_bench_dit --lingbot-hub writes the DiT a block at a time (the release's 40 blocks do not fit
// in memory): its files are byte for byte those of the whole model randomized and saved, sharded
// (bfloat16, shards of 20 kB, 3 blocks) and in one file (float32).
TEST(LingbotWeights, BlockByBlockRandomWriterEqualsTheWholeModelSaved) {
  at::NoGradGuard no_grad;
  LingbotConfig c = bench::lingbot_bench_config("tiny", 0);
  c.num_layers = 3;
  const fs::path root = testing::make_temp_dir("wm_lingbot_writer");
  for (const auto& [dt, shard] : {std::pair<at::ScalarType, int64_t>{at::kBFloat16, 20000}, {at::kFloat, 1 << 30}}) {
    const fs::path streamed = root / ("streamed" + std::to_string(int(dt))), whole = root / ("whole" + std::to_string(int(dt)));
    const double bytes = bench::write_random_lingbot(c, 7, dt, streamed.string(), shard);
    LingbotDit m(c);
    bench::randomize_lingbot(*m, 7);
    m->to(dt);
    save_lingbot_dit(*m, whole.string(), shard);
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(whole)) names.push_back(e.path().filename().string());
    ASSERT_EQ(names.size(), size_t(std::distance(fs::directory_iterator(streamed), fs::directory_iterator())));
    if (dt == at::kFloat)
      EXPECT_EQ(names.size(), 2u) << "config.json and one file";
    else
      EXPECT_GE(names.size(), 4u) << "config.json, the index and shards";
    double file_bytes = 0;
    for (const std::string& n : names) {
      std::ifstream a(whole / n, std::ios::binary), b(streamed / n, std::ios::binary);
      ASSERT_TRUE(a && b) << n;
      const std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
      EXPECT_TRUE(sa == sb) << n << " differs";
      file_bytes += double(sa.size());
    }
    EXPECT_GT(bytes, 0);
    EXPECT_GT(file_bytes, bytes) << "the tensors' bytes and the headers";
  }
  fs::remove_all(root);
}
#endif

// An index is data: a shard it names outside the model's folder (a path up, an absolute one)
// is refused before anything is opened, even when the file it points to exists.
TEST(LingbotWeights, AnIndexCannotNameAShardOutsideItsFolder) {
  ShardedCopy m;
  const fs::path outside = m.dir.parent_path() / "wm_lingbot_outside.safetensors";
  fs::copy_file(m.dir / ShardedCopy::kShard1, outside, fs::copy_options::overwrite_existing);
  for (const std::string& name : {"../" + outside.filename().string(), outside.string()}) {
    m.index["weight_map"]["head.head.weight"] = name;
    m.write();
    const std::string e = m.load_error();
    EXPECT_NE(e.find("not a file name inside the folder"), std::string::npos) << name << ": " << e;
  }
  std::error_code ec;
  fs::remove(outside, ec);
}

TEST(LingbotWeights, BadCheckpointsNameFileAndKey) {
  {
    ShardedCopy m;
    fs::remove(m.dir / ShardedCopy::kShard2);
    const std::string e = m.load_error();
    EXPECT_NE(e.find(ShardedCopy::kShard2), std::string::npos) << e;
    EXPECT_NE(e.find("missing shard"), std::string::npos) << e;
    EXPECT_NE(e.find("blocks."), std::string::npos) << e;
  }
  {
    ShardedCopy m;
    m.index["weight_map"]["head.head.weight"] = ShardedCopy::kShard2;  // the index puts it where it is not
    m.write();
    const std::string e = m.load_error();
    EXPECT_NE(e.find(ShardedCopy::kShard2), std::string::npos) << e;
    EXPECT_NE(e.find("'head.head.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find("not in this shard"), std::string::npos) << e;
  }
  {
    ShardedCopy m;
    for (auto& kv : m.shard2)
      if (kv.first == "blocks.1.cam_scale_layer.weight") kv.second = at::zeros({64, 32});
    m.write();
    const std::string e = m.load_error();
    EXPECT_NE(e.find(ShardedCopy::kShard2), std::string::npos) << e;
    EXPECT_NE(e.find("'blocks.1.cam_scale_layer.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find("[64, 32]"), std::string::npos) << e;
  }
  {
    ShardedCopy m;
    m.index["weight_map"].erase("text_embedding.0.bias");
    m.write();
    const std::string e = m.load_error();
    EXPECT_NE(e.find("missing tensor 'text_embedding.0.bias'"), std::string::npos) << e;
    EXPECT_NE(e.find("index.json"), std::string::npos) << e;
  }
  {
    ShardedCopy m;
    m.shard1.emplace_back("img_emb.proj.0.weight", at::zeros({4}));
    m.index["weight_map"]["img_emb.proj.0.weight"] = ShardedCopy::kShard1;
    m.write();
    const std::string e = m.load_error();
    EXPECT_NE(e.find("unexpected tensor 'img_emb.proj.0.weight'"), std::string::npos) << e;
  }
}

// Layer-wise from disk: a streamed model (one block held, refilled from the files before each
// block runs) gives the resident model's text K/V, flows, latents and caches bit for bit over two
// chunks, and holds one block's parameters.
TEST(LingbotWeights, StreamedModelEqualsTheResidentOne) {
  at::NoGradGuard ng;
  ShardedCopy files;
  LingbotDit resident = load_lingbot_dit(files.dir.string(), at::kCPU, at::kFloat);
  LingbotDit streamed = load_lingbot_dit(files.dir.string(), at::kCPU, at::kFloat, /*streamed=*/true);
  const LingbotConfig& c = resident->config();
  ASSERT_GE(c.num_layers, 2);
  EXPECT_TRUE(streamed->streamed());
  int64_t rn = 0, sn = 0, block = 0;
  for (const auto& p : resident->named_parameters()) {
    rn += p.value().numel();
    if (p.key().rfind("blocks.0.", 0) == 0) block += p.value().numel();
  }
  for (const auto& p : streamed->parameters()) sn += p.numel();
  EXPECT_GT(block, 0);
  EXPECT_EQ(rn - sn, (c.num_layers - 1) * block) << "the streamed model holds one block";

  const at::Tensor ctx = fixture_uniform(3, {kTextTokens, c.text_dim});
  const LingbotText ta = resident->encode_text(ctx), tb = streamed->encode_text(ctx);
  for (int l = 0; l < c.num_layers; ++l) {
    EXPECT_TRUE(at::equal(ta.k[l], tb.k[l])) << l;
    EXPECT_TRUE(at::equal(ta.v[l], tb.v[l])) << l;
  }
  const at::Tensor noise = fixture_uniform(11, {2 * kChunk, 16, kLatH, kLatW});
  const at::Tensor cond = fixture_uniform(12, {2 * kChunk, 20, kLatH, kLatW});
  const at::Tensor cam = fixture_uniform(13, {2 * kChunk, 384, kLatH, kLatW});
  const LingbotSchedule sched = lingbot_schedule();
  const int64_t tpf = kLatH * kLatW / 4;
  LingbotNativeCache ca(c.local_attn_size, c.sink_size, kChunk, tpf), cb(c.local_attn_size, c.sink_size, kChunk, tpf);
  for (int ch = 0; ch < 2; ++ch) {
    const int64_t sf = ch * kChunk;
    LingbotNoise renoise = [&](int step, at::IntArrayRef shape) { return fixture_uniform(100 + 10 * ch + step, shape.vec()); };
    const LingbotChunkResult a = lingbot_generate_chunk(*resident, noise.narrow(0, sf, kChunk), cond.narrow(0, sf, kChunk),
                                                        cam.narrow(0, sf, kChunk), ta, sf, ca.context(), sched, renoise);
    const LingbotChunkResult b = lingbot_generate_chunk(*streamed, noise.narrow(0, sf, kChunk), cond.narrow(0, sf, kChunk),
                                                        cam.narrow(0, sf, kChunk), tb, sf, cb.context(), sched, renoise);
    EXPECT_TRUE(at::equal(a.latents, b.latents)) << "chunk " << ch;
    for (int l = 0; l < c.num_layers; ++l) {
      EXPECT_TRUE(at::equal(a.kv.main[l].k, b.kv.main[l].k)) << "chunk " << ch << " block " << l;
      EXPECT_TRUE(at::equal(a.kv.main[l].v, b.kv.main[l].v)) << "chunk " << ch << " block " << l;
    }
    ca.commit(a.kv);
    cb.commit(b.kv);
  }
}

// What a streamed model cannot read: a later block's wrong shape is refused when the model is
// loaded, naming the key; a block holding NaN when that block is first read, naming the key.
TEST(LingbotWeights, StreamedModelRefusesBadBlocks) {
  at::NoGradGuard ng;
  {
    ShardedCopy m;
    for (auto& kv : m.shard2)
      if (kv.first == "blocks.1.ffn.0.weight") kv.second = at::zeros({3, 3});
    m.write();
    try {
      load_lingbot_dit(m.dir.string(), at::kCPU, at::kFloat, true);
      ADD_FAILURE() << "a wrong shape in block 1 loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'blocks.1.ffn.0.weight'"), std::string::npos) << e.what();
    }
  }
  {
    ShardedCopy m;
    for (auto& kv : m.shard2)
      if (kv.first == "blocks.1.cross_attn.k.weight") kv.second = kv.second.clone().fill_(NAN);
    m.write();
    LingbotDit s = load_lingbot_dit(m.dir.string(), at::kCPU, at::kFloat, true);  // block 1 not read yet
    try {
      s->encode_text(fixture_uniform(3, {kTextTokens, s->config().text_dim}));
      ADD_FAILURE() << "a block holding NaN ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'blocks.1.cross_attn.k.weight'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
    }
  }
  LingbotDit bare(load_lingbot_config(fixture_dir() + "/config.json"), true);
  EXPECT_THROW(bare->encode_text(at::zeros({1, bare->config().text_dim})), Error);  // no source
}

TEST(LingbotConfig, ReadsTheHubFieldsAndNamesBadOnes) {
  auto err = [](const nlohmann::json& j) {
    try {
      lingbot_config_from_json(j, "c.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err({{"model_type", "s2v"}}).find("model_type"), std::string::npos);
  EXPECT_NE(err({{"dim", "wide"}}).find("dim"), std::string::npos);
  EXPECT_NE(err({{"control_type", "keys"}}).find("control_type"), std::string::npos);
  EXPECT_NE(err({{"local_attn_size", 4}, {"sink_size", 3}}).find("local_attn_size"), std::string::npos);
  const LingbotConfig full = lingbot_config_from_json({{"_class_name", "WanModelFast"},
                                                       {"model_type", "i2v"},
                                                       {"in_dim", 36},
                                                       {"dim", 5120},
                                                       {"ffn_dim", 13824},
                                                       {"num_heads", 40},
                                                       {"num_layers", 40}});
  EXPECT_EQ(full.head_dim(), 128);
  EXPECT_EQ(full.text_dim, 4096);
  EXPECT_EQ(full.text_len, 512);
  EXPECT_EQ(full.camera_patch_inputs(), 1536);
  const LingbotConfig back = lingbot_config_from_json(lingbot_config_to_json(full));
  EXPECT_EQ(back.dim, 5120);
  EXPECT_EQ(back.model_type, "i2v");
}

}  // namespace lingbot_test
}  // namespace wm::dit
