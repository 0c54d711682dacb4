#pragma once
// Scripted input for headless runs and tests. A script is a list of commands separated by ';'
// or newlines ('#' starts a comment):
//   down KEY | up KEY | press KEY | hold KEY DUR   key events (SDL key names: W, Left, Escape, F1, 1 ...)
//   mouse DX [DY]                                 relative mouse motion in pixels (+x = right)
//   click [left|middle|right]                     a mouse button press and release
//   wait DUR                                      DUR: 500ms, 2s, 3c (chunks generated), 12f (frames generated)
//   screenshot PATH                               a PNG of the whole window at the next redraw
//   quit                                          an SDL_QUIT event
// The player pushes real SDL events into the event queue (SDL_PushEvent), so scripted input
// takes the same path as a person's.
#include <SDL.h>

#include <cstdint>
#include <string>
#include <vector>

namespace wm::viewer {

struct ScriptDuration {
  enum class Unit { Ms, Chunks, Frames };
  Unit unit = Unit::Ms;
  double value = 0;
};

struct ScriptStep {
  enum class Kind { KeyDown, KeyUp, Mouse, Click, Wait, Screenshot, Quit };
  Kind kind = Kind::Wait;
  std::string key;      // KeyDown / KeyUp: SDL key name
  double dx = 0, dy = 0;  // Mouse
  int button = 1;       // Click: SDL_BUTTON_LEFT / MIDDLE / RIGHT
  ScriptDuration wait;  // Wait
  std::string path;     // Screenshot
  std::string where;    // "source:line" for messages
};

// Parses script text (`source` names it in errors: "source:3: unknown command 'jump'"). `press`
// and `hold` expand into down / (wait) / up. Throws wm::Error on a bad command or duration.
std::vector<ScriptStep> parse_script(const std::string& text, const std::string& source);
// Parses "500ms", "2s", "3c", "12f". Throws wm::Error naming the text.
ScriptDuration parse_duration(const std::string& text);

class ScriptPlayer {
 public:
  // Resolves every key name (throws wm::Error naming the step for an unknown key); events are
  // addressed to window_id.
  ScriptPlayer(std::vector<ScriptStep> steps, Uint32 window_id);

  // Pushes the events of every due step, up to the first wait that has not run out. now_ms: a
  // monotonic clock; chunks / frames: generated so far. Paths of screenshot steps reached are
  // appended to `screenshots`. Throws wm::Error if SDL_PushEvent fails.
  void update(double now_ms, int64_t chunks, int64_t frames, std::vector<std::string>& screenshots);
  bool done() const { return next_ >= steps_.size(); }
  size_t steps() const { return steps_.size(); }

 private:
  std::vector<ScriptStep> steps_;
  std::vector<SDL_Keycode> keys_;  // by step
  Uint32 window_id_;
  size_t next_ = 0;
  bool waiting_ = false;
  double wait_t0_ = 0;
  int64_t wait_c0_ = 0, wait_f0_ = 0;
};

}  // namespace wm::viewer
