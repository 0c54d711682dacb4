// Matrix-Game-2.0's DiT against the upstream code: fixtures made by
// tools/mg2_fixtures/make_dit_fixtures.py (upstream CausalWanModel + ActionModule, reduced widths,
// the real 44x80 latent grid, random bf16 weights, fp32 compute, 3 chunks). Every DiT call's output,
// every chunk's clean latents, and the main, keyboard and mouse caches after each chunk must match
// within 1e-4 of their largest magnitude.
#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dit/mg2_sampler.h"
#include "dit/mg2_weights.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/dit/mg2_fixture.h"
#include "tests/temp_dir.h"

namespace wm::dit {
namespace {
namespace fs = std::filesystem;
using test::fixture_uniform;
using test::rel_max_diff;

constexpr double kTol = 1e-4;

std::string fixture_dir(const std::string& mode) {
  return std::string(WM_SOURCE_DIR) + "/tests/dit/fixtures/mg2/" + mode;
}

// [F, C, 44, 80] -> upstream's [1, C, F, 44, 80] at h % 4 == 0, w % 4 == 0.
at::Tensor sub4(const at::Tensor& x) {
  return x.permute({1, 0, 2, 3}).unsqueeze(0).slice(3, 0, x.size(2), 4).slice(4, 0, x.size(3), 4);
}

using Inputs = bench::FixtureInputs;
Inputs make_inputs() { return bench::fixture_inputs(); }

// Parameters: the mode, and the device (the CUDA runs skip where no GPU is visible; there
// cuDNN's TF32 convolutions are turned off, so that float32 means float32 as on the CPU).
class Mg2Conformance : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Mg2Conformance, EveryCallAndCacheMatchesUpstream) {
  at::NoGradGuard ng;
  const auto& [mode, device_name] = GetParam();
  const at::Device device(device_name);
  if (device.is_cuda()) {
    WM_REQUIRE_CUDA();
    at::globalContext().setAllowTF32CuDNN(false);
  }
  const std::string dir = fixture_dir(mode);
  Mg2Dit model = load_mg2_dit(dir + "/model.safetensors", device, at::kFloat);
  const Mg2Config& c = model->config();
  SafeTensors io = SafeTensors::open(dir + "/io.safetensors");
  EXPECT_TRUE(at::equal(io.get("check.uniform"), fixture_uniform(7, {16})));

