#include "viewer/script.h"

#include <cstdlib>
#include <sstream>

#include "runtime/error.h"

namespace wm::viewer {

namespace {

double parse_number(const std::string& s, const std::string& where) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) throw Error(str_cat(where, ": expected a number, got '", s, "'"));
  return v;
}

}  // namespace

ScriptDuration parse_duration(const std::string& text) {
  ScriptDuration d;
  std::string num = text, unit;
  size_t i = text.find_first_not_of("0123456789.+-");
  if (i != std::string::npos) {
    num = text.substr(0, i);
    unit = text.substr(i);
  }
  if (unit == "ms") d.unit = ScriptDuration::Unit::Ms;
  else if (unit == "s") d.unit = ScriptDuration::Unit::Ms;
  else if (unit == "c") d.unit = ScriptDuration::Unit::Chunks;
  else if (unit == "f") d.unit = ScriptDuration::Unit::Frames;
  else throw Error(str_cat("duration '", text, "': expected a number with a unit ms, s, c (chunks) or f (frames)"));
  d.value = parse_number(num, str_cat("duration '", text, "'"));
  if (unit == "s") d.value *= 1000.0;
  if (d.value < 0) throw Error(str_cat("duration '", text, "': must not be negative"));
  return d;
}

std::vector<ScriptStep> parse_script(const std::string& text, const std::string& source) {
  std::vector<ScriptStep> steps;
  int line = 1;
  std::string cmd;
  auto flush = [&](int at_line) {
    const auto hash = cmd.find('#');
    if (hash != std::string::npos) cmd.resize(hash);
    std::istringstream in(cmd);
    std::vector<std::string> w;
    for (std::string t; in >> t;) w.push_back(t);
    cmd.clear();
    if (w.empty()) return;
    const std::string where = str_cat(source, ":", at_line);
    auto need = [&](size_t lo, size_t hi) {
      if (w.size() < lo || w.size() > hi)
        throw Error(str_cat(where, ": '", w[0], "' takes ", lo - 1, hi > lo ? str_cat("..", hi - 1) : "",
                            " argument(s), got ", w.size() - 1));
    };
    ScriptStep s;
    s.where = where;
    const std::string& c = w[0];
    if (c == "down" || c == "up") {
      need(2, 2);
      s.kind = c == "down" ? ScriptStep::Kind::KeyDown : ScriptStep::Kind::KeyUp;
      s.key = w[1];
      steps.push_back(s);
    } else if (c == "press" || c == "hold") {
      need(c == "press" ? 2 : 3, c == "press" ? 2 : 3);
      s.kind = ScriptStep::Kind::KeyDown;
      s.key = w[1];
      steps.push_back(s);
      if (c == "hold") {
        ScriptStep wait;
        wait.where = where;
        try {
          wait.wait = parse_duration(w[2]);
        } catch (const Error& e) {
          throw Error(str_cat(where, ": ", e.what()));
        }
        steps.push_back(wait);
      }
      s.kind = ScriptStep::Kind::KeyUp;
      steps.push_back(s);
    } else if (c == "mouse") {
      need(2, 3);
      s.kind = ScriptStep::Kind::Mouse;
      s.dx = parse_number(w[1], where);
      s.dy = w.size() > 2 ? parse_number(w[2], where) : 0.0;
      steps.push_back(s);
    } else if (c == "click") {
      need(1, 2);
      s.kind = ScriptStep::Kind::Click;
      const std::string b = w.size() > 1 ? w[1] : "left";
      if (b == "left") s.button = SDL_BUTTON_LEFT;
      else if (b == "middle") s.button = SDL_BUTTON_MIDDLE;
      else if (b == "right") s.button = SDL_BUTTON_RIGHT;
      else throw Error(str_cat(where, ": click: expected left, middle or right, got '", b, "'"));
      steps.push_back(s);
    } else if (c == "wait") {
      need(2, 2);
      s.kind = ScriptStep::Kind::Wait;
      try {
        s.wait = parse_duration(w[1]);
      } catch (const Error& e) {
        throw Error(str_cat(where, ": ", e.what()));
      }
      steps.push_back(s);
    } else if (c == "screenshot") {
      need(2, 2);
      s.kind = ScriptStep::Kind::Screenshot;
      s.path = w[1];
      steps.push_back(s);
    } else if (c == "quit") {
      need(1, 1);
      s.kind = ScriptStep::Kind::Quit;
      steps.push_back(s);
    } else {
      throw Error(str_cat(where, ": unknown command '", c,
                          "' (down, up, press, hold, mouse, click, wait, screenshot, quit)"));
    }
  };
  int cmd_line = 1;
  bool comment = false;
  for (char ch : text) {
    if (ch == '\n' || (ch == ';' && !comment)) {
      flush(cmd_line);
      if (ch == '\n') {
        ++line;
        comment = false;
      }
      cmd_line = line;
      continue;
    }
    if (ch == '#') comment = true;
    cmd += ch;
  }
  flush(cmd_line);
  return steps;
}

