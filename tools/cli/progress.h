#pragma once
// Progress of long work, on stderr unless told otherwise. On a terminal: one line, rewritten in
// place. Otherwise (a log file, CI): whole lines, at most one per `interval_s` seconds, and
// always the last, so that a log reads line by line instead of as one run of carriage returns.
// Header-only; every program may use it.
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>

namespace wm::cli {

class ProgressLine {
 public:
  explicit ProgressLine(double interval_s = 15, std::FILE* out = stderr)
      : out_(out), tty_(isatty(fileno(out)) != 0), interval_s_(interval_s) {}
  ~ProgressLine() { finish(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Shows the line (printf format). `last`: the final update, always written.
  void show(bool last, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    const auto now = std::chrono::steady_clock::now();
    if (!tty_ && !last && printed_ && std::chrono::duration<double>(now - last_).count() < interval_s_) return;
    va_list ap;
    va_start(ap, fmt);
    std::fputs(tty_ ? "\r" : "", out_);
    std::vfprintf(out_, fmt, ap);
    va_end(ap);
    std::fputs(tty_ ? "\033[K" : "\n", out_);
    std::fflush(out_);
    printed_ = true;
    pending_newline_ = tty_;
    last_ = now;
  }

  // Ends the terminal's progress line (so what follows starts on a line of its own).
  void finish() {
    if (pending_newline_) std::fputc('\n', out_);
    pending_newline_ = false;
  }

  bool tty() const { return tty_; }

 private:
  std::FILE* out_;
  bool tty_;
  double interval_s_;
  bool printed_ = false, pending_newline_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace wm::cli
