// The umT5 text encoder against the upstream code: fixtures made by
// tools/lingbot_fixtures/make_t5_fixtures.py (upstream's T5Encoder from umt5_xxl(encoder_only=True)
// of Robbyant/lingbot-world 91ff5f6 at reduced widths: dim 64, 4 heads, 3 blocks each with its own
// relative position bias, 32 buckets; random bf16 weights, float32 compute). Outputs must match
// within 1e-4 of their largest magnitude; the bucket table exactly.
#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "dit/umt5.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/temp_dir.h"

namespace wm::dit {
namespace umt5_test {
namespace fs = std::filesystem;

constexpr double kTol = 1e-4;

std::string fixture(const std::string& name) { return std::string(WM_SOURCE_DIR) + "/tests/dit/fixtures/lingbot/" + name; }
SafeTensors io() { return SafeTensors::open(fixture("umt5_io.safetensors")); }
Umt5Encoder encoder(at::ScalarType dtype = at::kFloat) {
  return load_umt5_encoder(fixture("umt5_encoder.safetensors"), at::kCPU, dtype);
}
double rel(const at::Tensor& a, const at::Tensor& b) { return test::rel_diff(a, b); }

// A copy of the fixture's weights with `edit` applied, written as `name` in the scratch folder `dir`.
std::string edited_checkpoint(const fs::path& dir, const std::string& name,
                              const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& edit) {
  const SafeTensors st = SafeTensors::open(fixture("umt5_encoder.safetensors"));
  std::vector<std::pair<std::string, at::Tensor>> t;
  for (const auto& n : st.names()) t.emplace_back(n, st.get(n));
  edit(t);
  const std::string path = (dir / name).string();
  save_safetensors(path, t);
  return path;
}

TEST(Umt5Encoder, ConfigReadFromTheCheckpoint) {
  const Umt5Config c = umt5_config_from_checkpoint(fixture("umt5_encoder.safetensors"));
  EXPECT_EQ(c.vocab, 256);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.dim_attn, 64);
  EXPECT_EQ(c.dim_ffn, 128);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.num_buckets, 32);
  const Umt5Config x = umt5_xxl_config();  // upstream's umt5_xxl()
  EXPECT_EQ(std::vector<int64_t>({x.vocab, x.dim, x.dim_attn, x.dim_ffn, x.num_heads, x.num_layers, x.num_buckets}),
            std::vector<int64_t>({256384, 4096, 4096, 10240, 64, 24, 32}));
}

TEST(Umt5Encoder, BucketsEqualUpstreams) {
  const SafeTensors f = io();
  const at::Tensor b = umt5_relative_position_bucket(f.get("buckets.rel"), 32, true, 128);
  EXPECT_TRUE(at::equal(b, f.get("buckets.bidirectional")));
  // -300..300 reaches every bucket but 16 (k > q starts at distance 1): 0-7 exact, 8-15
  // logarithmic, 15 clamped past 128, 17-31 the same for k > q.
  EXPECT_EQ(std::get<0>(at::_unique(b)).numel(), 31);
}

TEST(Umt5Encoder, PerLayerBiasEqualsUpstreams) {
  const SafeTensors f = io();
  Umt5Encoder enc = encoder();
  at::NoGradGuard ng;
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor ref = f.get("bias" + std::to_string(i));
    const at::Tensor ours = enc->blocks[i]->as<Umt5Block>()->pos_embedding->forward(20, 20)[0];
    EXPECT_TRUE(at::equal(ours, ref)) << "block " << i;
    if (i > 0) EXPECT_GT(rel(ref, f.get("bias0")), 0.5) << "the fixture's blocks must hold different biases";
  }
}

TEST(Umt5Encoder, PaddedBatchMatchesUpstream) {
  const SafeTensors f = io();
  Umt5Encoder enc = encoder();
  at::NoGradGuard ng;
  const at::Tensor ids = f.get("batch.ids"), mask = f.get("batch.mask");
  const double d = rel(enc->forward(ids, mask), f.get("batch.out"));
  std::cout << "[umt5] padded batch [4, 24] (lengths 24/17/5/1, masked) rel diff " << d << "\n";
  EXPECT_LT(d, kTol);
  // Block by block, sequence 1 (17 real tokens of 24).
  at::Tensor x = enc->token_embedding->forward(ids);
  for (int64_t i = 0; i < 3; ++i) {
    x = enc->blocks[i]->as<Umt5Block>()->forward(x, mask);
    EXPECT_LT(rel(x[1], f.get("batch.block" + std::to_string(i))), kTol) << "block " << i;
  }
}

TEST(Umt5Encoder, LongSequenceMatchesUpstream) {
  const SafeTensors f = io();
  Umt5Encoder enc = encoder();
  at::NoGradGuard ng;
  const double d = rel(enc->forward(f.get("long.ids")), f.get("long.out"));
  std::cout << "[umt5] 160 tokens (relative distances past max_dist 128) rel diff " << d << "\n";
  EXPECT_LT(d, kTol);
}

TEST(Umt5Encoder, ContextIsThePipelinesZeroPaddedOutput) {
  const SafeTensors f = io();
  Umt5Encoder enc = encoder();
  const at::Tensor ids = f.get("batch.ids"), mask = f.get("batch.mask");
  const at::Tensor ctx = umt5_context(*enc, ids, mask);
  const at::Tensor ref = f.get("batch.context");
  const double d = rel(ctx, ref);
  std::cout << "[umt5] context (each sequence at its own length, zero-padded) rel diff " << d << "\n";
  EXPECT_LT(d, kTol);
  EXPECT_TRUE(at::equal(ctx.masked_select(mask.eq(0).unsqueeze(-1)), ref.masked_select(mask.eq(0).unsqueeze(-1))));
  at::Tensor gap = at::ones_like(mask);
  gap[0][0].fill_(0);
  EXPECT_THROW(umt5_context(*enc, ids, gap), Error);
}

