#include "viewer/app.h"

#include <SDL.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/media/mp4_writer.h"
#include "tools/media/png.h"
#include "tools/world/actions.h"
#include "tools/world/raycaster.h"
#include "viewer/font.h"
#include "viewer/generator.h"
#include "viewer/hud.h"
#include "viewer/input.h"
#include "viewer/mg2_app.h"
#include "viewer/minimap.h"
#include "viewer/palette.h"
#include "viewer/script.h"
#include "viewer/sdl_handles.h"
#include "worldkv/session.h"
#include "worldkv/tiny_dit_adapter.h"

#ifndef WM_VIEWER_SOURCE_DIR
#define WM_VIEWER_SOURCE_DIR "."
#endif

namespace wm::viewer {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string resolve_model_path(const std::string& path) {
  if (!path.empty()) {
    if (!fs::exists(path)) throw Error(str_cat("model file '", path, "' not found"));
    return path;
  }
  const std::string rel = "assets/models/tiny/model.safetensors";
  const std::string in_src = std::string(WM_VIEWER_SOURCE_DIR) + "/" + rel;
  if (fs::exists(rel)) return rel;
  if (fs::exists(in_src)) return in_src;
  throw Error(str_cat("the embedded model is missing: looked for ", rel, " and ", in_src,
                      "; train it with wm_train (it writes runs/tiny/model.safetensors) or pass --model PATH"));
}

world::Pose start_pose(const world::Scene& scene) {
  static const int dir[4][2] = {{1, 0}, {0, 1}, {-1, 0}, {0, -1}};
  static const double yaw[4] = {0.0, 90.0, -180.0, -90.0};
  // Longest run first; among equals, the cell nearest the map's centre.
  int best = -1, bx = 0, by = 0, bd = 0;
  double best_dist = 0;
  for (int y = 0; y < scene.height; ++y)
    for (int x = 0; x < scene.width; ++x) {
      if (scene.is_solid(x, y)) continue;
      const double dist = std::hypot(x + 0.5 - scene.width / 2.0, y + 0.5 - scene.height / 2.0);
      for (int d = 0; d < 4; ++d) {
        int run = 0;
        while (!scene.is_solid(x + dir[d][0] * (run + 1), y + dir[d][1] * (run + 1))) ++run;
        if (run > best || (run == best && dist < best_dist)) {
          best_dist = dist;
          best = run;
          bx = x;
          by = y;
          bd = d;
        }
      }
    }
  if (best < 0) throw Error("start_pose: the scene has no free cell");
  return world::Pose{bx + 0.5, by + 0.5, yaw[bd], 0.0};
}

std::string format_summary(const ViewerSummary& s) {
  char b[1024];
  std::string out;
  std::snprintf(b, sizeof b, "wm_viewer: %lld chunks (%lld frames) in %.1f s; policy %s; %s; model %s\n",
                static_cast<long long>(s.chunks), static_cast<long long>(s.frames), s.wall_s, s.policy.c_str(),
                s.device.c_str(), s.model.c_str());
  out += b;
  std::snprintf(b, sizeof b, "  chunk ms: mean %.1f  p50 %.1f  p90 %.1f  min %.1f  max %.1f\n", s.chunk_ms.mean,
                s.chunk_ms.p50, s.chunk_ms.p90, s.chunk_ms.min, s.chunk_ms.max);
  out += b;
  std::snprintf(b, sizeof b, "  generated fps: %.1f from model time (%s), %.1f delivered over the run\n", s.model_fps,
                s.mode.empty() ? "3 frames / mean chunk" : "frames / chunk time", s.delivered_fps);
  out += b;
  std::snprintf(b, sizeof b, "  pose: start (%.2f, %.2f, yaw %.1f) -> end (%.2f, %.2f, yaw %.1f)", s.start.x, s.start.y,
                s.start.yaw_deg, s.end.x, s.end.y, s.end.yaw_deg);
  out += b;
  if (s.load_avg >= 0) {
    std::snprintf(b, sizeof b, "; load average %.2f", s.load_avg);
    out += b;
  }
  out += "\n";
  if (!s.mode.empty()) {
    std::snprintf(b, sizeof b, "  matrix-game-2.0 %s: %lld video frames of input; DiT %.0f ms, VAE %.0f ms a chunk; window %s, action K/V %s\n",
                  s.mode.c_str(), static_cast<long long>(s.inputs), s.dit_ms_mean, s.decode_ms_mean,
                  format_bytes(s.window_bytes).c_str(), format_bytes(s.action_bytes).c_str());
    out += b;
  }
  for (const auto& p : s.screenshots) out += "  screenshot: " + p + "\n";
  for (const auto& p : s.recordings) out += "  recording: " + p + "\n";
  return out;
}

void write_summary_json(const ViewerSummary& s, const std::string& path) {
  using nlohmann::json;
  auto pose = [](const world::Pose& p) { return json{{"x", p.x}, {"y", p.y}, {"yaw_deg", p.yaw_deg}}; };
  auto rect = [](const SDL_Rect& r) { return json::array({r.x, r.y, r.w, r.h}); };
  json j{{"chunks", s.chunks},
         {"frames", s.frames},
         {"wall_s", s.wall_s},
         {"chunk_ms", {{"n", s.chunk_ms.n}, {"mean", s.chunk_ms.mean}, {"p50", s.chunk_ms.p50}, {"p90", s.chunk_ms.p90},
                       {"min", s.chunk_ms.min}, {"max", s.chunk_ms.max}}},
         {"model_fps", s.model_fps},
         {"delivered_fps", s.delivered_fps},
         {"policy", s.policy},
         {"device", s.device},
         {"model", s.model},
         {"seed", s.seed},
         {"start", pose(s.start)},
         {"end", pose(s.end)},
         {"shown", pose(s.shown)},
         {"window", {s.win_w, s.win_h}},
         {"layout", {{"frame", rect(s.layout.frame)}, {"gt", rect(s.layout.gt)}, {"hud", rect(s.layout.hud)},
                     {"minimap", rect(s.layout.minimap)}, {"bar", rect(s.layout.bar)}, {"graph", rect(s.layout.graph)}, {"scale", s.layout.scale}}},
         {"ground_truth_shown", s.ground_truth_shown},
         {"screenshots", s.screenshots},
         {"recordings", s.recordings},
         {"load_avg", s.load_avg}};
  if (!s.mode.empty()) {
    json keys = json::object();
    for (const auto& [name, n] : s.keyboard_frames) keys[name] = n;
    j["mg2"] = {{"mode", s.mode},           {"inputs", s.inputs},
                {"keyboard_frames", keys},  {"window_bytes", s.window_bytes},
                {"action_bytes", s.action_bytes}, {"dit_ms_mean", s.dit_ms_mean},
                {"decode_ms_mean", s.decode_ms_mean}};
  }
  std::ofstream f(path);
  if (!f) throw Error(str_cat("write_summary_json: cannot open '", path, "'"));
  f << j.dump(2) << "\n";
  if (!f) throw Error(str_cat("write_summary_json: cannot write '", path, "'"));
}

namespace {

std::optional<Control> movement_control(SDL_Scancode sc) {
  switch (sc) {
    case SDL_SCANCODE_W: case SDL_SCANCODE_UP: return Control::Forward;
    case SDL_SCANCODE_S: case SDL_SCANCODE_DOWN: return Control::Back;
    case SDL_SCANCODE_A: return Control::Left;
    case SDL_SCANCODE_D: return Control::Right;
    case SDL_SCANCODE_LEFT: return Control::TurnLeft;
    case SDL_SCANCODE_RIGHT: return Control::TurnRight;
    default: return std::nullopt;
  }
}

struct DisplayFrame {
  Image image;
  world::Pose pose;
  int64_t chunk = -1;
  int frame = 0;  // within the chunk
};

class Viewer {
 public:
  explicit Viewer(const ViewerOptions& o) : o_(o) {}
  // The worker goes first: its wake-up callback pushes SDL events.
  ~Viewer() { gen_.reset(); }
  Viewer(const Viewer&) = delete;
  Viewer& operator=(const Viewer&) = delete;
  ViewerSummary run();

