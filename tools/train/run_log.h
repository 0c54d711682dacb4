#pragma once
// What the trainers (wm_train, wm_train_codec) share about a run: its learning-rate schedule,
// its log file and how they print durations.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace wm::train {

// Peak rate after a linear warm-up of `warmup` steps, then cosine decay to 10% of it at `steps`.
inline double cosine_learning_rate(double peak, int64_t warmup, int64_t steps, int64_t step) {
  const double progress = static_cast<double>(step) / (steps > 1 ? steps : 1);
  return step < warmup ? peak * (step + 1) / warmup : peak * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * progress)));
}

// A run's log, appended to; a run killed mid-line left a partial last line: start on a new one.
inline std::ofstream open_log(const std::string& path) {
  namespace fs = std::filesystem;
  bool torn = false;
  std::error_code ec;
  if (fs::exists(path, ec) && fs::file_size(path, ec) > 0) {
    std::ifstream in(path, std::ios::binary);
    in.seekg(-1, std::ios::end);
    torn = in.get() != '\n';
  }
  std::ofstream log(path, std::ios::app);
  if (torn) log << "\n";
  return log;
}

// "1h05m".
inline std::string fmt_duration(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(std::fmod(s, 3600) / 60));
  return b;
}

}  // namespace wm::train
