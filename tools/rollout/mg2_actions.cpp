#include "tools/rollout/mg2_actions.h"

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "runtime/error.h"

namespace wm::rollout {
namespace {

const std::vector<std::string> kTempleRun = {"nomove",   "jump",     "slide",    "turnleft",
                                             "turnright", "leftside", "rightside"};

int key_dim(const std::string& mode) {
  if (mode == "universal") return 4;
  if (mode == "gta_drive") return 2;
  if (mode == "templerun") return 7;
  throw Error(str_cat("unknown mode '", mode, "' (universal, gta_drive, templerun)"));
}

bool parse_number(const std::string& s, float& out) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size() || !std::isfinite(v) || std::fabs(v) > 100) return false;
    out = float(v);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

worldkv::Mg2Input keys(const std::string& mode, bool w, bool s, bool a, bool d) {
  worldkv::Mg2Input in;
  if (mode == "universal") {
    in.keyboard = {float(w), float(s), float(a), float(d)};
  } else if (mode == "gta_drive") {
    in.keyboard = {float(w), float(s)};
    in.yaw = a ? -0.1f : d ? 0.1f : 0.f;
  } else {
    in.keyboard.assign(7, 0.f);
    in.keyboard[a ? 3 : d ? 4 : 0] = 1.f;  // turnleft / turnright / nomove
    if (w) std::fill(in.keyboard.begin(), in.keyboard.end(), 0.f), in.keyboard[a ? 3 : d ? 4 : 1] = 1.f;
  }
  return in;
}

}  // namespace

worldkv::Mg2Input parse_mg2_action(const std::string& line, const std::string& mode, const std::string& where) {
  const int kd = key_dim(mode);
  std::istringstream is(line);
  std::vector<std::string> tok;
  for (std::string t; is >> t;) tok.push_back(t);
  WM_CHECK(!tok.empty(), where, ": empty action");
  worldkv::Mg2Input in;
  in.keyboard.assign(kd, 0.f);
  if (mode == "templerun") {
    WM_CHECK(tok.size() == 1, where, ": templerun takes one action word and no mouse, got '", line, "'");
    auto it = std::find(kTempleRun.begin(), kTempleRun.end(), tok[0]);
    if (it == kTempleRun.end())
      throw Error(str_cat(where, ": unknown templerun action '", tok[0],
                          "' (nomove, jump, slide, turnleft, turnright, leftside, rightside)"));
    in.keyboard[it - kTempleRun.begin()] = 1.f;
    return in;
  }
  WM_CHECK(tok.size() == 1 || tok.size() == 3, where, ": expected KEYS [PITCH YAW], got '", line, "'");
  bool steer_given = false;
  if (tok[0] != "-") {
    for (char ch : tok[0]) {
      const char c = char(std::toupper(static_cast<unsigned char>(ch)));
      if (c == 'W') {
        in.keyboard[0] = 1.f;
      } else if (c == 'S') {
        in.keyboard[1] = 1.f;
      } else if ((c == 'A' || c == 'D') && mode == "universal") {
        in.keyboard[c == 'A' ? 2 : 3] = 1.f;
      } else if ((c == 'A' || c == 'D') && mode == "gta_drive") {
        in.yaw = c == 'A' ? -0.1f : 0.1f;
        steer_given = true;
      } else {
        throw Error(str_cat(where, ": unknown key '", ch, "' in '", tok[0], "' (W S A D, or - for none)"));
      }
    }
  }
  if (tok.size() == 3) {
    float p = 0, y = 0;
    if (!parse_number(tok[1], p) || !parse_number(tok[2], y))
      throw Error(str_cat(where, ": pitch and yaw must be numbers in [-100, 100], got '", tok[1], "' '", tok[2], "'"));
    in.pitch = p;
    in.yaw = y;
    (void)steer_given;
  }
  return in;
}

std::vector<worldkv::Mg2Input> load_mg2_actions(const std::string& path, const std::string& mode) {
  std::ifstream f(path);
  if (!f) throw Error(str_cat(path, ": cannot open the actions file"));
  std::vector<worldkv::Mg2Input> out;
  std::string line;
  int no = 0;
  while (std::getline(f, line)) {
    ++no;
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    out.push_back(parse_mg2_action(line, mode, str_cat(path, ":", no)));
  }
  if (out.empty()) throw Error(str_cat(path, ": no actions (one line per video frame: KEYS [PITCH YAW])"));
  return out;
}

std::vector<std::string> mg2_trajectory_names() { return {"revisit", "forward", "orbit", "random"}; }

std::vector<worldkv::Mg2Input> mg2_trajectory(const std::string& name, int n, const std::string& mode, uint64_t seed) {
  key_dim(mode);
  WM_CHECK(n > 0, "a trajectory needs frames, got ", n);
  std::vector<worldkv::Mg2Input> out;
  std::mt19937_64 rng(seed);
  worldkv::Mg2Input chunk_in;
  for (int i = 0; i < n; ++i) {
    worldkv::Mg2Input in;
    if (name == "forward") {
      in = keys(mode, true, false, false, false);
    } else if (name == "orbit") {
      in = keys(mode, true, false, false, mode != "universal");
      if (mode == "universal") in.yaw = 0.1f;
    } else if (name == "revisit") {
      // Quarters: forward, turn right, turn back left, back (S): the last frames see the first views.
      const int q = (4 * i) / n;
      in = keys(mode, q == 0 || q == 2, q == 3, q == 2 && mode != "universal", q == 1 && mode != "universal");
      if (mode == "universal") in.yaw = q == 1 ? 0.1f : q == 2 ? -0.1f : 0.f;
    } else if (name == "random") {
      if (i % 12 == 0) {
        std::uniform_int_distribution<int> k(0, 4);
        const int c = k(rng);
        chunk_in = keys(mode, c == 0 || c == 2, c == 1, c == 2, c == 3);
        if (mode != "templerun") {
          std::uniform_int_distribution<int> m(-1, 1);
          chunk_in.pitch = 0.1f * m(rng);
          if (mode == "universal") chunk_in.yaw = 0.1f * m(rng);
        }
      }
      in = chunk_in;
    } else {
      std::string names;
      for (const auto& s : mg2_trajectory_names()) names += " " + s;
      throw Error(str_cat("unknown trajectory '", name, "' (", names.substr(1), ")"));
    }
    out.push_back(in);
  }
  return out;
}

}  // namespace wm::rollout
