#include "viewer/tiny_view.h"

#include <cmath>
#include <filesystem>
#include <optional>

#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tools/rollout/world_adapter.h"
#include "worldkv/tiny_dit_adapter.h"

#ifndef WM_VIEWER_SOURCE_DIR
#define WM_VIEWER_SOURCE_DIR "."
#endif

namespace wm::viewer {
namespace fs = std::filesystem;

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

}  // namespace

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

TinyView::TinyView(const ViewerOptions& o) : o_(o) {
  setup_.header = "TINY DIT";
  setup_.free_clock_fps = 16;
  setup_.reference = true;
  setup_.mouse = true;
  setup_.keys = {"W", "S", "A", "D", "turn"};
  setup_.new_start = "new scene (seed + 1)";
  setup_.policy_switch = "memory reset, same place";
}

std::unique_ptr<worldkv::WorldSession> TinyView::load() {
  // Model first: a missing model is the likeliest error and needs no window.
  const std::string model_path = resolve_model_path(o_.model_path);
  const at::Device device = choose_device(o_, setup_.device);
  dit::CausalDit model = worldkv::load_world_model(model_path, device);
  const auto& mc = model->config();
  setup_.frame_w = mc.codec.image_width;
  setup_.frame_h = mc.codec.image_height;
  fov_deg_ = mc.cond.hfov_deg;
  setup_.model = fs::path(model_path).filename().string();
  setup_.title = str_cat(mc.name, " (", setup_.model, ")");
  worldkv::SessionConfig sc;
  sc.set_policy(o_.policy);
  sc.memory.bank.device = device;
  sc.seed = o_.seed;
  return std::make_unique<worldkv::WorldSession>(
      std::make_unique<worldkv::TinyDitAdapter>(model, dit::SamplerConfig{}, device), sc);
}

void TinyView::open(SDL_Renderer* r, uint64_t seed) {
  renderer_ = r;
  new_scene(seed);
}

void TinyView::new_scene(uint64_t seed) {
  seed_ = seed;
  raycaster_.reset();
  scene_ = std::make_unique<world::Scene>(world::generate_scene(world::random_world_params(seed)));
  raycaster_ = std::make_unique<world::Raycaster>(*scene_, world::RenderSpec{setup_.frame_w, setup_.frame_h, fov_deg_, 2});
  minimap_.set_scene(renderer_, *scene_);
  pose_ = start_ = viewer::start_pose(*scene_);
  input_.clear();
}

bool TinyView::press(SDL_Scancode key) {
  const auto c = movement_control(key);
  if (c) input_.press(*c, key);
  return c.has_value();
}

bool TinyView::release(SDL_Scancode key) {
  const auto c = movement_control(key);
  if (c) input_.release(*c, key);
  return c.has_value();
}

void TinyView::mouse_motion(double dx, double dy) {
  (void)dy;  // the tiny model turns only
  input_.mouse_motion(dx);
}

worldkv::FrameControl TinyView::sample() {
  const world::Action a = input_.sample();
  pose_ = world::step(*scene_, motion_, pose_, a);
  worldkv::FrameControl c;
  c.pose = rollout::model_pose(pose_);
  c.action = rollout::model_action(a);
  return c;
}

std::vector<Image> TinyView::prompt(const std::vector<worldkv::FrameControl>& first) {
  std::vector<Image> frames;  // a rollout starts from the ground-truth view of its first chunk
  for (const auto& c : first) frames.push_back(raycaster_->render(rollout::world_pose(c.pose)));
  return frames;
}

std::string TinyView::new_start(uint64_t& seed) {
  seed += 1;
  new_scene(seed);
  return str_cat("new scene, seed ", seed);
}

bool TinyView::restart(bool new_start, const worldkv::Pose* last) {
  if (new_start) return false;  // the new scene's start
  pose_ = last ? rollout::world_pose(*last) : start_;  // frames in flight are dropped
  return true;
}

worldkv::Pose TinyView::start_pose() const { return rollout::model_pose(start_); }

bool TinyView::reference(const worldkv::Pose& pose, Image& out) {
  raycaster_->render(rollout::world_pose(pose), out);
  return true;
}

std::vector<HudLine> TinyView::model_lines() const {
  return {{"scene", str_cat(scene_->params.layout, " ", scene_->width, "x", scene_->height, "  #", seed_)}};
}

std::vector<HudLine> TinyView::input_lines(const worldkv::FrameControl* shown) const {
  if (!shown) return {{"input", "-", palette::kDim}};
  const worldkv::Action& a = shown->action;
  std::string keys = a.forward > 0 ? "W" : a.forward < 0 ? "S" : ".";
  keys += a.strafe < 0 ? " A" : a.strafe > 0 ? " D" : " .";
  return {{"input", keys + fmt("  turn %+.1f", worldkv::degrees(a.yaw))}};
}

void TinyView::draw_panel(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::vector<worldkv::Pose>& track,
                          const MemorySnapshot* mem, const worldkv::Pose& pose) const {
  std::vector<world::Pose> trail;
  trail.reserve(track.size());
  for (const auto& p : track) trail.push_back(rollout::world_pose(p));
  minimap_.draw(r, font, area, trail, mem, rollout::world_pose(pose), fov_deg_);
}

std::string TinyView::help_keys() const {
  return "W A S D      move / strafe\n"
         "mouse        turn (click to capture)\n"
         "Left Right   turn;  Up Down  move\n";
}

std::vector<bool> TinyView::keys_on(const worldkv::FrameControl& c) const {
  const worldkv::Action& a = c.action;
  return {a.forward > 0, a.forward < 0, a.strafe < 0, a.strafe > 0, a.yaw != 0.0};
}

}  // namespace wm::viewer
