// wm_viewer: the interactive SDL2 viewer of the world model (see viewer/app.h).
#define SDL_MAIN_HANDLED
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "runtime/error.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"
#include "tools/cli/validators.h"
#include "tools/rollout/lingbot_start.h"
#include "viewer/app.h"
#include "viewer/mg2_view.h"
#include "viewer/tiny_view.h"

namespace {

// The options of the model kinds beside the tiny model: Matrix-Game-2.0's and LingBot-World-Fast's.
void add_model_options(CLI::App& app, wm::viewer::ViewerOptions& o) {
  auto* mg2 = app.add_option_group("Matrix-Game-2.0", "when --model names a Matrix-Game-2.0 model (or --mode is given)");
  mg2->add_option("--mode", o.mode, "universal, gta_drive or templerun (checked against the model's config.json)")
      ->check(CLI::IsMember({"universal", "gta_drive", "templerun"}));
  auto* image = mg2->add_option("--image", o.image, "the first frame (PNG or JPEG), encoded with the VAE (and CLIP for Matrix-Game-2.0)")
                    ->check(CLI::ExistingFile);
  mg2->add_option("--latents", o.latents,
                  "instead of --image: safetensors with image_latents [N,16,44,80] and clip_tokens [257,1280]")
      ->check(CLI::ExistingFile)
      ->excludes(image);
  mg2->add_option("--vae", o.vae,
                  "Wan2.1_VAE.pth or .safetensors (default: Wan2.1_VAE.pth beside the model folder, as the hub lays "
                  "it out)");
  mg2->add_option("--clip", o.clip,
                  "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth for --image (default: beside the model folder)");
  mg2->add_option("--dtype", o.dtype, "the DiT's precision: f32 or bf16")
      ->capture_default_str()->check(CLI::IsMember({"f32", "bf16"}));
  mg2->add_option("--cond-latents", o.cond_latents,
                  "latent frames of the image condition to encode (later chunks reuse the last)")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  auto* lingbot = app.add_option_group("LingBot-World-Fast",
                                       "when --model names a LingBot-World-Fast folder (also --image, --vae, --dtype, "
                                       "--cond-latents above)");
  CLI::Option* file = lingbot->add_option("--text-context", o.text_context,
                                          "safetensors with `context` [L, 4096], umT5's output for the prompt "
                                          "(without it or --prompt: zero rows)")
                          ->check(CLI::ExistingFile);
  lingbot->add_option("--prompt", o.prompt,
                      "the prompt, through the umT5 encoder and tokenizer beside the model folder "
                      "(models_t5_umt5-xxl-enc-bf16.pth, google/umt5-xxl/), once at the start, in --dtype")
      ->excludes(file);
  lingbot->add_option("--size", o.size, "the video's largest area, as upstream's --size")->capture_default_str();
}

// Each kind's defaults where the tiny model's differ (options the command line did not give).
void apply_model_defaults(const CLI::App& app, wm::viewer::ViewerOptions& o) {
  // LingBot-World-Fast's: upstream's 16 fps (the tiny model's too), frames recorded at their
  // size, the GPU when there is one; the world memory (worldkv) as the tiny model.
  if (wm::rollout::is_lingbot_folder(o.model_path)) {
    if (app.count("--record-upscale") == 0) o.record_upscale = 1;
    if (app.count("--device") == 0) o.device = "auto";
  } else if (wm::viewer::is_mg2_model(o.model_path, o.mode)) {
    // Matrix-Game-2.0's defaults where the tiny model's differ: upstream's own window, its 12 fps,
    // frames recorded at their size, the GPU when there is one.
    if (app.count("--policy") == 0) o.policy = "native";
    if (app.count("--fps") == 0) o.fps = 12;
    if (app.count("--record-upscale") == 0) o.record_upscale = 1;
    if (app.count("--device") == 0) o.device = "auto";
  }
}

}  // namespace

