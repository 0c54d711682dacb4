#include "viewer/mg2_keys_view.h"

#include "viewer/palette.h"

namespace wm::viewer {

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

Mg2KeysView::Mg2KeysView(const ViewerOptions& o, const std::string& mode) : o_(o) {
  setup_.reference = false;
  set_mode(mode);
}

void Mg2KeysView::set_mode(const std::string& mode) {
  input_ = std::make_unique<Mg2InputState>(mode);  // throws for a mode the viewer cannot drive
  mode_ = mode;
  setup_.mouse = mode == "universal";
  setup_.keys = input_->keyboard_names();
}

bool Mg2KeysView::press(SDL_Scancode key) {
  const auto k = mg2_key(key, mode_);
  if (k) input_->press(*k, key);
  return k.has_value();
}

bool Mg2KeysView::release(SDL_Scancode key) {
  const auto k = mg2_key(key, mode_);
  if (k) input_->release(*k, key);
  return k.has_value();
}

worldkv::FrameControl Mg2KeysView::sample() {
  worldkv::FrameControl c;
  c.mg2 = input_->sample();
  return c;
}

std::vector<HudLine> Mg2KeysView::input_lines(const worldkv::FrameControl* shown) const {
  if (!shown) return {{"input", "-", palette::kDim}};
  std::string v = format_mg2_keys(shown->mg2, input_->keyboard_names());
  if (mode_ != "templerun") v += fmt("  p %+.2f", shown->mg2.pitch) + fmt("  y %+.2f", shown->mg2.yaw);
  return {{"input", v}};
}

void Mg2KeysView::draw_panel(SDL_Renderer* r, const Font& font, const SDL_Rect& area,
                             const std::vector<worldkv::Pose>& track, const MemorySnapshot* mem,
                             const worldkv::Pose& pose) const {
  draw_mg2_track(r, font, area, track, mem, pose);
}

std::vector<bool> Mg2KeysView::keys_on(const worldkv::FrameControl& c) const {
  std::vector<bool> on(setup_.keys.size(), false);
  for (size_t j = 0; j < on.size() && j < c.mg2.keyboard.size(); ++j) on[j] = c.mg2.keyboard[j] > 0.5f;
  return on;
}

}  // namespace wm::viewer