// The fixtures catch a wrong bucketing and a bias shared across blocks: either changes the output
// by far more than the tolerance.
TEST(Umt5Encoder, WrongBucketsOrSharedBiasWouldFail) {
  const fs::path dir = wm::testing::make_temp_dir("wm_umt5_test_");
  const SafeTensors f = io();
  at::NoGradGuard ng;
  {
    Umt5Encoder enc = encoder();
    for (int64_t i = 0; i < 3; ++i) enc->blocks[i]->as<Umt5Block>()->pos_embedding->max_dist = 64;
    const double d = rel(enc->forward(f.get("long.ids")), f.get("long.out"));
    EXPECT_GT(d, 100 * kTol) << "max_dist 64 instead of 128";
  }
  {
    const std::string p = edited_checkpoint(dir, "shared.safetensors", [](auto& t) {
      at::Tensor b0;
      for (auto& [n, v] : t)
        if (n == "blocks.0.pos_embedding.embedding.weight") b0 = v;
      for (auto& [n, v] : t)
        if (n.find("pos_embedding") != std::string::npos) v = b0;
    });
    Umt5Encoder enc = load_umt5_encoder(p);
    const double d = rel(enc->forward(f.get("long.ids")), f.get("long.out"));
    EXPECT_GT(d, 100 * kTol) << "block 0's bias in every block";
  }
  const at::Tensor rel_pos = f.get("buckets.rel");
  EXPECT_FALSE(at::equal(umt5_relative_position_bucket(rel_pos, 32, false, 128), f.get("buckets.bidirectional")));
  EXPECT_FALSE(at::equal(umt5_relative_position_bucket(-rel_pos, 32, true, 128), f.get("buckets.bidirectional")));
  fs::remove_all(dir);
}

TEST(Umt5Encoder, Bfloat16RunNearUpstreams) {
  const SafeTensors f = io();
  Umt5Encoder enc = encoder(at::kBFloat16);
  at::NoGradGuard ng;
  const at::Tensor out = enc->forward(f.get("batch.ids"), f.get("batch.mask")).to(at::kFloat);
  const double d_up = rel(out, f.get("batch.out_bf16"));
  const double d_f32 = rel(f.get("batch.out_bf16"), f.get("batch.out"));
  std::cout << "[umt5] bfloat16: ours vs upstream's bf16 run " << d_up << " (upstream bf16 vs its fp32 " << d_f32
            << ")\n";
  EXPECT_LT(d_up, 0.05);
}

TEST(Umt5Encoder, TorchSaveBf16CheckpointLoads) {
  // A state dict saved by torch.save in bfloat16, as models_t5_umt5-xxl-enc-bf16.pth.
  const SafeTensors f = io();
  Umt5Encoder enc = load_umt5_encoder(fixture("umt5_tiny_enc_bf16.pth"));
  EXPECT_EQ(enc->config.dim, 16);
  EXPECT_EQ(enc->config.num_layers, 2);
  EXPECT_EQ(enc->config.num_heads, 2);
  EXPECT_EQ(enc->config.dim_ffn, 40);
  at::NoGradGuard ng;
  const double d = rel(enc->forward(f.get("tiny.ids")), f.get("tiny.out"));
  std::cout << "[umt5] .pth (torch.save, bf16) encoder rel diff " << d << "\n";
  EXPECT_LT(d, kTol);
}

TEST(Umt5Encoder, BadCheckpointsNameFileAndKey) {
  const fs::path dir = wm::testing::make_temp_dir("wm_umt5_test_");
  auto expect_error = [](const std::string& path, const std::vector<std::string>& words) {
    try {
      load_umt5_encoder(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  };
  const std::string missing = edited_checkpoint(dir, "missing.safetensors", [](auto& t) {
    t.erase(std::remove_if(t.begin(), t.end(), [](const auto& p) { return p.first == "blocks.1.ffn.fc2.weight"; }),
            t.end());
  });
  expect_error(missing, {"missing.safetensors", "blocks.1.ffn.fc2.weight"});
  const std::string shape = edited_checkpoint(dir, "shape.safetensors", [](auto& t) {
    for (auto& [n, v] : t)
      if (n == "blocks.2.attn.o.weight") v = v.narrow(1, 0, 32).contiguous();
  });
  expect_error(shape, {"shape.safetensors", "blocks.2.attn.o.weight", "[64, 32]"});
  const std::string extra = edited_checkpoint(dir, "extra.safetensors", [](auto& t) {
    t.emplace_back("blocks.0.attn.q.bias", at::zeros({64}, at::kBFloat16));
  });
  expect_error(extra, {"extra.safetensors", "blocks.0.attn.q.bias"});
  const std::string shared = edited_checkpoint(dir, "shared_t5.safetensors", [](auto& t) {
    t.emplace_back("pos_embedding.embedding.weight", at::zeros({32, 4}, at::kBFloat16));
  });
  expect_error(shared, {"shared_t5.safetensors", "pos_embedding.embedding.weight"});
  fs::remove_all(dir);
}

}  // namespace umt5_test
}  // namespace wm::dit