ScriptPlayer::ScriptPlayer(std::vector<ScriptStep> steps, Uint32 window_id)
    : steps_(std::move(steps)), keys_(steps_.size(), SDLK_UNKNOWN), window_id_(window_id) {
  for (size_t i = 0; i < steps_.size(); ++i) {
    const auto& s = steps_[i];
    if (s.kind != ScriptStep::Kind::KeyDown && s.kind != ScriptStep::Kind::KeyUp) continue;
    keys_[i] = SDL_GetKeyFromName(s.key.c_str());
    if (keys_[i] == SDLK_UNKNOWN)
      throw Error(str_cat(s.where, ": unknown key '", s.key, "' (SDL key names: W, Left, Escape, F1, 1, ...)"));
  }
}

void ScriptPlayer::update(double now_ms, int64_t chunks, int64_t frames, std::vector<std::string>& screenshots) {
  auto push = [](SDL_Event& e) {
    if (SDL_PushEvent(&e) < 0) throw Error(std::string("script: SDL_PushEvent: ") + SDL_GetError());
  };
  while (next_ < steps_.size()) {
    const ScriptStep& s = steps_[next_];
    SDL_Event e;
    SDL_zero(e);
    switch (s.kind) {
      case ScriptStep::Kind::Wait: {
        if (!waiting_) {
          waiting_ = true;
          wait_t0_ = now_ms;
          wait_c0_ = chunks;
          wait_f0_ = frames;
        }
        double done = 0;
        if (s.wait.unit == ScriptDuration::Unit::Ms) done = now_ms - wait_t0_;
        else if (s.wait.unit == ScriptDuration::Unit::Chunks) done = static_cast<double>(chunks - wait_c0_);
        else done = static_cast<double>(frames - wait_f0_);
        if (done < s.wait.value) return;
        waiting_ = false;
        break;
      }
      case ScriptStep::Kind::KeyDown:
      case ScriptStep::Kind::KeyUp:
        e.type = s.kind == ScriptStep::Kind::KeyDown ? SDL_KEYDOWN : SDL_KEYUP;
        e.key.timestamp = SDL_GetTicks();
        e.key.windowID = window_id_;
        e.key.state = s.kind == ScriptStep::Kind::KeyDown ? SDL_PRESSED : SDL_RELEASED;
        e.key.keysym.sym = keys_[next_];
        e.key.keysym.scancode = SDL_GetScancodeFromKey(keys_[next_]);
        push(e);
        break;
      case ScriptStep::Kind::Mouse:
        e.type = SDL_MOUSEMOTION;
        e.motion.timestamp = SDL_GetTicks();
        e.motion.windowID = window_id_;
        e.motion.xrel = static_cast<Sint32>(s.dx);
        e.motion.yrel = static_cast<Sint32>(s.dy);
        push(e);
        break;
      case ScriptStep::Kind::Click:
        for (Uint32 type : {static_cast<Uint32>(SDL_MOUSEBUTTONDOWN), static_cast<Uint32>(SDL_MOUSEBUTTONUP)}) {
          SDL_zero(e);
          e.type = type;
          e.button.timestamp = SDL_GetTicks();
          e.button.windowID = window_id_;
          e.button.button = static_cast<Uint8>(s.button);
          e.button.state = type == SDL_MOUSEBUTTONDOWN ? SDL_PRESSED : SDL_RELEASED;
          e.button.clicks = 1;
          push(e);
        }
        break;
      case ScriptStep::Kind::Screenshot:
        screenshots.push_back(s.path);
        break;
      case ScriptStep::Kind::Quit:
        e.type = SDL_QUIT;
        push(e);
        break;
    }
    ++next_;
  }
}

}  // namespace wm::viewer
