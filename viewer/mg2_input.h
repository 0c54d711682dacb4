#pragma once
// From held keys and mouse motion to Matrix-Game-2.0's input of one video frame
// (worldkv::Mg2Input), by the model's mode:
//   universal  keyboard [W, S, A, D], several at once; the mouse turns: pitch (+ up) and yaw (+ right),
//              per_px a pixel (about 0.1 a frame at a steady mouse), at most `cap` a frame with the
//              rest carried over; the arrow keys give +-0.1 a frame (Up/Down pitch, Left/Right yaw)
//   gta_drive  keyboard [W, S] (or Up/Down); A/D (or Left/Right) steer: yaw -0.1 / +0.1, as
//              upstream's gta demos; pitch 0; the mouse is not used
//   templerun  one-hot of 7 [nomove, jump, slide, turnleft, turnright, leftside, rightside]:
//              Space/W/Up jump, S/Down slide, A/Left turn left, D/Right turn right, Q left side,
//              E right side; nothing held: nomove; several: the first in that order; no mouse
// A key tapped (down and up) between two samples counts for one frame, as InputState does. Pure
// logic, no SDL: testable alone.
#include <array>
#include <set>
#include <string>
#include <vector>

#include "worldkv/action.h"
#include "worldkv/pose.h"

namespace wm::viewer {

enum class Mg2Key { W, S, A, D, Up, Down, Left, Right, Space, Q, E };
constexpr int kMg2Keys = 11;

struct Mg2InputConfig {
  double per_px = 0.005;   // pitch / yaw per pixel of relative mouse motion (20 px in a frame: 0.1)
  double arrow = 0.1;      // a frame, while an arrow key is held (universal) or A/D steers (gta_drive)
  double cap = 0.2;        // |pitch| and |yaw| of a frame at most (upstream's demos use 0.1)
  double backlog = 1.0;    // mouse motion still waiting beyond this, per axis, is dropped
};

class Mg2InputState {
 public:
  // mode: "universal", "gta_drive" or "templerun". Throws wm::Error naming them otherwise.
  explicit Mg2InputState(std::string mode, Mg2InputConfig cfg = {});

  // Key `key` (any id, e.g. an SDL scancode) that stands for k went down / up. A key is held
  // while any of its ids is.
  void press(Mg2Key k, int key);
  void release(Mg2Key k, int key);
  // Relative mouse motion in pixels (+x right, +y down, as SDL reports it).
  void mouse_motion(double dx_px, double dy_px);
  // Releases every key and drops the mouse motion waiting (focus lost, restart).
  void clear();

  bool held(Mg2Key k) const { return !keys_[static_cast<size_t>(k)].empty(); }
  // The next video frame's input (see above); clears the taps.
  worldkv::Mg2Input sample();

  const std::string& mode() const { return mode_; }
  int keyboard_dim() const { return static_cast<int>(names_.size()); }
  // Names of the keyboard entries, in the model's order.
  const std::vector<std::string>& keyboard_names() const { return names_; }

 private:
  bool active(Mg2Key k) const { return held(k) || tapped_[static_cast<size_t>(k)]; }
  bool any(std::initializer_list<Mg2Key> ks) const;
  double take_mouse(double& pending, double keys);

  std::string mode_;
  Mg2InputConfig cfg_;
  std::vector<std::string> names_;
  std::array<std::set<int>, kMg2Keys> keys_;
  std::array<bool, kMg2Keys> tapped_{};
  double pending_pitch_ = 0, pending_yaw_ = 0;
};

// The keyboard entries of a mode ("W" "S" "A" "D"; "W" "S"; "nomove" "jump" ...). Throws
// wm::Error for another mode.
std::vector<std::string> mg2_keyboard_names(const std::string& mode);

}  // namespace wm::viewer
