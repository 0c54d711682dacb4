#pragma once
// From held keys and mouse motion to one world::Action per frame. The window's event loop
// reports key presses/releases and mouse motion as they come; the frame clock calls sample()
// once per generated frame (16 fps), so input held between chunks steers the next chunk.
// Pure logic, no SDL: testable alone.
#include <array>
#include <set>

#include "tools/world/actions.h"

namespace wm::viewer {

enum class Control { Forward, Back, Left, Right, TurnLeft, TurnRight };
constexpr int kControls = 6;

struct InputConfig {
  double mouse_deg_per_px = 0.15;      // yaw per pixel of relative mouse motion (+ = right)
  double turn_deg_per_frame = 7.5;     // yaw per frame while an arrow key is held
  double max_turn_deg_per_frame = 15;  // a frame's yaw is capped (the trained range); the rest carries over
  double yaw_quantum_deg = 0.5;        // yaw deltas are whole multiples of this (0: none), so turns add up exactly
};

class InputState {
 public:
  explicit InputState(InputConfig cfg = {}) : cfg_(cfg) {}

  // Key `key` (any id, e.g. an SDL scancode) that drives control c went down / up. Repeats are
  // harmless; a control is held while any of its keys is.
  void press(Control c, int key);
  void release(Control c, int key);
  // Relative mouse motion in pixels (+ = right).
  void mouse_motion(double dx_px);
  // Releases every key and drops pending mouse motion (focus lost, scene reset).
  void clear();

  bool held(Control c) const { return !keys_[static_cast<int>(c)].empty(); }
  // Yaw in degrees still waiting to be applied (mouse motion beyond the per-frame cap).
  double pending_yaw_deg() const { return pending_yaw_; }

  // The next frame's action: W/S and A/D held now or tapped since the last sample (both of a
  // pair cancel), yaw = arrow keys + mouse motion since the last sample, capped and quantised
  // (the remainder carries over). Clears the taps.
  world::Action sample();

  const InputConfig& config() const { return cfg_; }

 private:
  bool active(Control c) const { return held(c) || tapped_[static_cast<int>(c)]; }

  InputConfig cfg_;
  std::array<std::set<int>, kControls> keys_;
  std::array<bool, kControls> tapped_{};
  double pending_yaw_ = 0;
};

}  // namespace wm::viewer
