#include "viewer/app.h"

#include <SDL.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/media/mp4_writer.h"
#include "tools/media/png.h"
#include "viewer/font.h"
#include "viewer/generator.h"
#include "viewer/hud.h"
#include "tools/rollout/lingbot_start.h"
#include "viewer/lingbot_view.h"
#include "viewer/mg2_view.h"
#include "viewer/palette.h"
#include "viewer/script.h"
#include "viewer/sdl_handles.h"
#include "viewer/tiny_view.h"

namespace wm::viewer {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

at::Device choose_device(const ViewerOptions& o, std::string& desc) {
  const at::Device device = parse_device(o.device);
  // The window's thread renders on the CPU too: by default the model leaves it one core
  // (measured on 2 cores with the tiny model: 19.4 generated fps with 1 model thread, 15.0 with 2).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = init_threads(o.threads > 0 ? o.threads : std::max(1, cores - 1));
  keep_freed_memory();  // K/V chunks come and go every chunk: no mmap/munmap each time
  desc = device.is_cpu() ? str_cat("cpu (", threads, " threads)") : describe_device(device);
  return device;
}

std::unique_ptr<ModelView> make_view(const ViewerOptions& options) {
  if (rollout::is_lingbot_folder(options.model_path)) return std::make_unique<LingbotView>(options);
  if (is_mg2_model(options.model_path, options.mode)) return std::make_unique<Mg2View>(options);
  return std::make_unique<TinyView>(options);
}

namespace {

// The digit keys' policies (a view may refuse some: the tiny model has no window of its own).
const char* const kPolicyKeys[] = {"native", "full_kv", "sliding_window", "worldkv", "worldkv_c", "sink_recent",
                                   "worldkv_attn"};

std::optional<std::string> policy_key(SDL_Keycode k) {
  if (k < SDLK_0 || k > SDLK_6) return std::nullopt;
  return std::string(kPolicyKeys[k - SDLK_0]);
}

}  // namespace

std::string help_text(const ModelView& view) {
  const ViewSetup& s = view.setup();
  std::string t = view.help_keys();
  if (s.mouse) t += "Esc          release the mouse\n";
  int column = 0;
  for (int k = 0; k <= 6; ++k) {
    if (!view.accepts_policy(kPolicyKeys[k])) continue;
    std::string item = std::to_string(k) + " " + kPolicyKeys[k];
    if (column == 0) item.resize(std::max<size_t>(item.size() + 1, 17), ' ');
    t += item + (column == 1 ? "\n" : "");
    column = 1 - column;
  }
  if (column == 1) t += "\n";
  t += "             (policy: " + s.policy_switch + ")\n";
  if (s.reference) t += "G            ground truth beside\n";
  return t + "R            record MP4 on/off\n" + "N            " + s.new_start + "\n" +
         "P            pause\n"
         "H / F1       this help\n"
         "Q, Ctrl+Q    quit";
}

namespace {

struct DisplayFrame {
  Image image;
  worldkv::FrameControl control;
  worldkv::Pose pose;  // retrieval pose
  int64_t chunk = -1;
  int frame = 0;  // within the chunk
};

// The viewer's run: the window, the loop and everything in it but the model view's part.
class App {
 public:
  App(const ViewerOptions& o, std::unique_ptr<ModelView> view) : o_(o), view_(std::move(view)) {}
  // The worker goes first: its wake-up callback pushes SDL events.
  ~App() { gen_.reset(); }
  App(const App&) = delete;
  App& operator=(const App&) = delete;
  ViewerSummary run();

 private:
  void open_window();
  void start_worker(std::unique_ptr<worldkv::WorldSession> session);
  // Restarts the rollout under `policy`; returns whether it goes on from where it was.
  bool restart(const std::string& policy, bool new_start);
  void handle(const SDL_Event& e);
  void handle_key(const SDL_KeyboardEvent& k);
  void tick_input(double now);
  void submit(double now);
  void take_results(double now);
  void take(ChunkResult& r, double now);
  void advance_display(double now);
  void show(DisplayFrame f);
  void render(double now);
  void render_frames();
  HudInfo hud_info(double now) const;
  void screenshot(const std::string& path);
  void start_recording(bool fatal);
  void stop_recording();
  void capture_mouse(bool on);
  double wait_ms(double now) const;
  ViewerSummary summarize_run();
  void set_status(const std::string& s, double now) {
    status_ = s;
    status_until_ = now + 3000;
    dirty_ = true;
  }
  bool limit_reached() const {
    return (o_.chunks > 0 && chunks_total_ >= o_.chunks) || (o_.frames > 0 && frames_total_ >= o_.frames);
  }
  bool may_request() const {
    return !(o_.chunks > 0 && requested_total_ >= o_.chunks) && !(o_.frames > 0 && requested_frames_ >= o_.frames);
  }
  size_t controls_needed() const { return static_cast<size_t>(gen_->controls_for_chunk(epoch_requested_)); }
  double ms_since_start() const { return std::chrono::duration<double, std::milli>(Clock::now() - t_start_).count(); }

