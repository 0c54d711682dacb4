// The KV core on a CUDA device against the same operations on the CPU, which is the reference:
// attention (fused SDPA on libtorch 2.x), RoPE and re-anchoring, the window's in-place appends,
// placements, gathers and compaction, the bank's device -> pinned host -> disk tiers and the
// layer-wise loader's copies to the device. Every test here skips, with its reason, where no
// CUDA device is visible (CI, a CPU-only libtorch).
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/attention.h"
#include "runtime/block_store.h"
#include "runtime/layer_loader.h"
#include "runtime/rope.h"
#include "runtime/window.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/runtime/test_util.h"
#include "tests/temp_dir.h"

namespace wm {
namespace {
namespace fs = std::filesystem;
using test::bit_equal;
using test::blocks_bit_equal;
using test::rel_diff;

KvSpec spec_on(at::Device d, int layers = 2) {
  KvSpec s;
  s.n_layers = layers;
  s.n_kv_heads = 2;
  s.head_dim = 12;
  s.device = d;
  s.rope = RopeSpec::video3d(12);
  return s;
}

// Every mask kind, with window log-weights and GQA (8 query heads over 2 kv heads), float32 on
// the GPU within 1e-5 of the CPU (no TF32: cuBLAS's default for float32 matrices), bfloat16
// within 2e-2 of the CPU's float32.
TEST(CudaAttention, EveryMaskKindMatchesTheCpu) {
  WM_REQUIRE_CUDA();
  at::NoGradGuard ng;
  const at::Device gpu(at::kCUDA, 0);
  const int64_t H = 8, KH = 2, d = 64, nw = 300, nq = 48;
  at::manual_seed(3);
  at::Tensor q = at::randn({H, nq, d}), k = at::randn({KH, nw + nq, d}), v = at::randn({KH, nw + nq, d});
  at::Tensor logw = at::rand({nw + nq}).log_();
  for (AttentionMask::Kind kind : {AttentionMask::None, AttentionMask::Causal, AttentionMask::BlockCausal}) {
    SCOPED_TRACE(int(kind));
    AttentionOptions o;
    o.mask.kind = kind;
    o.mask.block = 16;
    o.n_window = nw;
    const at::Tensor ref = attention(q, k, v, logw, o).out;
    const at::Tensor got = attention(q.to(gpu), k.to(gpu), v.to(gpu), logw.to(gpu), o).out;
    ASSERT_TRUE(got.is_cuda());
    EXPECT_LT(rel_diff(got, ref), 1e-5);
    const at::Tensor half = attention(q.to(gpu, at::kBFloat16), k.to(gpu, at::kBFloat16),
                                      v.to(gpu, at::kBFloat16), logw.to(gpu), o).out;
    EXPECT_EQ(half.scalar_type(), at::kBFloat16);
    EXPECT_LT(rel_diff(half, ref), 2e-2);
    // The attention mass each key received (the unfused path) agrees too.
    AttentionOptions m = o;
    m.capture_mass = true;
    const at::Tensor mass_ref = attention(q, k, v, logw, m).key_mass;
    const at::Tensor mass = attention(q.to(gpu), k.to(gpu), v.to(gpu), logw.to(gpu), m).key_mass;
    EXPECT_LT(rel_diff(mass, mass_ref), 1e-5);
  }
}

// RoPE and re-anchoring are computed in float64 angles: the GPU agrees with the CPU to rounding.
TEST(CudaRope, ApplyAndReanchorMatchTheCpu) {
  WM_REQUIRE_CUDA();
  const at::Device gpu(at::kCUDA, 0);
  const RopeSpec spec = RopeSpec::video3d(48);
  at::Tensor x = at::randn({4, 200, 48});
  at::Tensor pos = at::randint(0, 150000, {200, 3}, at::kLong);
  const at::Tensor ref = apply_rope(x, pos, spec);
  EXPECT_LT(rel_diff(apply_rope(x.to(gpu), pos.to(gpu), spec), ref), 1e-6);
  EXPECT_LT(rel_diff(reanchor(ref.to(gpu), spec, 0, -1234), reanchor(ref, spec, 0, -1234)), 1e-6);
}

// One sequence of window operations on a CPU window and a GPU window: appends, placements (one
// re-anchored), a token gather, a drop with compaction, an extract; copies are bit-exact, the
// re-anchored keys agree to rounding, positions stay on the CPU.
TEST(CudaWindow, InPlaceOperationsMatchTheCpuWindow) {
  WM_REQUIRE_CUDA();
  const at::Device gpu(at::kCUDA, 0);
  KvWindow cpu(spec_on(at::kCPU), {"sink", "retrieved", "recent"});
  KvWindow dev(spec_on(gpu), {"sink", "retrieved", "recent"});
  std::vector<Block> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(test::random_block("b" + std::to_string(i), 2, 2, 9 + i, 12, at::kFloat, 3));
  for (KvWindow* w : {&cpu, &dev}) {
    for (int l = 0; l < 2; ++l)
      w->append("sink", "s", l, blocks[0].layers[l].k, blocks[0].layers[l].v, blocks[0].layers[l].pos,
                blocks[0].layers[l].logw);
    w->place("recent", blocks[1]);
    w->place("retrieved", blocks[2], Reanchor{0, 77});
    w->place("recent", blocks[3]);
    w->keep_tokens(1, {0, 2, 3, 5, 8, 9, 10, 20, 30});
    w->drop("b1");
  }
  for (int l = 0; l < 2; ++l) {
    SCOPED_TRACE(l);
    ASSERT_EQ(cpu.size(l), dev.size(l));
    EXPECT_TRUE(dev.k(l).is_cuda());
    EXPECT_TRUE(dev.pos(l).device().is_cpu());
    EXPECT_LT(rel_diff(dev.k(l), cpu.k(l)), 1e-6);  // the re-anchored block's keys: rounding
    EXPECT_TRUE(bit_equal(dev.v(l), cpu.v(l)));
    EXPECT_TRUE(bit_equal(dev.logw(l), cpu.logw(l)));
    EXPECT_TRUE(bit_equal(dev.pos(l), cpu.pos(l)));
  }
  const Block a = cpu.extract("b3"), b = dev.extract("b3");
  EXPECT_TRUE(b.layers[0].k.is_cuda());
  EXPECT_TRUE(blocks_bit_equal(a, b));
}

// The bank with its device tier on the GPU: blocks put there are demoted, least recently used
// first, to pinned host memory and then to spill files; every one comes back to the GPU bit for
// bit, from whichever tier.
TEST(CudaBlockStore, DeviceHostDiskTiersRoundTripBitExact) {
  WM_REQUIRE_CUDA();
  const at::Device gpu(at::kCUDA, 0);
  const fs::path root = wm::testing::make_temp_dir("wm_cuda_store_");
  const fs::path dir = root / "spill";  // made by the store
  std::vector<Block> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(test::random_block("c" + std::to_string(i), 3, 2, 16, 12, at::kBFloat16, 3));
  const size_t one = blocks[0].nbytes();
  {
    StoreConfig cfg;
    cfg.device = gpu;
    cfg.device_budget = 2 * one;
    cfg.host_budget = 2 * one;
    cfg.spill_dir = dir.string();
    BlockStore store(cfg);
    for (const Block& b : blocks) store.put(b.to(gpu));
    EXPECT_EQ(store.count(Tier::Device), 2u);
    EXPECT_EQ(store.count(Tier::Host), 2u);
    EXPECT_EQ(store.count(Tier::Disk), 2u);
    EXPECT_EQ(store.tier_of("c0"), Tier::Disk);
    EXPECT_EQ(store.tier_of("c2"), Tier::Host);
    const Block host = store.get_host("c2");
    EXPECT_TRUE(host.layers[0].k.device().is_cpu());
    EXPECT_TRUE(host.layers[0].k.is_pinned()) << "host tier of a GPU store is pinned";
    for (const Block& b : blocks) {
      SCOPED_TRACE(b.id);
      const Block got = store.get(b.id);
      EXPECT_TRUE(got.layers[0].k.is_cuda());
      EXPECT_TRUE(blocks_bit_equal(got, b));
    }
  }
  EXPECT_TRUE(!fs::exists(dir) || fs::is_empty(dir)) << "spill files left behind";
  fs::remove_all(root);
}

// The layer-wise loader hands over blocks on the GPU, from host and disk tiers, in queue order.
TEST(CudaLayerLoader, DeliversHostAndDiskBlocksOnTheGpu) {
  WM_REQUIRE_CUDA();
  const at::Device gpu(at::kCUDA, 0);
  const fs::path root = wm::testing::make_temp_dir("wm_cuda_loader_");
  const fs::path dir = root / "spill";  // made by the store
  std::vector<Block> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(test::random_block("k" + std::to_string(i), 1, 2, 32, 12, at::kFloat, 1));
  StoreConfig cfg;
  cfg.device = gpu;
  cfg.device_budget = 0;
  cfg.host_budget = 2 * blocks[0].nbytes();
  cfg.spill_dir = dir.string();
  {
    BlockStore store(cfg);
    for (const Block& b : blocks) store.put(b, Tier::Host);
    LayerQueueLoader loader(store, 2, gpu, 1);
    loader.enqueue(0, {"k0", "k3"});
    loader.enqueue(1, {"k1", "k2"});
    for (int l = 0; l < 2; ++l) {
      LayerQueueLoader::Loaded got = loader.wait(l);
      ASSERT_EQ(got.blocks.size(), 2u);
      for (size_t i = 0; i < 2; ++i) {
        ASSERT_FALSE(got.errors[i]);
        EXPECT_TRUE(got.blocks[i].layers[0].k.is_cuda());
        const int which = std::stoi(got.ids[i].substr(1));
        EXPECT_TRUE(blocks_bit_equal(got.blocks[i], blocks[which])) << got.ids[i];
      }
    }
    EXPECT_EQ(loader.finish().blocks, 4);
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace wm