  const Inputs in = make_inputs();
  Mg2Actions actions;
  actions.keyboard = io.get("keyboard_cond")[0];
  if (c.mouse_dim() > 0) actions.mouse = io.get("mouse_cond")[0];
  const Mg2Visual visual = model->encode_visual(in.clip);
  const Mg2Schedule sched = mg2_schedule(mg2_default_steps(c));
  Mg2NativeCache cache(c.local_attn_size - c.frames_per_chunk, c.tokens_per_frame());
  const int F = c.frames_per_chunk;
  double worst_flow = 0, worst_cache = 0;
  for (int ch = 0; ch < 3; ++ch) {
    const int sf = ch * F;
    // Upstream's noisy input is the chunk's share of one draw; its re-noising draws are
    // randn_like of [(b f), c, h, w], i.e. our layout.
    Mg2Noise renoise = [&](int step, at::IntArrayRef shape) {
      return fixture_uniform(100 + 10 * ch + step, shape.vec());
    };
    Mg2ChunkTrace trace;
    Mg2ChunkResult r = mg2_generate_chunk(*model, in.noise.narrow(0, sf, F), in.cond.narrow(0, sf, F), visual,
                                          actions, sf, cache.context(), sched, renoise, &trace);
    ASSERT_EQ(trace.flow.size(), sched.timesteps.size() + 1);
    for (size_t s = 0; s < trace.flow.size(); ++s) {
      const std::string p = "c" + std::to_string(ch) + ".s" + std::to_string(s);
      SCOPED_TRACE(p);
      EXPECT_TRUE(at::equal(trace.t[s].view({1, F}).cpu(), io.get(p + ".t"))) << trace.t[s] << io.get(p + ".t");
      EXPECT_LT(rel_max_diff(sub4(trace.x[s]), io.get(p + ".x_sub")), kTol);
      const double df = rel_max_diff(sub4(trace.flow[s]), io.get(p + ".flow_sub"));
      EXPECT_LT(df, kTol);
      worst_flow = std::max(worst_flow, df);
    }
    const std::string pc = "c" + std::to_string(ch);
    EXPECT_LT(rel_max_diff(sub4(r.latents), io.get(pc + ".x0_sub")), kTol);
    if (ch == 0) EXPECT_LT(rel_max_diff(r.latents.permute({1, 0, 2, 3}).unsqueeze(0), io.get("c0.x0")), kTol);

    cache.commit(r.kv);
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string pk = pc + ".kv" + std::to_string(l);
      SCOPED_TRACE(pk);
      at::Tensor end = io.get(pk + ".end");
      // Upstream's window [local_end - local_attn_size frames, local_end) holds the chunk and the
      // frames before it that stay; ours keeps those before and this chunk was just committed.
      const int64_t n_valid = end[1].item<int64_t>();
      at::Tensor k = cache.main()[l].k.transpose(0, 1).cpu(), v = cache.main()[l].v.transpose(0, 1).cpu();  // [n, H, d]
      const int64_t keep_tokens = std::min<int64_t>(n_valid, k.size(0) + 0);
      ASSERT_EQ(k.size(0), std::min<int64_t>(n_valid, int64_t(c.local_attn_size - F) * c.tokens_per_frame()))
          << "frames kept after the chunk";
      (void)keep_tokens;
      // Compare the kept frames with the tail of upstream's window (the frames before the next chunk).
      at::Tensor uk = io.get(pk + ".k_sub"), uv = io.get(pk + ".v_sub");
      // upstream subsamples its whole valid window [0, n_valid) every 29th token; ours is its tail.
      const int64_t off = n_valid - k.size(0);
      at::Tensor idx = at::arange(0, n_valid, 29, at::TensorOptions().dtype(at::kLong));
      at::Tensor in_tail = idx.ge(off);
      at::Tensor ours_k = k.index_select(0, idx.masked_select(in_tail) - off);
      at::Tensor ours_v = v.index_select(0, idx.masked_select(in_tail) - off);
      const double dk = rel_max_diff(ours_k, uk.index({in_tail}));
      const double dv = rel_max_diff(ours_v, uv.index({in_tail}));
      EXPECT_LT(dk, kTol);
      EXPECT_LT(dv, kTol);
      worst_cache = std::max({worst_cache, dk, dv});
    }
    for (size_t slot = 0; slot < model->action_blocks().size(); ++slot) {
      const int l = model->action_blocks()[slot];
      const std::string kb = pc + ".kb" + std::to_string(l);
      SCOPED_TRACE(kb);
      at::Tensor uk = io.get(kb + ".k"), uv = io.get(kb + ".v");  // [n, H, d], window incl. the chunk
      const int64_t have = cache.action().kb_k[slot].size(0);
      EXPECT_LT(rel_max_diff(cache.action().kb_k[slot], uk.narrow(0, uk.size(0) - have, have)), kTol);
      EXPECT_LT(rel_max_diff(cache.action().kb_v[slot], uv.narrow(0, uv.size(0) - have, have)), kTol);
      if (c.mouse_dim() > 0) {
        const std::string ms = pc + ".ms" + std::to_string(l);
        at::Tensor mk = io.get(ms + ".k_sub"), mv = io.get(ms + ".v_sub");  // [31, n, H, d]
        at::Tensor ok = cache.action().ms_k[slot].slice(0, 0, c.tokens_per_frame(), 29).cpu();
        at::Tensor ov = cache.action().ms_v[slot].slice(0, 0, c.tokens_per_frame(), 29).cpu();
        const int64_t hm = ok.size(1);
        const double dk = rel_max_diff(ok, mk.narrow(1, mk.size(1) - hm, hm));
        const double dv = rel_max_diff(ov, mv.narrow(1, mv.size(1) - hm, hm));
        EXPECT_LT(dk, kTol);
        EXPECT_LT(dv, kTol);
        worst_cache = std::max({worst_cache, dk, dv});
      }
    }
  }
  std::cout << "[ mg2 " << mode << " on " << device_name << " ] worst relative difference: DiT outputs " << worst_flow << ", caches "
            << worst_cache << "\n";
}