  ViewerOptions o_;
  std::unique_ptr<ModelView> view_;
  ViewSetup setup_;
  Clock::time_point t_start_ = Clock::now();
  // Generation.
  std::unique_ptr<Generator> gen_;
  std::string policy_;
  uint64_t seed_ = 1, epoch_ = 0;
  int64_t epoch_requested_ = 0;  // chunks requested since the last restart
  std::vector<worldkv::FrameControl> pending_;
  bool prompt_next_ = true;      // the next request starts a rollout
  std::optional<worldkv::Pose> received_;  // retrieval pose of the last frame received
  worldkv::Pose start_;
  // Display.
  std::unique_ptr<SdlLibrary> sdl_;
  WindowPtr window_;
  RendererPtr renderer_;
  std::unique_ptr<Font> font_;
  StreamingTexture frame_tex_, gt_tex_;
  Uint32 wake_event_ = 0;
  std::deque<DisplayFrame> display_;
  std::optional<DisplayFrame> current_;
  Image gt_image_;
  bool gt_fresh_ = false;
  std::vector<worldkv::Pose> track_;
  std::optional<MemorySnapshot> mem_;
  Layout layout_;
  // Stats.
  std::vector<double> all_ms_, epoch_ms_, model_ms_, decode_ms_;
  std::deque<std::pair<double, int>> recent_results_;  // (time ms, frames)
  int64_t chunks_total_ = 0, frames_total_ = 0, requested_total_ = 0, requested_frames_ = 0, controls_total_ = 0;
  int64_t epoch_chunks_ = 0, epoch_frames_ = 0;
  std::vector<int64_t> key_frames_;
  worldkv::ChunkOutput last_;  // the figures of the last chunk received (no frames)
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

void App::open_window() {
  SDL_SetHint(SDL_HINT_RENDER_SCALE_QUALITY, "0");
  SDL_SetHint(SDL_HINT_VIDEO_X11_NET_WM_BYPASS_COMPOSITOR, "0");
  sdl_ = std::make_unique<SdlLibrary>(SDL_INIT_VIDEO | SDL_INIT_EVENTS);
  int w = o_.width, h = o_.height;
  if (w <= 0 || h <= 0) {
    int sw = 1280, sh = 720;
    // Room for two frames side by side with a ground truth, one without.
    const int fw = setup_.reference ? setup_.frame_w : (setup_.frame_w + 1) / 2;
    if (o_.scale > 0) window_size_for_scale(o_.scale, fw, setup_.frame_h, sw, sh);
    if (w <= 0) w = sw;
    if (h <= 0) h = sh;
  }
  window_.reset(SDL_CreateWindow(("wm_viewer - " + setup_.title).c_str(), SDL_WINDOWPOS_CENTERED, SDL_WINDOWPOS_CENTERED,
                                 w, h, SDL_WINDOW_SHOWN | SDL_WINDOW_RESIZABLE));
  if (!window_) throw Error(sdl_error("SDL_CreateWindow"));
  if (!o_.software) renderer_.reset(SDL_CreateRenderer(window_.get(), -1, SDL_RENDERER_ACCELERATED));
  if (!renderer_) renderer_.reset(SDL_CreateRenderer(window_.get(), -1, SDL_RENDERER_SOFTWARE));
  if (!renderer_) throw Error(sdl_error("SDL_CreateRenderer"));
  font_ = std::make_unique<Font>(renderer_.get(), font_path());
  wake_event_ = SDL_RegisterEvents(1);
  if (wake_event_ == static_cast<Uint32>(-1)) throw Error(sdl_error("SDL_RegisterEvents"));
  if (!o_.script.empty())
    script_ = std::make_unique<ScriptPlayer>(parse_script(o_.script, o_.script_source), SDL_GetWindowID(window_.get()));
}

void App::start_worker(std::unique_ptr<worldkv::WorldSession> session) {
  const Uint32 wake = wake_event_;
  gen_ = std::make_unique<Generator>(std::move(session), [wake] {
    SDL_Event e;
    SDL_zero(e);
    e.type = wake;
    SDL_PushEvent(&e);  // thread-safe; a full queue only delays the wake-up
  });
  key_frames_.assign(setup_.keys.size(), 0);
}

bool App::restart(const std::string& policy, bool new_start) {
  const bool continues = view_->restart(new_start, received_ ? &*received_ : nullptr);
  policy_ = policy;
  epoch_ = gen_->reset(seed_, policy_);
  epoch_requested_ = 0;
  // Requests in flight are dropped: only what was received counts against --chunks and --frames.
  requested_total_ = chunks_total_;
  requested_frames_ = frames_total_;
  prompt_next_ = true;
  pending_.clear();
  display_.clear();
  mem_.reset();
  epoch_ms_.clear();
  recent_results_.clear();
  epoch_chunks_ = epoch_frames_ = 0;
  epoch_start_ms_ = ms_since_start();
  if (!continues) {
    current_.reset();
    track_.clear();
    received_.reset();
  }
  dirty_ = true;
  return continues;
}

void App::capture_mouse(bool on) {
  if (SDL_SetRelativeMouseMode(on ? SDL_TRUE : SDL_FALSE) != 0 && on && !warned_capture_) {
    std::cerr << "wm_viewer: relative mouse mode unavailable (" << SDL_GetError()
              << "); mouse motion still steers while the window has the pointer\n";
    warned_capture_ = true;
  }
  captured_ = on;
  dirty_ = true;
}

void App::start_recording(bool fatal) {
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
  const int fps = static_cast<int>(std::lround(o_.fps > 0 ? o_.fps : setup_.free_clock_fps));
  try {
    recorder_ = std::make_unique<media::Mp4Writer>(path, setup_.frame_w * (record_gt_ ? 2 : 1), setup_.frame_h, fps,
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

void App::stop_recording() {
  if (!recorder_) return;
  const int n = recorder_->frames_written();
  recorder_->close();
  recorder_.reset();
  summary_.recordings.push_back(record_path_);
  std::cerr << "wm_viewer: wrote " << n << " frames to " << record_path_ << "\n";
  set_status(str_cat("saved ", n, " frames"), ms_since_start());
}

void App::handle(const SDL_Event& e) {
  switch (e.type) {
    case SDL_QUIT:
      quit_ = true;
      break;
    case SDL_WINDOWEVENT:
      if (e.window.event == SDL_WINDOWEVENT_FOCUS_LOST && !script_) view_->clear_input();
      dirty_ = true;
      break;
    case SDL_MOUSEMOTION:
      if (captured_) view_->mouse_motion(e.motion.xrel, e.motion.yrel);
      break;
    case SDL_MOUSEBUTTONDOWN:
      if (!captured_ && setup_.mouse) capture_mouse(true);
      break;
    case SDL_KEYDOWN:
      handle_key(e.key);
      break;
    case SDL_KEYUP:
      view_->release(e.key.keysym.scancode);
      break;
    default:
      break;
  }
}

void App::handle_key(const SDL_KeyboardEvent& k) {
  const double now = ms_since_start();
  const SDL_Keycode sym = k.keysym.sym;
  if (sym == SDLK_q && (k.keysym.mod & KMOD_CTRL)) {
    quit_ = true;
    return;
  }
  if (view_->press(k.keysym.scancode) || k.repeat) return;  // a steering key (templerun's Q among them)
  dirty_ = true;
  if (auto p = policy_key(sym)) {
    if (!view_->accepts_policy(*p)) return;
    restart(*p, false);
    set_status("policy " + *p + ": " + setup_.policy_switch, now);
    return;
  }
  switch (sym) {
    case SDLK_ESCAPE: capture_mouse(false); break;
    case SDLK_g:
      if (!setup_.reference) break;
      show_gt_ = !show_gt_;
      gt_fresh_ = false;
      set_status(show_gt_ ? "ground truth shown" : "ground truth hidden", now);
      break;
    case SDLK_r:
      if (recorder_) stop_recording();
      else start_recording(false);
      break;
    case SDLK_n: {
      const std::string what = view_->new_start(seed_);
      restart(policy_, true);
      set_status(what, now);
      break;
    }
    case SDLK_p:
      paused_ = !paused_;
      next_tick_ = next_display_ = now;
      break;
    case SDLK_h: case SDLK_F1: help_ = !help_; break;
    case SDLK_q: quit_ = true; break;
    default: break;
  }
}

void App::tick_input(double now) {
  if (paused_ || !may_request()) return;
  const size_t need = controls_needed();
  if (o_.fps > 0) {
    const double period = 1000.0 / o_.fps;
    while (next_tick_ <= now) {
      if (pending_.size() >= need) {
        next_tick_ = now;  // stalled on the model: the next sample is due as soon as there is room
        break;
      }
      pending_.push_back(view_->sample());
      next_tick_ += period;
      if (next_tick_ < now - period) next_tick_ = now;  // do not catch up after a stall
    }
  } else if (gen_->pending() == 0) {
    while (pending_.size() < need) pending_.push_back(view_->sample());
  }
  if (pending_.size() == need && gen_->pending() == 0) submit(now);
}

void App::submit(double now) {
  ChunkRequest req;
  req.controls = std::move(pending_);
  pending_.clear();
  if (prompt_next_) {  // a rollout may start from given frames (the tiny model's ground truth)
    req.prompt_frames = view_->prompt(req.controls);
    prompt_next_ = false;
  }
  requested_frames_ += static_cast<int64_t>(req.controls.size());
  gen_->submit(std::move(req));
  ++epoch_requested_;
  ++requested_total_;
  if (first_request_ms_ < 0) first_request_ms_ = now;
}

void App::take_results(double now) {
  while (auto r = gen_->poll()) {
    if (r->epoch != epoch_) continue;  // made stale by a restart
    if (!r->error.empty()) throw Error(str_cat("generation failed: ", r->error));
    take(*r, now);
  }
}

void App::take(ChunkResult& r, double now) {
  worldkv::ChunkOutput& c = r.chunk;
  const size_t n = c.frames.size();
  WM_CHECK(n == r.controls.size() && c.poses.size() == n, "chunk ", c.index, ": ", n, " frames for ",
           r.controls.size(), " controls");
  all_ms_.push_back(c.ms);
  epoch_ms_.push_back(c.ms);
  model_ms_.push_back(c.model_ms);
  decode_ms_.push_back(c.decode_ms);
  ++chunks_total_;
  ++epoch_chunks_;
  frames_total_ += static_cast<int64_t>(n);
  epoch_frames_ += static_cast<int64_t>(n);
  last_result_ms_ = now;
  recent_results_.emplace_back(now, static_cast<int>(n));
  while (recent_results_.size() > 1 && recent_results_.front().first < now - 3000) recent_results_.pop_front();
  mem_ = std::move(r.memory);
  for (const auto& control : r.controls) {
    ++controls_total_;
    const std::vector<bool> on = view_->keys_on(control);
    for (size_t j = 0; j < key_frames_.size() && j < on.size(); ++j) key_frames_[j] += on[j];
  }
  for (size_t i = 0; i < n; ++i)
    display_.push_back(DisplayFrame{std::move(c.frames[i]), r.controls[i], c.poses[i], c.index, static_cast<int>(i)});
  if (n > 0) received_ = c.poses.back();
  c.frames.clear();
  last_ = std::move(c);
  dirty_ = true;
}

void App::advance_display(double now) {
  if (paused_ || display_.empty()) return;
  if (o_.fps <= 0) {
    while (!display_.empty()) {
      show(std::move(display_.front()));
      display_.pop_front();
    }
    return;
  }
  const size_t F = static_cast<size_t>(gen_->controls_for_chunk(1));
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

void App::show(DisplayFrame f) {
  frame_tex_.upload(renderer_.get(), f.image.width, f.image.height, f.image.rgb.data());
  gt_fresh_ = false;
  if ((show_gt_ || (recorder_ && record_gt_)) && view_->reference(f.pose, gt_image_)) {
    gt_tex_.upload(renderer_.get(), gt_image_.width, gt_image_.height, gt_image_.rgb.data());
    gt_fresh_ = true;
  }
  if (recorder_ && record_gt_ && gt_fresh_) {
    Image both(f.image.width * 2, f.image.height);
    for (int y = 0; y < f.image.height; ++y) {
      std::copy_n(f.image.pixel(0, y), f.image.width * 3, both.pixel(0, y));
      std::copy_n(gt_image_.pixel(0, y), gt_image_.width * 3, both.pixel(f.image.width, y));
    }
    recorder_->write(both);
  } else if (recorder_) {
    recorder_->write(f.image);
  }
  const bool moved = track_.empty() || std::hypot(track_.back().x - f.pose.x, track_.back().y - f.pose.y) > 1e-9;
  if (moved) track_.push_back(f.pose);
  current_ = std::move(f);
  dirty_ = true;
}

// The frames with their captions (the model's, the ground truth's when shown), or the wait.
void App::render_frames() {
  using namespace palette;
  SDL_Renderer* r = renderer_.get();
  const Layout& L = layout_;
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
    font_->draw(L.frame.x + (L.frame.w - font_->width(t, 2)) / 2, L.frame.y + L.frame.h / 2 - 8, t, kDim, 2);
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
  if (paused_) draw_banner(r, *font_, L.frame, "PAUSED (P)", kRetrieved);
}

HudInfo App::hud_info(double now) const {
  HudInfo info;
  info.header = setup_.header;
  info.model = setup_.model;
  info.device = setup_.device;
  info.policy = policy_;
  info.model_lines = view_->model_lines();
  info.input_lines = view_->input_lines(current_ ? &current_->control : nullptr);
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
    const auto st = summarize(std::vector<double>(epoch_ms_.end() - static_cast<long>(k), epoch_ms_.end()));
    info.last_ms = epoch_ms_.back();
    info.p50_ms = st.p50;
    info.p90_ms = st.p90;
    info.model_fps = gen_->controls_for_chunk(1) * 1000.0 / std::max(st.mean, 1e-3);
    info.model_ms = last_.model_ms;
    info.decode_ms = last_.decode_ms;
  }
  info.pose = current_ ? current_->pose : received_.value_or(start_);
  info.window_bytes = last_.window_bytes;
  info.state_label = setup_.state_label;
  info.state_bytes = last_.state_bytes;
  info.memory = mem_ ? &*mem_ : nullptr;
  info.recording = recorder_ != nullptr;
  info.record_s = (now - record_t0_) / 1000.0;
  info.paused = paused_;
  info.captured = captured_;
  info.mouse = setup_.mouse;
  info.show_gt = show_gt_;
  if (now < status_until_) info.status = status_;
  return info;
}

void App::render(double now) {
  using namespace palette;
  SDL_Renderer* r = renderer_.get();
  int w = 0, h = 0;
  SDL_GetRendererOutputSize(r, &w, &h);
  layout_ = compute_layout(w, h, setup_.frame_w, setup_.frame_h, show_gt_, o_.scale);
  const Layout& L = layout_;
  if (show_gt_ && current_ && !gt_fresh_ && view_->reference(current_->pose, gt_image_)) {
    gt_tex_.upload(r, gt_image_.width, gt_image_.height, gt_image_.rgb.data());
    gt_fresh_ = true;
  }
  set_color(r, kBackground);
  SDL_RenderClear(r);
  set_color(r, kPanel);
  SDL_RenderFillRect(r, &L.panel);
  render_frames();
  const HudInfo info = hud_info(now);
  draw_hud(r, *font_, L.hud, info);
  view_->draw_panel(r, *font_, L.minimap, track_, info.memory, info.pose);
  draw_region_bar(r, *font_, L.bar, info.memory);
  if (L.graph.h > 0) {
    const size_t k = std::min<size_t>(epoch_ms_.size(), 240);
    draw_latency_graph(r, *font_, L.graph, std::vector<double>(epoch_ms_.end() - static_cast<long>(k), epoch_ms_.end()),
                       o_.fps > 0 ? gen_->controls_for_chunk(1) * 1000.0 / o_.fps : 0.0, info.memory);
  }
  if (help_) {
    const SDL_Rect over{L.frame.x, L.frame.y, (show_gt_ ? L.gt.x + L.gt.w : L.frame.x + L.frame.w) - L.frame.x, L.frame.h};
    draw_help(r, *font_, over, help_text(*view_));
  }
  for (const auto& p : screenshot_requests_) screenshot(p);
  screenshot_requests_.clear();
  SDL_RenderPresent(r);
  last_render_ = now;
  dirty_ = false;
}

void App::screenshot(const std::string& path) {
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

// How long the loop may sleep: until an event, the next input tick, the next frame to show, or
// a HUD refresh.
double App::wait_ms(double now) const {
  double wait = 250;
  if (!paused_) {
    if (may_request() && o_.fps > 0 && pending_.size() < controls_needed()) wait = std::min(wait, next_tick_ - now);
    if (!display_.empty()) wait = std::min(wait, o_.fps > 0 ? next_display_ - now : 0.0);
  }
  if (script_) wait = std::min(wait, 10.0);
  if (dirty_) wait = std::min(wait, std::max(0.0, last_render_ + 15 - now));
  return wait;
}

ViewerSummary App::summarize_run() {
  ViewerSummary& s = summary_;
  const worldkv::ModelInfo& mi = gen_->info();
  s.kind = mi.kind;
  s.name = mi.name;
  s.model = setup_.title;
  s.chunks = chunks_total_;
  s.frames = frames_total_;
  s.controls = controls_total_;
  s.wall_s = first_request_ms_ >= 0 && last_result_ms_ > first_request_ms_ ? (last_result_ms_ - first_request_ms_) / 1000.0 : 0;
  s.chunk_ms = summarize(all_ms_);
  s.model_ms_mean = summarize(model_ms_).mean;
  s.decode_ms_mean = summarize(decode_ms_).mean;
  double total_ms = 0;
  for (double v : all_ms_) total_ms += v;
  s.model_fps = total_ms > 0 ? s.frames * 1000.0 / total_ms : 0;
  s.delivered_fps = s.wall_s > 0 ? s.frames / s.wall_s : 0;
  s.policy = policy_;
  s.device = setup_.device;
  s.seed = seed_;
  s.start = start_;
  s.end = received_.value_or(start_);
  s.shown = current_ ? current_->pose : s.end;
  SDL_GetWindowSize(window_.get(), &s.win_w, &s.win_h);
  s.layout = layout_;
  s.ground_truth_shown = show_gt_;
  s.load_avg = load_average();
  for (size_t j = 0; j < setup_.keys.size(); ++j) s.keys.emplace_back(setup_.keys[j], key_frames_[j]);
  s.window_bytes = last_.window_bytes;
  s.state_bytes = last_.state_bytes;
  s.bank_bytes = last_.bank_bytes;
  return s;
}

ViewerSummary App::run() {
  // The model first: a missing or contradicting file is the likeliest error and needs no window.
  std::unique_ptr<worldkv::WorldSession> session = view_->load();
  setup_ = view_->setup();
  policy_ = session->config().policy_name();
  seed_ = o_.seed;
  show_gt_ = o_.ground_truth && setup_.reference;
  open_window();
  view_->open(renderer_.get(), seed_);
  start_ = view_->start_pose();
  start_worker(std::move(session));
  capture_mouse(setup_.mouse);
  if (!o_.record_path.empty()) start_recording(true);
  const bool has_limit = o_.chunks > 0 || o_.frames > 0;
  while (!quit_) {
    double now = ms_since_start();
    if (o_.timeout_s > 0 && now > o_.timeout_s * 1000.0)
      throw Error(str_cat("timed out after ", o_.timeout_s, " s (", chunks_total_, " chunks generated)"));
    if (script_) script_->update(now, chunks_total_, frames_total_, screenshot_requests_);
    if (!screenshot_requests_.empty()) dirty_ = true;
    SDL_Event e;
    if (SDL_WaitEventTimeout(&e, static_cast<int>(std::clamp(wait_ms(now), 1.0, 250.0)))) {
      handle(e);
      while (!quit_ && SDL_PollEvent(&e)) handle(e);
    }
    if (quit_) break;
    now = ms_since_start();
    take_results(now);
    advance_display(now);
    // A script step that waited for the chunks just taken (`wait 1c; press 3`) acts before the
    // next request goes out: otherwise, with the frame clock free, that request is made from the
    // keys before it, and a restart's key leaves the worker a whole stale chunk to finish first.
    if (script_) {
      script_->update(now, chunks_total_, frames_total_, screenshot_requests_);
      while (!quit_ && SDL_PollEvent(&e)) handle(e);
      if (quit_) break;
    }
    tick_input(now);
    if (has_limit ? limit_reached() : (script_ && script_->done())) break;
    if ((dirty_ && now - last_render_ >= 15) || now - last_render_ >= 500) render(now);
  }
  // Show whatever was generated but not yet shown, then the final screenshot.
  while (!display_.empty()) {
    show(std::move(display_.front()));
    display_.pop_front();
  }
  if (!o_.screenshot_path.empty()) screenshot_requests_.push_back(o_.screenshot_path);
  render(ms_since_start());
  stop_recording();
  ViewerSummary s = summarize_run();
  capture_mouse(false);
  gen_.reset();  // joins the worker before the window goes
  return s;
}

}  // namespace

ViewerSummary run_viewer(const ViewerOptions& options) {
  App app(options, make_view(options));
  return app.run();
}

}  // namespace wm::viewer