 private:
  void init();
  void new_scene(uint64_t seed);
  void restart_epoch();
  void switch_policy(worldkv::Policy p);
  void handle(const SDL_Event& e);
  void tick_input(double now);
  void take_results(double now);
  void advance_display(double now);
  void show(DisplayFrame f);
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
    const int64_t F = gen_->frames_per_chunk();
    if (o_.chunks > 0 && requested_total_ >= o_.chunks) return false;
    if (o_.frames > 0 && requested_total_ * F >= o_.frames) return false;
    return true;
  }
  double ms_since_start() const {
    return std::chrono::duration<double, std::milli>(Clock::now() - t_start_).count();
  }

  ViewerOptions o_;
  Clock::time_point t_start_ = Clock::now();
  // Model and generation.
  at::Device device_{at::kCPU};
  std::string device_desc_, model_desc_;
  int frame_w_ = 64, frame_h_ = 64;
  double fov_deg_ = 90;
  std::unique_ptr<Generator> gen_;
  worldkv::Policy policy_ = worldkv::Policy::WorldKv;
  uint64_t seed_ = 1;
  uint64_t epoch_ = 0;
  // World.
  std::unique_ptr<world::Scene> scene_;
  std::unique_ptr<world::Raycaster> raycaster_;
  bool prompt_next_ = true;  // the next request starts a session: send the ground-truth prompt
  world::MotionParams motion_;
  world::Pose pose_;           // after the last frame requested
  world::Pose received_pose_;  // of the last frame received
  bool first_pose_set_ = false;
  world::Pose start_;
  std::vector<world::Action> pending_;
  InputState input_;
  // Display.
  std::unique_ptr<SdlLibrary> sdl_;
  WindowPtr window_;
  RendererPtr renderer_;
  std::unique_ptr<BitmapFont> font_;
  StreamingTexture frame_tex_, gt_tex_;
  Minimap minimap_;
  Uint32 wake_event_ = 0;
  std::deque<DisplayFrame> display_;
  std::optional<DisplayFrame> current_;
  Image gt_image_;
  bool gt_fresh_ = false;
  std::vector<world::Pose> trail_;
  std::optional<MemorySnapshot> mem_;
  Layout layout_;
  // Stats.
  std::vector<double> all_ms_, epoch_ms_;
  std::deque<std::pair<double, int>> recent_results_;  // (time ms, frames)
  int64_t chunks_total_ = 0, frames_total_ = 0, requested_total_ = 0;
  int64_t epoch_chunks_ = 0, epoch_frames_ = 0;
  double first_request_ms_ = -1, last_result_ms_ = -1, epoch_start_ms_ = 0;
  // State.
  double next_tick_ = 0, next_display_ = 0, last_render_ = -1e9;
  bool quit_ = false, paused_ = false, show_gt_ = false, help_ = false, captured_ = false, dirty_ = true;
  bool warned_capture_ = false;
  std::string status_;
  double status_until_ = 0;
  // Recording.
  std::unique_ptr<media::Mp4Writer> recorder_;
  bool record_gt_ = false;
  double record_t0_ = 0;
  std::string record_path_;
  int record_count_ = 0;
  // Script and screenshots.
  std::unique_ptr<ScriptPlayer> script_;
  std::vector<std::string> screenshot_requests_;
  ViewerSummary summary_;
};

void Viewer::init() {
  // Model first: a missing model is the likeliest error and needs no window.
  const std::string model_path = resolve_model_path(o_.model_path);
  device_ = parse_device(o_.device);
  // The window's thread renders on the CPU too: by default the model leaves it one core
  // (measured on 2 cores: 19.4 generated fps with 1 model thread, 15.0 with 2).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = init_threads(o_.threads > 0 ? o_.threads : std::max(1, cores - 1));
  keep_freed_memory();  // K/V chunks come and go every chunk: no mmap/munmap each time
  device_desc_ = describe_device(device_);
  if (device_.is_cpu()) device_desc_ = str_cat("cpu (", threads, " threads)");
  dit::CausalDit model = worldkv::load_world_model(model_path, device_);
  const auto& mc = model->config();
  frame_w_ = mc.codec.image_width;
  frame_h_ = mc.codec.image_height;
  fov_deg_ = mc.cond.hfov_deg;
  model_desc_ = str_cat(mc.name, " (", fs::path(model_path).filename().string(), ")");
  policy_ = worldkv::parse_policy(o_.policy);
  seed_ = o_.seed;
  show_gt_ = o_.ground_truth;
  worldkv::SessionConfig sc;
  sc.memory.policy = policy_;
  sc.memory.bank.device = device_;
  sc.seed = seed_;
  auto session = std::make_unique<worldkv::WorldSession>(
      std::make_unique<worldkv::TinyDitAdapter>(model, dit::SamplerConfig{}, device_), sc);

  // Window.
  SDL_SetHint(SDL_HINT_RENDER_SCALE_QUALITY, "0");
  SDL_SetHint(SDL_HINT_VIDEO_X11_NET_WM_BYPASS_COMPOSITOR, "0");
  sdl_ = std::make_unique<SdlLibrary>(SDL_INIT_VIDEO | SDL_INIT_EVENTS);
  int w = o_.width, h = o_.height;
  if (w <= 0 || h <= 0) {
    int sw = 1280, sh = 720;
    if (o_.scale > 0) window_size_for_scale(o_.scale, frame_w_, frame_h_, sw, sh);
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
  wake_event_ = SDL_RegisterEvents(1);
  if (wake_event_ == static_cast<Uint32>(-1)) throw Error(sdl_error("SDL_RegisterEvents"));
  if (!o_.script.empty())
    script_ = std::make_unique<ScriptPlayer>(parse_script(o_.script, o_.script_source), SDL_GetWindowID(window_.get()));

  const Uint32 wake = wake_event_;
  gen_ = std::make_unique<Generator>(std::move(session), [wake] {
    SDL_Event e;
    SDL_zero(e);
    e.type = wake;
    SDL_PushEvent(&e);  // thread-safe; a full queue only delays the wake-up
  });
  new_scene(seed_);
  start_ = pose_;
  capture_mouse(true);
  if (!o_.record_path.empty()) start_recording(true);
}

void Viewer::new_scene(uint64_t seed) {
  seed_ = seed;
  raycaster_.reset();
  scene_ = std::make_unique<world::Scene>(world::generate_scene(world::random_world_params(seed)));
  raycaster_ = std::make_unique<world::Raycaster>(*scene_, world::RenderSpec{frame_w_, frame_h_, fov_deg_, 2});
  minimap_.set_scene(renderer_.get(), *scene_);
  pose_ = received_pose_ = start_pose(*scene_);
  trail_.clear();
  current_.reset();
  input_.clear();
  restart_epoch();
}

void Viewer::restart_epoch() {
  epoch_ = gen_->reset(seed_, policy_);
  prompt_next_ = true;
  pending_.clear();
  display_.clear();
  mem_.reset();
  epoch_ms_.clear();
  recent_results_.clear();
  epoch_chunks_ = epoch_frames_ = 0;
  epoch_start_ms_ = ms_since_start();
  dirty_ = true;
}

void Viewer::switch_policy(worldkv::Policy p) {
  policy_ = p;
  pose_ = received_pose_;  // frames in flight are dropped: continue from the last one received
  restart_epoch();
  set_status("policy " + worldkv::policy_name(p) + ": memory reset", ms_since_start());
}

void Viewer::capture_mouse(bool on) {
  if (SDL_SetRelativeMouseMode(on ? SDL_TRUE : SDL_FALSE) != 0 && on && !warned_capture_) {
    std::cerr << "wm_viewer: relative mouse mode unavailable (" << SDL_GetError()
              << "); mouse motion still turns while the window has the pointer\n";
    warned_capture_ = true;
  }
  captured_ = on;
  dirty_ = true;
}

void Viewer::start_recording(bool fatal) {
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
  record_gt_ = show_gt_;
  const int fps = o_.fps > 0 ? static_cast<int>(std::lround(o_.fps)) : 16;
  try {
    recorder_ = std::make_unique<media::Mp4Writer>(path, frame_w_ * (record_gt_ ? 2 : 1), frame_h_, fps,
                                                   std::max(1, o_.record_upscale));
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
  std::cerr << "wm_viewer: recording to " << path << (record_gt_ ? " (model | ground truth)" : "") << "\n";
}

void Viewer::stop_recording() {
  if (!recorder_) return;
  const int n = recorder_->frames_written();
  recorder_->close();
  recorder_.reset();
  summary_.recordings.push_back(record_path_);
  std::cerr << "wm_viewer: wrote " << n << " frames to " << record_path_ << "\n";
  set_status(str_cat("saved ", n, " frames"), ms_since_start());
}

void Viewer::handle(const SDL_Event& e) {
  const double now = ms_since_start();
  switch (e.type) {
    case SDL_QUIT:
      quit_ = true;
      break;
    case SDL_WINDOWEVENT:
      if (e.window.event == SDL_WINDOWEVENT_FOCUS_LOST && !script_) input_.clear();
      dirty_ = true;
      break;
    case SDL_MOUSEMOTION:
      if (captured_) input_.mouse_motion(e.motion.xrel);
      break;
    case SDL_MOUSEBUTTONDOWN:
      if (!captured_) capture_mouse(true);
      break;
    case SDL_KEYDOWN: {
      const SDL_Scancode sc = e.key.keysym.scancode;
      if (auto c = movement_control(sc)) {
        input_.press(*c, sc);
        break;
      }
      if (e.key.repeat) break;
      dirty_ = true;
      switch (e.key.keysym.sym) {
        case SDLK_ESCAPE: capture_mouse(false); break;
        case SDLK_1: switch_policy(worldkv::Policy::FullKv); break;
        case SDLK_2: switch_policy(worldkv::Policy::SlidingWindow); break;
        case SDLK_3: switch_policy(worldkv::Policy::WorldKv); break;
        case SDLK_4: switch_policy(worldkv::Policy::WorldKvC); break;
        case SDLK_5: switch_policy(worldkv::Policy::SinkRecent); break;
        case SDLK_6: switch_policy(worldkv::Policy::WorldKvAttn); break;
        case SDLK_g:
          show_gt_ = !show_gt_;
          gt_fresh_ = false;
          set_status(show_gt_ ? "ground truth shown" : "ground truth hidden", now);
          break;
        case SDLK_r:
          if (recorder_) stop_recording();
          else start_recording(false);
          break;
        case SDLK_n:
          new_scene(seed_ + 1);
          set_status(str_cat("new scene, seed ", seed_), now);
          break;
        case SDLK_p:
          paused_ = !paused_;
          next_tick_ = next_display_ = now;
          break;
        case SDLK_h: case SDLK_F1: help_ = !help_; break;
        case SDLK_q: quit_ = true; break;
        default: break;
      }
      break;
    }
    case SDL_KEYUP:
      if (auto c = movement_control(e.key.keysym.scancode)) input_.release(*c, e.key.keysym.scancode);
      break;
    default:
      break;
  }
}

void Viewer::tick_input(double now) {
  if (paused_ || !may_request()) return;
  const size_t F = static_cast<size_t>(gen_->frames_per_chunk());
  if (o_.fps > 0) {
    const double period = 1000.0 / o_.fps;
    while (next_tick_ <= now) {
      if (pending_.size() >= F) {
        next_tick_ = now;  // stalled on the model: the next sample is due as soon as there is room
        break;
      }
      pending_.push_back(input_.sample());
      next_tick_ += period;
      if (next_tick_ < now - period) next_tick_ = now;  // do not catch up after a stall
    }
  } else if (gen_->pending() == 0) {
    while (pending_.size() < F) pending_.push_back(input_.sample());
  }
  if (pending_.size() == F && gen_->pending() == 0) {
    ChunkRequest req;
    req.poses = world::integrate(*scene_, motion_, pose_, pending_);
    req.actions = std::move(pending_);
    pending_.clear();
    pose_ = req.poses.back();
    if (prompt_next_) {  // a new session starts from the ground-truth view of its first chunk
      for (auto& p : req.poses) req.prompt_frames.push_back(raycaster_->render(p));
      prompt_next_ = false;
    }
    gen_->submit(std::move(req));
    ++requested_total_;
    if (first_request_ms_ < 0) first_request_ms_ = now;
  }
}

void Viewer::take_results(double now) {
  while (auto r = gen_->poll()) {
    if (r->epoch != epoch_) continue;  // made stale by a reset
    if (!r->error.empty()) throw Error(str_cat("generation failed: ", r->error));
    worldkv::ChunkOutput& c = r->chunk;
    all_ms_.push_back(c.ms);
    epoch_ms_.push_back(c.ms);
    ++chunks_total_;
    ++epoch_chunks_;
    frames_total_ += static_cast<int64_t>(c.frames.size());
    epoch_frames_ += static_cast<int64_t>(c.frames.size());
    last_result_ms_ = now;
    recent_results_.emplace_back(now, static_cast<int>(c.frames.size()));
    while (recent_results_.size() > 1 && recent_results_.front().first < now - 3000) recent_results_.pop_front();
    mem_ = std::move(r->memory);
    for (size_t i = 0; i < c.frames.size(); ++i)
      display_.push_back(DisplayFrame{std::move(c.frames[i]), r->poses.at(i), c.index, static_cast<int>(i)});
    if (!r->poses.empty()) received_pose_ = r->poses.back();
    dirty_ = true;
  }
}

void Viewer::advance_display(double now) {
  if (paused_ || display_.empty()) return;
  if (o_.fps <= 0) {
    while (display_.size() > 1) {
      show(std::move(display_.front()));
      display_.pop_front();
    }
    show(std::move(display_.front()));
    display_.pop_front();
    return;
  }
  const size_t F = static_cast<size_t>(gen_->frames_per_chunk());
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

void Viewer::show(DisplayFrame f) {
  frame_tex_.upload(renderer_.get(), f.image.width, f.image.height, f.image.rgb.data());
  gt_fresh_ = false;
  if (show_gt_ || (recorder_ && record_gt_)) {
    raycaster_->render(f.pose, gt_image_);
    gt_tex_.upload(renderer_.get(), gt_image_.width, gt_image_.height, gt_image_.rgb.data());
    gt_fresh_ = true;
  }
  if (recorder_) {
    if (record_gt_) {
      Image both(f.image.width * 2, f.image.height);
      for (int y = 0; y < f.image.height; ++y) {
        std::copy_n(f.image.pixel(0, y), f.image.width * 3, both.pixel(0, y));
        std::copy_n(gt_image_.pixel(0, y), gt_image_.width * 3, both.pixel(f.image.width, y));
      }
      recorder_->write(both);
    } else {
      recorder_->write(f.image);
    }
  }
  if (trail_.empty() || position_distance(trail_.back(), f.pose) > 1e-9) trail_.push_back(f.pose);
  current_ = std::move(f);
  dirty_ = true;
}

void Viewer::render(double now) {
  using namespace palette;
  SDL_Renderer* r = renderer_.get();
  int w = 0, h = 0;
  SDL_GetRendererOutputSize(r, &w, &h);
  layout_ = compute_layout(w, h, frame_w_, frame_h_, show_gt_, o_.scale);
  const Layout& L = layout_;
  if (show_gt_ && current_ && !gt_fresh_) {
    raycaster_->render(current_->pose, gt_image_);
    gt_tex_.upload(r, gt_image_.width, gt_image_.height, gt_image_.rgb.data());
    gt_fresh_ = true;
  }

  set_color(r, kBackground);
  SDL_RenderClear(r);
  set_color(r, kPanel);
  SDL_RenderFillRect(r, &L.panel);

  // Frames with captions.
  const int cap_y = L.frame.y - kLabelHeight + 2;
  std::string cap = "MODEL";
  if (current_) cap += str_cat("  chunk ", current_->chunk, " frame ", current_->frame);
  font_->draw(L.frame.x, cap_y, cap, kAccent, 2);
  if (current_ && frame_tex_) {
    SDL_RenderCopy(r, frame_tex_.get(), nullptr, &L.frame);
  } else {
    set_color(r, kPanel);
    SDL_RenderFillRect(r, &L.frame);
    const std::string t = "generating the first chunk...";
    font_->draw(L.frame.x + (L.frame.w - BitmapFont::width(t, 2)) / 2, L.frame.y + L.frame.h / 2 - 8, t, kDim, 2);
  }
  if (show_gt_) {
    font_->draw(L.gt.x, cap_y, "GROUND TRUTH (raycaster)", kRecent, 2);
    if (current_ && gt_tex_) {
      SDL_RenderCopy(r, gt_tex_.get(), nullptr, &L.gt);
    } else {
      set_color(r, kPanel);
      SDL_RenderFillRect(r, &L.gt);
    }
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

  // HUD.
  HudInfo info;
  info.model = model_desc_;
  info.device = device_desc_;
  info.policy = worldkv::policy_name(policy_);
  info.seed = seed_;
  info.scene = str_cat(scene_->params.layout, " ", scene_->width, "x", scene_->height);
  info.chunks = epoch_chunks_;
  info.frames = epoch_frames_;
  if (!recent_results_.empty()) {
    int n = 0;  // frames received in the last 3 s (or since the reset, if later)
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
    info.model_fps = gen_->frames_per_chunk() * 1000.0 / std::max(s.mean, 1e-3);
  }
  info.pose = current_ ? current_->pose : pose_;
  info.memory = mem_ ? &*mem_ : nullptr;
  info.recording = recorder_ != nullptr;
  info.record_s = (now - record_t0_) / 1000.0;
  info.paused = paused_;
  info.captured = captured_;
  info.show_gt = show_gt_;
  if (now < status_until_) info.status = status_;
  draw_hud(r, *font_, L.hud, info);
  minimap_.draw(r, *font_, L.minimap, trail_, info.memory, info.pose, fov_deg_);
  draw_region_bar(r, *font_, L.bar, info.memory);
  if (L.graph.h > 0) {
    const size_t k = std::min<size_t>(epoch_ms_.size(), 240);
    draw_latency_graph(r, *font_, L.graph, std::vector<double>(epoch_ms_.end() - static_cast<long>(k), epoch_ms_.end()),
                       o_.fps > 0 ? gen_->frames_per_chunk() * 1000.0 / o_.fps : 0.0, info.memory);
  }
  if (help_) {
    const SDL_Rect over{L.frame.x, L.frame.y, (show_gt_ ? L.gt.x + L.gt.w : L.frame.x + L.frame.w) - L.frame.x, L.frame.h};
    draw_help(r, *font_, over);
  }
  for (const auto& p : screenshot_requests_) screenshot(p);
  screenshot_requests_.clear();
  SDL_RenderPresent(r);
  last_render_ = now;
  dirty_ = false;
}

void Viewer::screenshot(const std::string& path) {
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

ViewerSummary Viewer::run() {
  init();
  const bool scripted = script_ != nullptr;
  const bool has_limit = o_.chunks > 0 || o_.frames > 0;
  while (!quit_) {
    double now = ms_since_start();
    if (o_.timeout_s > 0 && now > o_.timeout_s * 1000.0)
      throw Error(str_cat("timed out after ", o_.timeout_s, " s (", chunks_total_, " chunks generated)"));
    if (script_) script_->update(now, chunks_total_, frames_total_, screenshot_requests_);
    if (!screenshot_requests_.empty()) dirty_ = true;

    // Sleep until an event, the next frame tick, the next frame to show, or a HUD refresh.
    double wait = 250;
    if (!paused_) {
      if (may_request() && o_.fps > 0 && pending_.size() < static_cast<size_t>(gen_->frames_per_chunk()))
        wait = std::min(wait, next_tick_ - now);
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
  s.model_fps = s.chunk_ms.mean > 0 ? gen_->frames_per_chunk() * 1000.0 / s.chunk_ms.mean : 0;
  s.delivered_fps = s.wall_s > 0 ? s.frames / s.wall_s : 0;
  s.policy = worldkv::policy_name(policy_);
  s.device = device_desc_;
  s.model = model_desc_;
  s.seed = seed_;
  s.start = start_;
  s.end = pose_;
  s.shown = current_ ? current_->pose : pose_;
  SDL_GetWindowSize(window_.get(), &s.win_w, &s.win_h);
  s.layout = layout_;
  s.ground_truth_shown = show_gt_;
  s.load_avg = load_average();
  capture_mouse(false);
  gen_.reset();  // joins the worker before the window goes
  return s;
}

}  // namespace

ViewerSummary run_viewer(const ViewerOptions& options) {
  if (is_mg2_model(options.model_path, options.mode)) return run_mg2_viewer(options);
  Viewer v(options);
  return v.run();
}

}  // namespace wm::viewer
