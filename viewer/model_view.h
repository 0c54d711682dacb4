#pragma once
// A model kind in the viewer: what of the viewer depends on the model. The app (viewer/app.h)
// runs the rest the same for every kind: the window, the event loop, the frame clock, the
// generation worker, recording, screenshots, scripts and the summary. A view loads its model and
// builds the session, turns the keys and the mouse into each video frame's control, says what a
// new start (N) is and which policies the digit keys may pick, and draws its own HUD lines and the
// panel under the HUD. Views: TinyView (viewer/tiny_view.h), Mg2View (viewer/mg2_view.h),
// LingbotView (viewer/lingbot_view.h); the last two share Mg2KeysView (viewer/mg2_keys_view.h).
#include <SDL.h>

#include <memory>
#include <string>
#include <vector>

#include "dit/image.h"
#include "viewer/font.h"
#include "viewer/generator.h"
#include "viewer/hud.h"
#include "worldkv/model_adapter.h"
#include "worldkv/pose.h"
#include "worldkv/session.h"

namespace wm::viewer {

// What the app needs to know of a view; fixed once the model is loaded.
struct ViewSetup {
  std::string title;              // the model and where it came from (window title, summary)
  std::string header;             // the HUD's heading: the model kind
  std::string model;              // the HUD's line beside it: the model's file
  std::string device;             // "cpu (1 threads)", "cuda:0 (...)"
  int frame_w = 0, frame_h = 0;   // the decoded frames
  double free_clock_fps = 16;     // the recording's rate when the frame clock is free (--fps 0)
  bool reference = false;         // a ground truth to show beside the model's frame (G)
  bool mouse = true;              // the mouse steers: captured at the start and by a click
  std::vector<std::string> keys;  // input entries the summary counts frames of ("W", "S", ...)
  std::string new_start;          // what N does, for the help ("new scene (seed + 1)")
  std::string policy_switch;      // what a policy key does besides, for the help ("keeps the place")
  std::string state_label;        // the HUD's label of the model's chunk state ("" : none)
};

class ModelView {
 public:
  virtual ~ModelView() = default;

  // Loads the model and builds its session: every error a user is likely to make (a missing or
  // contradicting file, a bad option) comes here, before the window opens. Called once.
  virtual std::unique_ptr<worldkv::WorldSession> load() = 0;
  // Valid after load().
  virtual const ViewSetup& setup() const = 0;
  // The window is open (the view's textures go on r); the first rollout's seed.
  virtual void open(SDL_Renderer* r, uint64_t seed) = 0;

  // A key that steers the model went down / up (repeats are harmless): true when it is one.
  virtual bool press(SDL_Scancode key) = 0;
  virtual bool release(SDL_Scancode key) = 0;
  // Relative mouse motion in pixels (+x right, +y down).
  virtual void mouse_motion(double dx, double dy) = 0;
  // Releases every key and drops the motion waiting (focus lost, restart).
  virtual void clear_input() = 0;
  // The next video frame's control from the input held (once per tick of the frame clock).
  virtual worldkv::FrameControl sample() = 0;
  // The frames a rollout starts from, for its first chunk's controls (empty: none).
  virtual std::vector<Image> prompt(const std::vector<worldkv::FrameControl>& first) = 0;

  // Whether a digit key may pick `policy` ("native" or a video policy).
  virtual bool accepts_policy(const std::string& policy) const = 0;
  // N: sets up a new start (the tiny model's next scene), may change the seed; returns the status
  // line to show.
  virtual std::string new_start(uint64_t& seed) = 0;
  // The rollout restarts (a policy key, or N after new_start). `last` is the retrieval pose of
  // the last frame received (null: none yet). True when the new rollout goes on from there (the
  // frame on screen and the track stay), false when it starts over.
  virtual bool restart(bool new_start, const worldkv::Pose* last) = 0;
  // The retrieval pose before the first frame of the current start.
  virtual worldkv::Pose start_pose() const = 0;

  // The ground truth at `pose` into `out`; false when the model has none.
  virtual bool reference(const worldkv::Pose& pose, Image& out) = 0;
  // The view's HUD lines: after the policy, and about the frame on screen (its control; null
  // before the first).
  virtual std::vector<HudLine> model_lines() const = 0;
  virtual std::vector<HudLine> input_lines(const worldkv::FrameControl* shown) const = 0;
  // The panel under the HUD: the retrieval poses of the frames shown (oldest first), the memory
  // (null before the first chunk), the pose on screen.
  virtual void draw_panel(SDL_Renderer* r, const Font& font, const SDL_Rect& area,
                          const std::vector<worldkv::Pose>& track, const MemorySnapshot* mem,
                          const worldkv::Pose& pose) const = 0;
  // The steering keys' lines of the help (the app adds the others).
  virtual std::string help_keys() const = 0;
  // Which of setup().keys are on in a frame's control.
  virtual std::vector<bool> keys_on(const worldkv::FrameControl& control) const = 0;
};

}  // namespace wm::viewer