INSTANTIATE_TEST_SUITE_P(Modes, Mg2Conformance,
                         ::testing::Combine(::testing::Values("universal", "gta_drive", "templerun"),
                                            ::testing::Values("cpu", "cuda")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// bfloat16 as upstream runs the model (its float32 islands kept): the first call of a rollout
// stays within a few percent of upstream's float32 output.
class Mg2Precision : public ::testing::TestWithParam<std::string> {};

TEST_P(Mg2Precision, Bfloat16FirstCallIsCloseToUpstreamsFloat32) {
  at::NoGradGuard ng;
  const at::Device device(GetParam());
  if (device.is_cuda()) WM_REQUIRE_CUDA();
  const std::string dir = fixture_dir("universal");
  Mg2Dit model = load_mg2_dit(dir + "/model.safetensors", device, at::kBFloat16);
  ASSERT_EQ(model->dtype(), at::kBFloat16);
  SafeTensors io = SafeTensors::open(dir + "/io.safetensors");
  const Inputs in = make_inputs();
  Mg2Actions actions{io.get("keyboard_cond")[0], io.get("mouse_cond")[0]};
  const Mg2Visual visual = model->encode_visual(in.clip);
  const Mg2Schedule sched = mg2_schedule(mg2_default_steps(model->config()));
  at::Tensor flow = model->forward_chunk(in.noise.narrow(0, 0, 3), at::full({3}, sched.timesteps[0]),
                                         in.cond.narrow(0, 0, 3), visual, actions, 0, Mg2Context{});
  EXPECT_EQ(flow.scalar_type(), at::kFloat);  // the input's dtype
  const double d = rel_max_diff(sub4(flow), io.get("c0.s0.flow_sub"));
  std::cout << "[ mg2 bf16 on " << GetParam() << " ] first call against upstream's float32: relative difference " << d
            << "\n";
  EXPECT_LT(d, 5e-2);
  EXPECT_GT(d, 1e-5) << "bfloat16 cannot be this close: the model did not run in bfloat16";
}

INSTANTIATE_TEST_SUITE_P(Devices, Mg2Precision, ::testing::Values("cpu", "cuda"));

TEST(Mg2Schedule, WarpedStepsAreUpstreams) {
  Mg2Schedule s = mg2_schedule({1000, 666, 333});
  ASSERT_EQ(s.timesteps.size(), 3u);
  EXPECT_FLOAT_EQ(s.timesteps[0], 1000.0f);
  EXPECT_NEAR(s.timesteps[1], 908.8427, 1e-3);
  EXPECT_NEAR(s.timesteps[2], 713.9794, 1e-3);
  EXPECT_NEAR(s.sigmas[1], 0.9088427, 1e-6);
  Mg2Schedule t = mg2_schedule({1000, 750, 500, 250});
  EXPECT_NEAR(t.timesteps[1], 937.5, 1e-3);
  EXPECT_NEAR(t.timesteps[2], 833.3333, 1e-3);
  EXPECT_NEAR(t.timesteps[3], 625.0, 1e-3);
  EXPECT_THROW(mg2_schedule({333, 666}), Error);
  EXPECT_THROW(mg2_schedule({}), Error);
}

TEST(Mg2ActionWindow, LatentFrameReadsThe12VideoFramesBeforeIt) {
  Mg2ActionConfig a;
  at::Tensor w = mg2_action_window(a, 0, 3, 9);
  // Latent 0 reads [-12, 0) -> all frame 0; latent 2 reads [-4, 8) -> 0,0,0,0,0..7.
  EXPECT_TRUE(at::equal(w[0], at::zeros({12}, at::kLong)));
  EXPECT_EQ(w[2][4].item<int64_t>(), 0);
  EXPECT_EQ(w[2][11].item<int64_t>(), 7);
  at::Tensor w1 = mg2_action_window(a, 3, 3, 21);  // chunk 1: latents 3..5 read up to frame 19
  EXPECT_EQ(w1[0][0].item<int64_t>(), 0);
  EXPECT_EQ(w1[2][11].item<int64_t>(), 19);
  EXPECT_THROW(mg2_action_window(a, 3, 3, 19), Error);
}

// A scratch copy of a fixture model folder whose files a test may spoil.
struct ScratchModel {
  explicit ScratchModel(const std::string& mode) {
    dir = wm::testing::make_temp_dir("wm_mg2_" + mode + "_");
    fs::copy_file(fixture_dir(mode) + "/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
    fs::copy_file(fixture_dir(mode) + "/model.safetensors", dir / "model.safetensors",
                  fs::copy_options::overwrite_existing);
  }
  ~ScratchModel() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  nlohmann::json config() const {
    std::ifstream f(dir / "config.json");
    return nlohmann::json::parse(f);
  }
  void write_config(const nlohmann::json& j) const { std::ofstream(dir / "config.json") << j.dump(2); }
  // Rewrites the checkpoint through edit(name, tensor) -> keep?; tensors may be replaced in place.
  template <class Edit>
  void rewrite_weights(Edit edit, std::vector<std::pair<std::string, at::Tensor>> extra = {}) const {
    SafeTensors st = SafeTensors::open((dir / "model.safetensors").string());
    std::vector<std::pair<std::string, at::Tensor>> ts;
    for (const auto& n : st.names()) {
      at::Tensor t = st.get(n);
      std::string name = n;
      if (edit(name, t)) ts.emplace_back(name, t);
    }
    for (auto& e : extra) ts.push_back(e);
    save_safetensors((dir / "model.safetensors").string(), ts);
  }
  fs::path dir;
};

std::string load_error(const fs::path& dir) {
  try {
    load_mg2_dit(dir.string(), at::kCPU);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Mg2Weights, MissingUnexpectedAndMisShapedKeysAreNamed) {
  {
    ScratchModel m("universal");
    m.rewrite_weights([](std::string& n, at::Tensor&) { return n != "model.blocks.1.cross_attn.k.weight"; });
    const std::string e = load_error(m.dir);
    EXPECT_NE(e.find("model.blocks.1.cross_attn.k.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("missing"), std::string::npos) << e;
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  }
  {
    ScratchModel m("universal");
    m.rewrite_weights([](std::string& n, at::Tensor& t) {
      if (n == "model.head.modulation") t = at::zeros({1, 2, 64});
      return true;
    });
    const std::string e = load_error(m.dir);
    EXPECT_NE(e.find("model.head.modulation"), std::string::npos) << e;
    EXPECT_NE(e.find("[1, 2, 64]"), std::string::npos) << e;
  }
  {
    ScratchModel m("universal");
    m.rewrite_weights([](std::string&, at::Tensor&) { return true; },
                      {{"model.head.head.extra", at::zeros({3})}});
    const std::string e = load_error(m.dir);
    EXPECT_NE(e.find("model.head.head.extra"), std::string::npos) << e;
  }
}

TEST(Mg2Weights, ConfigThatContradictsTheCheckpointIsRefusedWithBothValues) {
  ScratchModel m("universal");
  nlohmann::json j = m.config();
  j["num_layers"] = 6;
  m.write_config(j);
  std::string e = load_error(m.dir);
  EXPECT_NE(e.find("num_layers is 6"), std::string::npos) << e;
  EXPECT_NE(e.find("4 blocks"), std::string::npos) << e;

  j = m.config();
  j["num_layers"] = 4;
  j["action_config"]["keyboard_dim_in"] = 2;
  m.write_config(j);
  e = load_error(m.dir);
  EXPECT_NE(e.find("keyboard_dim_in is 2"), std::string::npos) << e;
  EXPECT_NE(e.find("4 inputs"), std::string::npos) << e;

  j = m.config();
  j["action_config"]["keyboard_dim_in"] = 4;
  j["action_config"]["blocks"] = {0, 1, 2};
  m.write_config(j);
  e = load_error(m.dir);
  EXPECT_NE(e.find("[0, 1, 2]"), std::string::npos) << e;
  EXPECT_NE(e.find("[0, 1]"), std::string::npos) << e;

  j = m.config();
  j["action_config"]["blocks"] = {0, 1};
  j["dim"] = 256;
  j["action_config"]["img_hidden_size"] = 256;
  m.write_config(j);
  e = load_error(m.dir);
  EXPECT_NE(e.find("dim is 256"), std::string::npos) << e;
}

TEST(Mg2Config, BadFieldsAreNamed) {
  auto err = [](const nlohmann::json& j) {
    try {
      mg2_config_from_json(j, "c.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err({{"model_type", "t2v"}}).find("model_type"), std::string::npos);
  EXPECT_NE(err({{"dim", "wide"}}).find("dim"), std::string::npos);
  EXPECT_NE(err({{"local_attn_size", -1}}).find("local_attn_size"), std::string::npos);
  EXPECT_NE(err({{"sink_size", 1}}).find("sink_size"), std::string::npos);
  EXPECT_NE(err({{"action_config", {{"blocks", {0, 40}}}}}).find("block 40"), std::string::npos);
  EXPECT_EQ(err({{"dim", 1536}}), "");
  Mg2Config real = mg2_config_from_json(nlohmann::json::object());
  EXPECT_EQ(real.head_dim(), 128);
  EXPECT_EQ(real.tokens_per_frame(), 880);
}

}  // namespace
}  // namespace wm::dit