int main(int argc, char** argv) {
  wm::viewer::ViewerOptions o;
  std::string script_file, inject;
  CLI::App app{"wm_viewer: play the world model live (WASD + mouse), with its KV memory on screen"};
  wm::viewer::ViewerOptions universal;
  universal.mode = "universal";
  app.footer(std::string("\nKeys (the tiny model):\n") + wm::viewer::help_text(wm::viewer::TinyView(o)) +
             "\n\nMatrix-Game-2.0 keys (universal; gta_drive and templerun in viewer/README.md):\n" +
             wm::viewer::help_text(wm::viewer::Mg2View(universal)) +
             "\n\nScripts (--inject / --script): commands separated by ';' or newlines:\n"
             "  down KEY | up KEY | press KEY | hold KEY DUR | mouse DX [DY] | click [left|middle|right]\n"
             "  wait DUR | screenshot PATH | quit        DUR: 500ms, 2s, 3c (chunks), 12f (frames)\n"
             "  e.g. --inject \"hold W 4c; mouse 200 0; wait 3c\"");
  app.add_option("--model", o.model_path,
                 "model safetensors (default: the embedded assets/models/tiny/model.safetensors), a Matrix-Game-2.0 "
                 "folder (config.json + .safetensors) or its .safetensors, or a LingBot-World-Fast folder");
  app.add_option("--seed", o.seed, "scene and noise seed")->capture_default_str();
  app.add_option("--policy", o.policy,
                 "memory policy: full_kv, sliding_window, sink_recent, worldkv, worldkv_c, worldkv_attn; Matrix-Game-2.0 "
                 "also native (upstream's rolling window, its default)")
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads for the model (0: all cores but one, which the window keeps)")
      ->capture_default_str()->check(CLI::Range(0, 1024));
  app.add_option("--scale", o.scale, "on-screen upscale of the frames (0: fit the window)")->check(CLI::Range(0, 64));
  app.add_option("--width", o.width, "window width (default 1280, or what --scale needs)")->check(CLI::Range(0, 16384));
  app.add_option("--height", o.height, "window height (default 720, or what --scale needs)")->check(CLI::Range(0, 16384));
  app.add_option("--record", o.record_path, "record the shown frames to this MP4 from the start (R toggles)");
  app.add_option("--record-upscale", o.record_upscale, "nearest upscale of recorded frames")
      ->capture_default_str()->check(CLI::Range(1, 32));
  app.add_flag("--gt", o.ground_truth, "start with the ground-truth view beside the model's (G toggles)");
  app.add_option("--fps", o.fps, "frame clock: input sampling and display rate (0: as fast as the model)")
      ->capture_default_str()->check(wm::cli::FiniteRange(0.0, 240.0));
  auto* sf = app.add_option("--script", script_file, "run a script of key/mouse events from FILE")->check(CLI::ExistingFile);
  app.add_option("--inject", inject, "run this script text (e.g. \"hold W 4c; mouse 200 0; wait 3c\")")->excludes(sf);
  app.add_option("--screenshot", o.screenshot_path, "write a PNG of the window at exit");
  app.add_option("--chunks", o.chunks, "exit after this many chunks")->check(CLI::NonNegativeNumber);
  app.add_option("--frames", o.frames, "exit after this many frames")->check(CLI::NonNegativeNumber);
  app.add_option("--timeout", o.timeout_s, "fail (exit 2) if still running after this many seconds")
      ->check(wm::cli::FiniteNonNegative);
  app.add_flag("--software", o.software, "use SDL's software renderer (headless / no GPU)");
  app.add_option("--summary-json", o.summary_json, "write the run's summary (latency, fps, poses, layout) as JSON");
  add_model_options(app, o);
  CLI11_PARSE(app, argc, argv);
  apply_model_defaults(app, o);

  try {
    if (!script_file.empty()) {
      std::ifstream f(script_file);
      std::stringstream ss;
      ss << f.rdbuf();
      if (!f) throw wm::Error("--script: cannot read '" + script_file + "'");
      o.script = ss.str();
      o.script_source = script_file;
    } else if (!inject.empty()) {
      o.script = inject;
      o.script_source = "--inject";
    }
    std::unique_ptr<wm::cli::OutputPath> summary;  // whole or absent; a bad path fails before the window opens
    if (!o.summary_json.empty()) {
      summary = std::make_unique<wm::cli::OutputPath>(o.summary_json);
      if (!std::ofstream(summary->tmp()))
        throw wm::Error("--summary-json: cannot write " + o.summary_json + " (the folder is missing or not writable)");
    }
    const wm::viewer::ViewerSummary s = wm::viewer::run_viewer(o);
    std::cout << wm::viewer::format_summary(s) << std::flush;
    if (summary) {
      wm::viewer::write_summary_json(s, summary->tmp());
      summary->commit();
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "wm_viewer: error: " << wm::cli::error_text(e) << "\n";
    return 2;
  }
}
