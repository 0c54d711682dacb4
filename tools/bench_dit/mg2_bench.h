#pragma once
// wm_bench_dit's Matrix-Game-2.0 modes.
//
// Timing (--mg2 MODE or --mg2-model DIR): one chunk as the sampler runs it in steady state, i.e.
// chunk 2 (latent frames 6..8) with the native window full of earlier frames (local_attn_size - 3
// latent frames: 3 for universal and templerun, 1 for gta_drive), per denoising step, the t = 0
// refresh pass and the whole chunk, in each dtype asked for. The context is synthetic: random
// K/V of the right shapes committed to a Mg2NativeCache (the refresh pass's own K/V are checked
// to have those shapes), since timings do not depend on its values.
//
// Check (--mg2-check DIR): one forward of chunk 0 at t = 1000 with the conformance fixtures'
// inputs against DIR/io.safetensors `flow`, made by the upstream code
// (tools/mg2_fixtures/make_dit_fixtures.py --full).
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dit/mg2_config.h"
#include "dit/mg2_model.h"

namespace wm::bench {

struct Mg2BenchOptions {
  std::string mode;       // universal | gta_drive | templerun: random weights of the release's shape
  std::string model_dir;  // instead of mode: a model folder (config.json + checkpoint)
  std::vector<at::ScalarType> dtypes;  // run in this order; kFloat and/or kBFloat16
  std::string device = "auto";
  int layers = 0;    // random weights only: keep the first `layers` blocks (0: all)
  int warmup = 1;    // untimed chunks per dtype before the measured ones
  int repeats = 1;   // measured chunks per dtype
  uint64_t seed = 0;
  std::string json_out;  // written whole (temporary name, rename) when not empty
};

struct Mg2CheckOptions {
  std::string dir;  // model.safetensors, config.json, io.safetensors (flow, keyboard_cond, ...), time.json
  std::vector<at::ScalarType> dtypes;
  std::string device = "auto";
  std::string json_out;
};

// The released config of a mode, as the hub's configs/distilled_model/<mode>/config.json holds it
// (dim 1536, 12 heads, ffn 8960, 30 blocks, action modules in blocks 0..14; local_attn_size 6, or 4
// for gta_drive; keyboard 4 / 2 / 7 inputs; templerun without the mouse branch).
// Throws wm::Error for another mode.
wm::dit::Mg2Config mg2_release_config(const std::string& mode);
// The same with only the first `layers` blocks (and the action modules among them); 0 keeps all.
wm::dit::Mg2Config mg2_release_config(const std::string& mode, int layers);

// Every parameter N(0, 0.02^2), except LayerNorm / RMSNorm weights 1 and LayerNorm biases 0, on
// the CPU from `seed`. Progress on stderr every 10 %, labelled.
void randomize_mg2(wm::dit::Mg2DitImpl& m, uint64_t seed, const std::string& label);

// "f32", "bf16", "both" (also float32, fp32, bfloat16) -> the dtypes, f32 first. Throws wm::Error.
std::vector<at::ScalarType> parse_mg2_dtypes(const std::string& s);

// Run the mode, print a table on stdout and progress on stderr; return the exit code (0).
// Throw wm::Error on bad options or files.
int run_mg2_bench(const Mg2BenchOptions& o);
int run_mg2_check(const Mg2CheckOptions& o);

}  // namespace wm::bench
