#include "viewer/mg2_input.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"

namespace wm::viewer {

std::vector<std::string> mg2_keyboard_names(const std::string& mode) {
  if (mode == "universal") return {"W", "S", "A", "D"};
  if (mode == "gta_drive") return {"W", "S"};
  if (mode == "templerun") return {"nomove", "jump", "slide", "turnleft", "turnright", "leftside", "rightside"};
  throw Error(str_cat("the viewer drives universal, gta_drive and templerun models, not '", mode, "'"));
}

Mg2InputState::Mg2InputState(std::string mode, Mg2InputConfig cfg)
    : mode_(std::move(mode)), cfg_(cfg), names_(mg2_keyboard_names(mode_)) {}

void Mg2InputState::press(Mg2Key k, int key) {
  keys_[static_cast<size_t>(k)].insert(key);
  tapped_[static_cast<size_t>(k)] = true;
}

void Mg2InputState::release(Mg2Key k, int key) { keys_[static_cast<size_t>(k)].erase(key); }

void Mg2InputState::mouse_motion(double dx_px, double dy_px) {
  if (mode_ != "universal") return;
  const double b = cfg_.backlog;
  pending_yaw_ = std::clamp(pending_yaw_ + dx_px * cfg_.per_px, -b, b);
  pending_pitch_ = std::clamp(pending_pitch_ - dy_px * cfg_.per_px, -b, b);  // mouse up looks up
}

void Mg2InputState::clear() {
  for (auto& k : keys_) k.clear();
  tapped_.fill(false);
  pending_pitch_ = pending_yaw_ = 0;
}

bool Mg2InputState::any(std::initializer_list<Mg2Key> ks) const {
  return std::any_of(ks.begin(), ks.end(), [&](Mg2Key k) { return active(k); });
}

// The mouse's share of a frame beside the keys' `keys`, within the cap; the rest stays pending.
double Mg2InputState::take_mouse(double& pending, double keys) {
  const double m = std::clamp(pending, -cfg_.cap - keys, cfg_.cap - keys);
  pending -= m;
  if (std::fabs(pending) < 1e-9) pending = 0;
  const double v = keys + m;
  return v == 0 ? 0.0 : v;  // no negative zero
}

worldkv::Mg2Input Mg2InputState::sample() {
  using K = Mg2Key;
  worldkv::Mg2Input in;
  in.keyboard.assign(names_.size(), 0.f);
  if (mode_ == "universal") {
    in.keyboard = {float(active(K::W)), float(active(K::S)), float(active(K::A)), float(active(K::D))};
    const double cap = cfg_.cap;
    const double pitch_keys = std::clamp(cfg_.arrow * (int(active(K::Up)) - int(active(K::Down))), -cap, cap);
    const double yaw_keys = std::clamp(cfg_.arrow * (int(active(K::Right)) - int(active(K::Left))), -cap, cap);
    in.pitch = static_cast<float>(take_mouse(pending_pitch_, pitch_keys));
    in.yaw = static_cast<float>(take_mouse(pending_yaw_, yaw_keys));
  } else if (mode_ == "gta_drive") {
    in.keyboard = {float(any({K::W, K::Up})), float(any({K::S, K::Down}))};
    const int steer = int(any({K::D, K::Right})) - int(any({K::A, K::Left}));
    in.yaw = steer == 0 ? 0.f : static_cast<float>(cfg_.arrow * steer);
  } else {  // templerun
    // jump, slide, turnleft, turnright, leftside, rightside: the first active wins.
    const bool on[6] = {any({K::Space, K::W, K::Up}), any({K::S, K::Down}), any({K::A, K::Left}),
                        any({K::D, K::Right}),        active(K::Q),         active(K::E)};
    int chosen = 0;  // nomove
    for (int a = 0; a < 6 && chosen == 0; ++a)
      if (on[a]) chosen = a + 1;
    in.keyboard[static_cast<size_t>(chosen)] = 1.f;
  }
  tapped_.fill(false);
  return in;
}

}  // namespace wm::viewer
