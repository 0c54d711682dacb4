#pragma once
// wm_bench_dit's LingBot-World-Fast modes.
//
// Timing (--lingbot SIZE): one chunk as the Fast sampler runs it in steady state: 3 latent frames
// attending to a full window of `window_frames` earlier frames (WorldKV's 15: sink 3, retrieved
// 9, recent 3), the 4 denoising steps and the clean t = 0 pass, each timed, and the memory: the
// weights, the window's K/V, the K/V a latent frame adds, the process's peak resident set. The
// window is synthetic (random K/V of the clean pass's shapes, which the program checks), since
// timings do not depend on its values. At the release's size (dim 5120, 40 blocks: 73 GB of
// float32 weights) keep the first blocks with --layers; the blocks are alike, so a chunk's time
// grows by the same amount per block.
//
// From disk (--lingbot-disk DIR): the same chunk with the DiT of DIR (a hub folder's
// lingbot_world_fast/) streamed: one block held in memory, each block read from the shards (and
// converted to the dtype) before it runs, so a call reads every block; the text K/V pass is timed
// as every block's read. weights_GB is then the resident part and one block; anon_GB the process's
// anonymous memory (without the page cache's copy of the shards). With kv_files the window's K/V
// (19 GB for the release's 40 blocks in bfloat16) are kept in files as wm_render --kv-files keeps
// them, so the whole model's chunk runs in this machine's memory.
//
// Check (--lingbot-check DIR): one forward of the full-width single-block model that
// tools/lingbot_fixtures/make_full_block_check.py wrote (upstream's WanModelFast at dim 5120 with
// one block, chunk 0 of a 480 x 832 grid at t = 999) against upstream's output, and both times.
//
// Hub folder (--lingbot-hub DIR): random weights of SIZE written as the hub lays them out
// (DIR/lingbot_world_fast/: config.json, diffusion_pytorch_model shards + index) beside a random
// Wan VAE (DIR/Wan2.1_VAE.safetensors, base width --vae-dim) and a random umT5 encoder as wide as
// the DiT's text_dim (DIR/models_t5_umt5-xxl-enc-bf16.safetensors), and, given --umt5-spiece, that
// SentencePiece model as the tokenizer (DIR/google/umt5-xxl/spiece.model): the folder wm_render
// runs end to end, with --prompt when the tokenizer is there.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dit/lingbot_config.h"
#include "dit/lingbot_model.h"
#include "dit/umt5.h"

namespace wm::bench {

struct LingbotBenchOptions {
  std::string size;                    // "14b", "tiny" or a config.json
  std::vector<at::ScalarType> dtypes;  // run in this order
  std::string device = "auto";
  int layers = 0;                      // keep the first N blocks (0: all)
  std::string from_dir;                // instead of random weights of `size`: this DiT folder, read a block at a time
  int64_t latent_height = 60, latent_width = 104;  // 480 x 832
  int window_frames = 15;
  std::string kv_files;                // the synthetic window's K/V in unnamed files in this folder
                                       // (runtime/mapped_storage.h), not in memory; empty: memory
  int warmup = 0, repeats = 1;
  uint64_t seed = 0;
};

struct LingbotHubOptions {
  std::string size, dir;
  int layers = 0;
  int vae_dim = 96;
  double shard_mib = 5120;
  std::string dtype = "bf16";  // of the written DiT (the hub's is bfloat16)
  std::string spiece;          // a SentencePiece model to copy in as the umT5 tokenizer (empty: none)
  uint64_t seed = 0;
};

// The random umT5 encoder of a hub folder: umT5-XXL's shape (24 blocks, or `layers` when > 0) when
// text_dim is its 4096, else 2 heads, 2 blocks, FFN 2 x text_dim; `vocab` rows (0: 256384 for
// umT5-XXL's shape, 512 otherwise).
wm::dit::Umt5Config lingbot_hub_umt5_config(const wm::dit::LingbotConfig& c, int layers, int64_t vocab);

// The config SIZE names: "14b" (the release: i2v, camera control, dim 5120, 40 heads, FFN 13824,
// 40 blocks, text_dim 4096, text_len 512; upstream's full cache, no sink), "tiny" (the same
// modules at dim 32, 2 heads, FFN 64, 2 blocks, text_dim 32, text_len 16, a rolling cache of 9
// frames with a sink of 3: for tests), or a config.json. `layers` > 0 keeps the first blocks.
wm::dit::LingbotConfig lingbot_bench_config(const std::string& size, int layers);

// Every parameter N(0, 0.02^2), except LayerNorm / RMSNorm weights 1 and their biases 0, from `seed`.
void randomize_lingbot(wm::dit::LingbotDitImpl& m, uint64_t seed);

// The DiT of config c with randomize_lingbot's weights (seed), in dtype dt, saved into dir as
// save_lingbot_dit lays it out (shards of at most shard_bytes), one block made at a time: a
// model of one block is randomized once per block in the order randomize_lingbot visits the
// whole model's tensors, so the files equal those of the whole model randomized and saved, and a
// model larger than memory (the release's 40 blocks: 74 GB in float32) can be written. Returns
// the bytes written.
double write_random_lingbot(const wm::dit::LingbotConfig& c, uint64_t seed, at::ScalarType dt, const std::string& dir,
                            int64_t shard_bytes);

// Run the mode, print a table on stdout and progress on stderr; return the exit code (0).
int run_lingbot_bench(const LingbotBenchOptions& o);
int run_lingbot_hub(const LingbotHubOptions& o);
int run_lingbot_check(const std::string& dir, const std::string& device);

}  // namespace wm::bench
