#include "viewer/input.h"

#include <algorithm>
#include <cmath>

namespace wm::viewer {

void InputState::press(Control c, int key) {
  keys_[static_cast<int>(c)].insert(key);
  tapped_[static_cast<int>(c)] = true;
}

void InputState::release(Control c, int key) { keys_[static_cast<int>(c)].erase(key); }

void InputState::mouse_motion(double dx_px) { pending_yaw_ += dx_px * cfg_.mouse_deg_per_px; }

void InputState::clear() {
  for (auto& k : keys_) k.clear();
  tapped_.fill(false);
  pending_yaw_ = 0;
}

world::Action InputState::sample() {
  world::Action a;
  a.forward = static_cast<int>(active(Control::Forward)) - static_cast<int>(active(Control::Back));
  a.strafe = static_cast<int>(active(Control::Right)) - static_cast<int>(active(Control::Left));
  const double arrows =
      cfg_.turn_deg_per_frame * (static_cast<int>(held(Control::TurnRight)) - static_cast<int>(held(Control::TurnLeft)));
  // A tapped arrow (down and up between two samples) still turns one frame's worth.
  const double tap_turn = held(Control::TurnRight) || held(Control::TurnLeft)
                              ? 0.0
                              : cfg_.turn_deg_per_frame * (static_cast<int>(tapped_[static_cast<int>(Control::TurnRight)]) -
                                                           static_cast<int>(tapped_[static_cast<int>(Control::TurnLeft)]));
  const double cap = cfg_.max_turn_deg_per_frame > 0 ? cfg_.max_turn_deg_per_frame : 1e9;
  const double keys = std::clamp(arrows + tap_turn, -cap, cap);
  // The mouse's share: what fits under the cap beside the keys, in whole quanta; the rest waits.
  double m = std::clamp(pending_yaw_, -cap - keys, cap - keys);
  if (cfg_.yaw_quantum_deg > 0) m = std::trunc(m / cfg_.yaw_quantum_deg) * cfg_.yaw_quantum_deg;
  pending_yaw_ -= m;
  const double d = keys + m;
  a.dyaw_deg = d == 0 ? 0.0 : d;  // no negative zero
  tapped_.fill(false);
  return a;
}

}  // namespace wm::viewer
