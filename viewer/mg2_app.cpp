#include "viewer/mg2_app.h"

#include <SDL.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "dit/clip_vision.h"
#include "dit/codec.h"
#include "dit/mg2_condition.h"
#include "dit/mg2_weights.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tools/media/mp4_writer.h"
#include "tools/media/png.h"
#include "viewer/font.h"
#include "viewer/hud.h"
#include "viewer/layout.h"
#include "viewer/mg2_generator.h"
#include "viewer/mg2_hud.h"
#include "viewer/mg2_input.h"
#include "viewer/palette.h"
#include "viewer/script.h"
#include "viewer/sdl_handles.h"
#include "worldkv/policy.h"

namespace wm::viewer {

namespace fs = std::filesystem;

bool is_mg2_model(const std::string& model_path, const std::string& mode) {
  if (!mode.empty()) return true;
  if (model_path.empty()) return false;
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) return true;
  const fs::path cfg = fs::path(model_path).parent_path() / "config.json";
  if (!fs::is_regular_file(cfg, ec)) return false;
  std::ifstream f(cfg);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("_class_name") && j["_class_name"].is_string() &&
         j["_class_name"].get<std::string>() == "CausalWanModel";
}

std::string mg2_file_beside_model(const std::string& model_path, const std::string& given, const std::string& name) {
  if (!given.empty()) return given;
  fs::path p = fs::absolute(fs::path(model_path)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "DIR/"
  std::error_code ec;
  const fs::path folder = fs::is_directory(p, ec) ? p : p.parent_path();
  return (folder.parent_path() / name).string();
}

namespace {

using Clock = std::chrono::steady_clock;

// The key a scancode stands for in `mode`; Space, Q and E only mean something to templerun (Q
// quits the other modes).
std::optional<Mg2Key> mg2_key(SDL_Scancode sc, const std::string& mode) {
  const bool tr = mode == "templerun";
  switch (sc) {
    case SDL_SCANCODE_W: return Mg2Key::W;
    case SDL_SCANCODE_S: return Mg2Key::S;
    case SDL_SCANCODE_A: return Mg2Key::A;
    case SDL_SCANCODE_D: return Mg2Key::D;
    case SDL_SCANCODE_UP: return Mg2Key::Up;
    case SDL_SCANCODE_DOWN: return Mg2Key::Down;
    case SDL_SCANCODE_LEFT: return Mg2Key::Left;
    case SDL_SCANCODE_RIGHT: return Mg2Key::Right;
    case SDL_SCANCODE_SPACE: return tr ? std::optional<Mg2Key>(Mg2Key::Space) : std::nullopt;
    case SDL_SCANCODE_Q: return tr ? std::optional<Mg2Key>(Mg2Key::Q) : std::nullopt;
    case SDL_SCANCODE_E: return tr ? std::optional<Mg2Key>(Mg2Key::E) : std::nullopt;
    default: return std::nullopt;
  }
}

// Digit keys switch the policy (restarting from the first frame).
std::optional<std::string> policy_key(SDL_Keycode k) {
  switch (k) {
    case SDLK_0: return std::string("native");
    case SDLK_1: return std::string("full_kv");
    case SDLK_2: return std::string("sliding_window");
    case SDLK_3: return std::string("worldkv");
    case SDLK_4: return std::string("worldkv_c");
    case SDLK_5: return std::string("sink_recent");
    default: return std::nullopt;
  }
}

world::Pose to_world_pose(const worldkv::Pose& p) {
  return world::Pose{p.x, p.y, p.yaw / worldkv::kRadiansPerDegree, p.pitch / worldkv::kRadiansPerDegree};
}

struct Mg2Frame {
  Image image;
  worldkv::Mg2Input input;
  worldkv::Pose pose;
  int64_t chunk = -1;
  int frame = 0;  // within the chunk
};

class Mg2Viewer {
 public:
  explicit Mg2Viewer(const ViewerOptions& o) : o_(o) {}
  // The worker goes first: its wake-up callback pushes SDL events.
  ~Mg2Viewer() { gen_.reset(); }
  Mg2Viewer(const Mg2Viewer&) = delete;
  Mg2Viewer& operator=(const Mg2Viewer&) = delete;
  ViewerSummary run();

 private:
  void load();
  void open_window();
  void restart(const std::string& policy, const std::string& status);
  void handle(const SDL_Event& e);
  void tick_input(double now);
  void take_results(double now);
  void advance_display(double now);
  void show(Mg2Frame f);
  void render(double now);
  void screenshot(const std::string& path);
  void start_recording(bool fatal);
  void stop_recording();
  void capture_mouse(bool on);
  void set_status(const std::string& s, double now) {
    status_ = s;
    status_until_ = now + 3000;
    dirty_ = true;
  }
  bool limit_reached() const {
    return (o_.chunks > 0 && chunks_total_ >= o_.chunks) || (o_.frames > 0 && frames_total_ >= o_.frames);
  }
  bool may_request() const {
    if (o_.chunks > 0 && requested_total_ >= o_.chunks) return false;
    if (o_.frames > 0 && requested_frames_ >= o_.frames) return false;
    return true;
  }
  size_t inputs_needed() const { return static_cast<size_t>(gen_->inputs_for_chunk(epoch_requested_)); }
  double ms_since_start() const { return std::chrono::duration<double, std::milli>(Clock::now() - t_start_).count(); }

  ViewerOptions o_;
  Clock::time_point t_start_ = Clock::now();
  // Model and generation.
  at::Device device_{at::kCPU};
  std::string device_desc_, model_desc_, model_name_, mode_, policy_;
  int frame_w_ = 640, frame_h_ = 352;
  std::unique_ptr<Mg2Generator> gen_;
  std::unique_ptr<Mg2InputState> input_;
  std::vector<worldkv::Mg2Input> pending_;
  uint64_t epoch_ = 0;
  int64_t epoch_requested_ = 0;  // chunks requested since the last restart
  worldkv::Pose received_pose_;  // after the last frame received
  // Display.
  std::unique_ptr<SdlLibrary> sdl_;
  WindowPtr window_;
  RendererPtr renderer_;
  std::unique_ptr<BitmapFont> font_;
  StreamingTexture frame_tex_;
  Uint32 wake_event_ = 0;
  std::deque<Mg2Frame> display_;
  std::optional<Mg2Frame> current_;
  std::vector<worldkv::Pose> track_;
  std::optional<MemorySnapshot> mem_;
  Layout layout_;
  // Stats.
  std::vector<double> all_ms_, epoch_ms_, dit_ms_, decode_ms_;
  std::deque<std::pair<double, int>> recent_results_;  // (time ms, frames)
  int64_t chunks_total_ = 0, frames_total_ = 0, requested_total_ = 0, requested_frames_ = 0;
  int64_t epoch_chunks_ = 0, epoch_frames_ = 0, inputs_total_ = 0;
  std::vector<int64_t> keyboard_frames_;
  size_t window_bytes_ = 0, action_bytes_ = 0;
  double last_dit_ms_ = 0, last_decode_ms_ = 0;
  double first_request_ms_ = -1, last_result_ms_ = -1, epoch_start_ms_ = 0;
  // State.
  double next_tick_ = 0, next_display_ = 0, last_render_ = -1e9;
  bool quit_ = false, paused_ = false, help_ = false, captured_ = false, dirty_ = true, warned_capture_ = false;
  std::string status_;
  double status_until_ = 0;
  // Recording.
  std::unique_ptr<media::Mp4Writer> recorder_;
  double record_t0_ = 0;
  std::string record_path_;
  int record_count_ = 0;
  // Script and screenshots.
  std::unique_ptr<ScriptPlayer> script_;
  std::vector<std::string> screenshot_requests_;
  ViewerSummary summary_;
};

// Model, codec and the first frame's condition: every error a user is likely to make shows
// before the window opens.
void Mg2Viewer::load() {
  if (o_.model_path.empty())
    throw Error("--model: give the Matrix-Game-2.0 model folder (config.json + .safetensors) or its .safetensors");
  if (!fs::exists(o_.model_path)) throw Error(str_cat("model '", o_.model_path, "' not found"));
  if (o_.image.empty() == o_.latents.empty())
    throw Error("Matrix-Game-2.0 starts from a first frame: give --image FILE (encoded with the VAE and CLIP) or "
                "--latents FILE (image_latents and clip_tokens)");
  if (o_.dtype != "f32" && o_.dtype != "bf16") throw Error(str_cat("--dtype must be f32 or bf16, got '", o_.dtype, "'"));
  worldkv::SessionConfig().set_policy(o_.policy);  // fails before anything loads
  device_ = parse_device(o_.device);
  // As the tiny path: by default the model leaves the window's thread one core.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = init_threads(o_.threads > 0 ? o_.threads : std::max(1, cores - 1));
  keep_freed_memory();
  device_desc_ = device_.is_cpu() ? str_cat("cpu (", threads, " threads)") : describe_device(device_);
  const at::ScalarType dt = o_.dtype == "bf16" ? at::kBFloat16 : at::kFloat;

  at::NoGradGuard no_grad;
  dit::Mg2Dit model = dit::load_mg2_dit(o_.model_path, device_, dt);
  mode_ = model->config().mode();
  if (!o_.mode.empty() && o_.mode != mode_)
    throw Error(str_cat("--mode ", o_.mode, ", but ", o_.model_path, " is a ", mode_, " model (its config.json)"));
  input_ = std::make_unique<Mg2InputState>(mode_);  // throws for a mode the viewer cannot drive
  keyboard_frames_.assign(static_cast<size_t>(input_->keyboard_dim()), 0);
  const fs::path mp = fs::absolute(o_.model_path).lexically_normal();
  const std::string name = fs::is_directory(mp) ? mp.filename().string()
                                                : (mp.parent_path().filename() / mp.filename()).string();
  model_name_ = name;
  model_desc_ = str_cat("matrix-game-2.0 ", mode_, " (", name, ")");

  const std::string vae_path = mg2_file_beside_model(o_.model_path, o_.vae, "Wan2.1_VAE.pth");
  if (!fs::exists(vae_path))
    throw Error(str_cat("no VAE at '", vae_path, "': the viewer decodes every chunk with the Wan2.1 VAE (pass --vae)"));
  dit::WanVaeCodecOptions vo;
  vo.device = device_;
  vo.encode_dtype = dt;
  vo.decode_dtype = device_.is_cpu() ? at::kFloat : at::kHalf;  // half as upstream where it is fast
  vo.image_height = 8 * model->config().latent_height;  // 352 x 640 for the released models
  vo.image_width = 8 * model->config().latent_width;
  std::unique_ptr<dit::WanVaeCodec> vae = dit::WanVaeCodec::from_file(vae_path, vo);
  frame_w_ = vae->image_width();
  frame_h_ = vae->image_height();

  Mg2Start start;
  start.model = model;
  start.device = device_;
  start.session.set_policy(o_.policy);
  start.session.seed = o_.seed;
  start.session.memory.sink_frames = 0;  // as wm_render's defaults: 9 retrieved + 3 recent frames
  start.session.memory.retrieved_frames = 9;
  start.session.memory.recent_frames = 3;
  start.session.memory.bank.device = device_;
  std::string source;
  if (!o_.image.empty()) {
    const std::string clip_path =
        mg2_file_beside_model(o_.model_path, o_.clip, "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth");
    if (!fs::exists(clip_path)) throw Error(str_cat("no CLIP checkpoint at '", clip_path, "' (pass --clip)"));
    dit::ClipVisionOptions co;
    co.device = device_;
    const dit::ClipVision clip = dit::ClipVision::load(clip_path, dit::ClipVisionConfig::vit_h_14(), co);
    std::cerr << "wm_viewer: encoding " << o_.image << " (" << std::max(1, o_.cond_latents)
              << " latent frames) and its CLIP tokens\n";
    dit::Mg2Condition cond = dit::mg2_condition(media::read_image(o_.image), *vae, clip, std::max(1, o_.cond_latents), device_);
    start.image_latents = cond.image_latents;
    start.clip_tokens = cond.clip_tokens;
    source = o_.image;
  } else {
    SafeTensors st = SafeTensors::open(o_.latents);
    for (const char* k : {"image_latents", "clip_tokens"})
      if (!st.contains(k)) throw Error(str_cat(o_.latents, ": no tensor '", k, "'"));
    start.image_latents = st.get("image_latents");
    start.clip_tokens = st.get("clip_tokens");
    source = o_.latents;
  }
  policy_ = o_.policy;
  try {
    gen_ = std::make_unique<Mg2Generator>(std::move(start), std::move(vae), [this] {
      if (wake_event_ == 0) return;
      SDL_Event e;
      SDL_zero(e);
      e.type = wake_event_;
      SDL_PushEvent(&e);  // thread-safe; a full queue only delays the wake-up
    });
  } catch (const std::exception& e) {
    throw Error(str_cat("starting the rollout from ", source, ": ", e.what()));
  }
}

void Mg2Viewer::open_window() {
  SDL_SetHint(SDL_HINT_RENDER_SCALE_QUALITY, "0");
  SDL_SetHint(SDL_HINT_VIDEO_X11_NET_WM_BYPASS_COMPOSITOR, "0");
  sdl_ = std::make_unique<SdlLibrary>(SDL_INIT_VIDEO | SDL_INIT_EVENTS);
  int w = o_.width, h = o_.height;
  if (w <= 0 || h <= 0) {
    int sw = 1280, sh = 720;
    if (o_.scale > 0) window_size_for_scale(o_.scale, frame_w_ / 2, frame_h_, sw, sh);  // one frame, no ground truth
    if (w <= 0) w = sw;
    if (h <= 0) h = sh;
  }
  window_.reset(SDL_CreateWindow(("wm_viewer - " + model_desc_).c_str(), SDL_WINDOWPOS_CENTERED, SDL_WINDOWPOS_CENTERED,
                                 w, h, SDL_WINDOW_SHOWN | SDL_WINDOW_RESIZABLE));
  if (!window_) throw Error(sdl_error("SDL_CreateWindow"));
  if (!o_.software) renderer_.reset(SDL_CreateRenderer(window_.get(), -1, SDL_RENDERER_ACCELERATED));
  if (!renderer_) renderer_.reset(SDL_CreateRenderer(window_.get(), -1, SDL_RENDERER_SOFTWARE));
  if (!renderer_) throw Error(sdl_error("SDL_CreateRenderer"));
  font_ = std::make_unique<BitmapFont>(renderer_.get());
  const Uint32 wake = SDL_RegisterEvents(1);
  if (wake == static_cast<Uint32>(-1)) throw Error(sdl_error("SDL_RegisterEvents"));
  wake_event_ = wake;  // before the first request: the worker reads it only after one
  if (!o_.script.empty())
    script_ = std::make_unique<ScriptPlayer>(parse_script(o_.script, o_.script_source), SDL_GetWindowID(window_.get()));
}

void Mg2Viewer::restart(const std::string& policy, const std::string& status) {
  policy_ = policy;
  epoch_ = gen_->restart(policy);
  epoch_requested_ = 0;
  pending_.clear();
  display_.clear();
  current_.reset();
  track_.clear();
  mem_.reset();
  epoch_ms_.clear();
  recent_results_.clear();
  epoch_chunks_ = epoch_frames_ = 0;
  received_pose_ = worldkv::Pose{};
  epoch_start_ms_ = ms_since_start();
  set_status(status, epoch_start_ms_);
}

void Mg2Viewer::capture_mouse(bool on) {
  if (SDL_SetRelativeMouseMode(on ? SDL_TRUE : SDL_FALSE) != 0 && on && !warned_capture_) {
    std::cerr << "wm_viewer: relative mouse mode unavailable (" << SDL_GetError()
              << "); mouse motion still looks around while the window has the pointer\n";
    warned_capture_ = true;
  }
  captured_ = on;
  dirty_ = true;
}

void Mg2Viewer::start_recording(bool fatal) {
  std::string path = o_.record_path;
  if (path.empty() || record_count_ > 0) {
    if (!path.empty()) {
      const fs::path p(path);
      path = (p.parent_path() / (p.stem().string() + "_" + std::to_string(record_count_ + 1) + p.extension().string()))
                 .string();
    } else {
      char b[64];
      const std::time_t t = std::time(nullptr);
      std::strftime(b, sizeof b, "wm_viewer_%Y%m%d_%H%M%S.mp4", std::localtime(&t));
      path = b;
    }
  }
  const int fps = o_.fps > 0 ? static_cast<int>(std::lround(o_.fps)) : 12;
  try {
    recorder_ = std::make_unique<media::Mp4Writer>(path, frame_w_, frame_h_, fps, std::max(1, o_.record_upscale));
  } catch (const std::exception& e) {
    if (fatal) throw Error(str_cat("--record: ", e.what()));
    set_status("recording failed (see stderr)", ms_since_start());
    std::cerr << "wm_viewer: recording failed: " << e.what() << "\n";
    return;
  }
  record_path_ = path;
  ++record_count_;
  record_t0_ = ms_since_start();
  set_status("recording " + fs::path(path).filename().string(), record_t0_);
  std::cerr << "wm_viewer: recording to " << path << "\n";
}

void Mg2Viewer::stop_recording() {
  if (!recorder_) return;
  const int n = recorder_->frames_written();
  recorder_->close();
  recorder_.reset();
  summary_.recordings.push_back(record_path_);
  std::cerr << "wm_viewer: wrote " << n << " frames to " << record_path_ << "\n";
  set_status(str_cat("saved ", n, " frames"), ms_since_start());
}

void Mg2Viewer::handle(const SDL_Event& e) {
  const double now = ms_since_start();
  switch (e.type) {
    case SDL_QUIT:
      quit_ = true;
      break;
    case SDL_WINDOWEVENT:
      if (e.window.event == SDL_WINDOWEVENT_FOCUS_LOST && !script_) input_->clear();
      dirty_ = true;
      break;
    case SDL_MOUSEMOTION:
      if (captured_) input_->mouse_motion(e.motion.xrel, e.motion.yrel);
      break;
    case SDL_MOUSEBUTTONDOWN:
      if (!captured_ && mode_ == "universal") capture_mouse(true);
      break;
    case SDL_KEYDOWN: {
      const SDL_Scancode sc = e.key.keysym.scancode;
      if (e.key.keysym.sym == SDLK_q && (e.key.keysym.mod & KMOD_CTRL)) {
        quit_ = true;
        break;
      }
      if (auto k = mg2_key(sc, mode_)) {
        input_->press(*k, sc);
        break;
      }
      if (e.key.repeat) break;
      dirty_ = true;
      if (auto p = policy_key(e.key.keysym.sym)) {
        restart(*p, "policy " + *p + ": restart from frame 1");
        break;
      }
      switch (e.key.keysym.sym) {
        case SDLK_ESCAPE: capture_mouse(false); break;
        case SDLK_r:
          if (recorder_) stop_recording();
          else start_recording(false);
          break;
        case SDLK_n: restart(policy_, "restart from frame 1"); break;
        case SDLK_p:
          paused_ = !paused_;
          next_tick_ = next_display_ = now;
          break;
        case SDLK_h: case SDLK_F1: help_ = !help_; break;
        case SDLK_q: quit_ = true; break;  // templerun's Q is a move (above)
        default: break;
      }
      break;
    }
    case SDL_KEYUP:
      if (auto k = mg2_key(e.key.keysym.scancode, mode_)) input_->release(*k, e.key.keysym.scancode);
      break;
    default:
      break;
  }
}

void Mg2Viewer::tick_input(double now) {
  if (paused_ || !may_request()) return;
  const size_t need = inputs_needed();
  if (o_.fps > 0) {
    const double period = 1000.0 / o_.fps;
    while (next_tick_ <= now) {
      if (pending_.size() >= need) {
        next_tick_ = now;  // stalled on the model: the next sample is due as soon as there is room
        break;
      }
      pending_.push_back(input_->sample());
      next_tick_ += period;
      if (next_tick_ < now - period) next_tick_ = now;  // do not catch up after a stall
    }
  } else if (gen_->pending() == 0) {
    while (pending_.size() < need) pending_.push_back(input_->sample());
  }
  if (pending_.size() == need && gen_->pending() == 0) {
    requested_frames_ += static_cast<int64_t>(need);
    gen_->submit(std::move(pending_));
    pending_.clear();
    ++epoch_requested_;
    ++requested_total_;
    if (first_request_ms_ < 0) first_request_ms_ = now;
  }
}

void Mg2Viewer::take_results(double now) {
  while (auto r = gen_->poll()) {
    if (r->epoch != epoch_) continue;  // made stale by a restart
    if (!r->error.empty()) throw Error(str_cat("generation failed: ", r->error));
    worldkv::ChunkOutput& c = r->chunk;
    const double ms = c.ms + r->decode_ms;
    all_ms_.push_back(ms);
    epoch_ms_.push_back(ms);
    dit_ms_.push_back(c.model_ms);
    decode_ms_.push_back(r->decode_ms);
    last_dit_ms_ = c.model_ms;
    last_decode_ms_ = r->decode_ms;
    window_bytes_ = c.window_bytes;
    action_bytes_ = c.state_bytes;
    ++chunks_total_;
    ++epoch_chunks_;
    const int n = static_cast<int>(c.frames.size());
    frames_total_ += n;
    epoch_frames_ += n;
    last_result_ms_ = now;
    recent_results_.emplace_back(now, n);
    while (recent_results_.size() > 1 && recent_results_.front().first < now - 3000) recent_results_.pop_front();
    mem_ = std::move(r->memory);
    for (const auto& in : r->inputs) {
      ++inputs_total_;
      for (size_t j = 0; j < keyboard_frames_.size() && j < in.keyboard.size(); ++j)
        keyboard_frames_[j] += in.keyboard[j] > 0.5f;
    }
    for (int i = 0; i < n; ++i)
      display_.push_back(Mg2Frame{std::move(c.frames[static_cast<size_t>(i)]), r->inputs.at(static_cast<size_t>(i)),
                                  r->poses.at(static_cast<size_t>(i)), c.index, i});
    if (!r->poses.empty()) received_pose_ = r->poses.back();
    dirty_ = true;
  }
}

void Mg2Viewer::advance_display(double now) {
  if (paused_ || display_.empty()) return;
  if (o_.fps <= 0) {
    while (!display_.empty()) {
      show(std::move(display_.front()));
      display_.pop_front();
    }
    return;
  }
  const size_t F = static_cast<size_t>(gen_->inputs_for_chunk(1));
  if (display_.size() > 3 * F) {  // far behind (a stall): catch up, keeping the recording whole
    while (display_.size() > F) {
      show(std::move(display_.front()));
      display_.pop_front();
    }
  }
  if (now < next_display_) return;
  show(std::move(display_.front()));
  display_.pop_front();
  const double period = 1000.0 / o_.fps;
  next_display_ += period;
  if (next_display_ < now - period) next_display_ = now;
}

void Mg2Viewer::show(Mg2Frame f) {
  frame_tex_.upload(renderer_.get(), f.image.width, f.image.height, f.image.rgb.data());
  if (recorder_) recorder_->write(f.image);
  track_.push_back(f.pose);
  current_ = std::move(f);
  dirty_ = true;
}

void Mg2Viewer::render(double now) {
  using namespace palette;
  SDL_Renderer* r = renderer_.get();
  int w = 0, h = 0;
  SDL_GetRendererOutputSize(r, &w, &h);
  layout_ = compute_layout(w, h, frame_w_, frame_h_, false, o_.scale);
  const Layout& L = layout_;
  set_color(r, kBackground);
  SDL_RenderClear(r);
  set_color(r, kPanel);
  SDL_RenderFillRect(r, &L.panel);

  std::string cap = "MODEL";
  if (current_) cap += str_cat("  chunk ", current_->chunk, " frame ", current_->frame);
  font_->draw(L.frame.x, L.frame.y - kLabelHeight + 2, cap, kAccent, 2);
  if (current_ && frame_tex_) {
    SDL_RenderCopy(r, frame_tex_.get(), nullptr, &L.frame);
  } else {
    set_color(r, kPanel);
    SDL_RenderFillRect(r, &L.frame);
    const std::string t = "generating the first chunk...";
    font_->draw(L.frame.x + (L.frame.w - BitmapFont::width(t, 2)) / 2, L.frame.y + L.frame.h / 2 - 8, t, kDim, 2);
  }
  if (paused_) {
    const std::string t = "PAUSED (P)";
    const SDL_Rect box{L.frame.x + (L.frame.w - BitmapFont::width(t, 4)) / 2 - 10, L.frame.y + L.frame.h / 2 - 26,
                       BitmapFont::width(t, 4) + 20, 52};
    SDL_SetRenderDrawBlendMode(r, SDL_BLENDMODE_BLEND);
    set_color(r, SDL_Color{0, 0, 0, 170});
    SDL_RenderFillRect(r, &box);
    SDL_SetRenderDrawBlendMode(r, SDL_BLENDMODE_NONE);
    font_->draw(box.x + 10, box.y + 10, t, kRetrieved, 4);
  }

  Mg2HudInfo info;
  info.model = model_name_;
  info.device = device_desc_;
  info.mode = mode_;
  info.policy = policy_;
  info.keyboard_names = input_->keyboard_names();
  info.chunks = epoch_chunks_;
  info.frames = epoch_frames_;
  if (!recent_results_.empty()) {
    int n = 0;  // frames received in the last 3 s (or since the restart, if later)
    for (auto& rr : recent_results_) n += rr.first >= now - 3000.0 ? rr.second : 0;
    const double span = std::max(now - std::max(now - 3000.0, epoch_start_ms_), 1.0);
    info.gen_fps = n * 1000.0 / span;
  }
  if (!epoch_ms_.empty()) {
    const size_t k = std::min<size_t>(epoch_ms_.size(), 100);
    const auto s = summarize(std::vector<double>(epoch_ms_.end() - static_cast<long>(k), epoch_ms_.end()));
    info.last_ms = epoch_ms_.back();
    info.p50_ms = s.p50;
    info.p90_ms = s.p90;
    info.model_fps = gen_->inputs_for_chunk(1) * 1000.0 / std::max(s.mean, 1e-3);
    info.dit_ms = last_dit_ms_;
    info.decode_ms = last_decode_ms_;
  }
  info.window_bytes = window_bytes_;
  info.action_bytes = action_bytes_;
  info.memory = mem_ ? &*mem_ : nullptr;
  info.input = current_ ? &current_->input : nullptr;
  info.pose = current_ ? current_->pose : received_pose_;
  info.recording = recorder_ != nullptr;
  info.record_s = (now - record_t0_) / 1000.0;
  info.paused = paused_;
  info.captured = captured_;
  if (now < status_until_) info.status = status_;
  draw_mg2_hud(r, *font_, L.hud, info);
  draw_mg2_track(r, *font_, L.minimap, track_, info.memory);
  draw_region_bar(r, *font_, L.bar, info.memory);
  if (L.graph.h > 0) {
    const size_t k = std::min<size_t>(epoch_ms_.size(), 240);
    draw_latency_graph(r, *font_, L.graph, std::vector<double>(epoch_ms_.end() - static_cast<long>(k), epoch_ms_.end()),
                       o_.fps > 0 ? gen_->inputs_for_chunk(1) * 1000.0 / o_.fps : 0.0, info.memory);
  }
  if (help_) draw_help(r, *font_, L.frame, mg2_help_text(mode_));
  for (const auto& p : screenshot_requests_) screenshot(p);
  screenshot_requests_.clear();
  SDL_RenderPresent(r);
  last_render_ = now;
  dirty_ = false;
}

void Mg2Viewer::screenshot(const std::string& path) {
  int w = 0, h = 0;
  SDL_GetRendererOutputSize(renderer_.get(), &w, &h);
  Image img(w, h);
  if (SDL_RenderReadPixels(renderer_.get(), nullptr, SDL_PIXELFORMAT_RGB24, img.rgb.data(), w * 3) != 0)
    throw Error(sdl_error("screenshot: SDL_RenderReadPixels"));
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  media::write_png(path, img);
  summary_.screenshots.push_back(path);
  std::cerr << "wm_viewer: screenshot " << path << " (" << w << "x" << h << ")\n";
}

ViewerSummary Mg2Viewer::run() {
  load();
  open_window();
  capture_mouse(mode_ == "universal");
  if (!o_.record_path.empty()) start_recording(true);
  const bool scripted = script_ != nullptr;
  const bool has_limit = o_.chunks > 0 || o_.frames > 0;
  while (!quit_) {
    double now = ms_since_start();
    if (o_.timeout_s > 0 && now > o_.timeout_s * 1000.0)
      throw Error(str_cat("timed out after ", o_.timeout_s, " s (", chunks_total_, " chunks generated)"));
    if (script_) script_->update(now, chunks_total_, frames_total_, screenshot_requests_);
    if (!screenshot_requests_.empty()) dirty_ = true;

    // Sleep until an event, the next input tick, the next frame to show, or a HUD refresh.
    double wait = 250;
    if (!paused_) {
      if (may_request() && o_.fps > 0 && pending_.size() < inputs_needed()) wait = std::min(wait, next_tick_ - now);
      if (!display_.empty()) wait = std::min(wait, o_.fps > 0 ? next_display_ - now : 0.0);
    }
    if (scripted) wait = std::min(wait, 10.0);
    if (dirty_) wait = std::min(wait, std::max(0.0, last_render_ + 15 - now));
    SDL_Event e;
    if (SDL_WaitEventTimeout(&e, static_cast<int>(std::clamp(wait, 1.0, 250.0)))) {
      handle(e);
      while (!quit_ && SDL_PollEvent(&e)) handle(e);
    }
    if (quit_) break;
    now = ms_since_start();
    tick_input(now);
    take_results(now);
    advance_display(now);
    const bool done = has_limit ? limit_reached() : (scripted && script_->done());
    if (done) break;
    if ((dirty_ && now - last_render_ >= 15) || now - last_render_ >= 500) render(now);
  }
  // Show whatever was generated but not yet shown, then the final screenshot.
  while (!display_.empty()) {
    show(std::move(display_.front()));
    display_.pop_front();
  }
  const double now = ms_since_start();
  if (!o_.screenshot_path.empty()) screenshot_requests_.push_back(o_.screenshot_path);
  render(now);
  stop_recording();

  ViewerSummary& s = summary_;
  s.chunks = chunks_total_;
  s.frames = frames_total_;
  s.wall_s = first_request_ms_ >= 0 && last_result_ms_ > first_request_ms_ ? (last_result_ms_ - first_request_ms_) / 1000.0 : 0;
  s.chunk_ms = summarize(all_ms_);
  double total_ms = 0;
  for (double v : all_ms_) total_ms += v;
  s.model_fps = total_ms > 0 ? s.frames * 1000.0 / total_ms : 0;
  s.delivered_fps = s.wall_s > 0 ? s.frames / s.wall_s : 0;
  s.policy = policy_;
  s.device = device_desc_;
  s.model = model_desc_;
  s.seed = o_.seed;
  s.start = world::Pose{};
  s.end = to_world_pose(received_pose_);
  s.shown = current_ ? to_world_pose(current_->pose) : s.start;
  SDL_GetWindowSize(window_.get(), &s.win_w, &s.win_h);
  s.layout = layout_;
  s.load_avg = load_average();
  s.mode = mode_;
  s.inputs = inputs_total_;
  for (size_t j = 0; j < keyboard_frames_.size(); ++j)
    s.keyboard_frames.emplace_back(input_->keyboard_names()[j], keyboard_frames_[j]);
  s.window_bytes = window_bytes_;
  s.action_bytes = action_bytes_;
  s.dit_ms_mean = summarize(dit_ms_).mean;
  s.decode_ms_mean = summarize(decode_ms_).mean;
  capture_mouse(false);
  gen_.reset();  // joins the worker before the window goes
  return s;
}

}  // namespace

ViewerSummary run_mg2_viewer(const ViewerOptions& options) {
  Mg2Viewer v(options);
  return v.run();
}

}  // namespace wm::viewer
