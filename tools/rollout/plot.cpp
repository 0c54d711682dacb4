#include "tools/rollout/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "runtime/error.h"

namespace wm::rollout {
namespace {

// Twelve distinct colours (BGR): a chart of every memory policy has ten series or more.
const cv::Scalar kPalette[] = {{180, 119, 31}, {14, 127, 255}, {44, 160, 44},   {40, 39, 214},
                               {189, 103, 148}, {75, 86, 140},  {194, 119, 227}, {127, 127, 127},
                               {34, 189, 188},  {207, 190, 23}, {0, 0, 0},       {0, 215, 255}};
constexpr size_t kColours = sizeof(kPalette) / sizeof(kPalette[0]);
constexpr int W = 900, H = 540, L = 90, R = 40, T = 60, B = 80;

void text(cv::Mat& m, const std::string& s, int x, int y, double scale = 0.5, cv::Scalar c = {30, 30, 30},
          bool center = false) {
  int base = 0;
  cv::Size sz = cv::getTextSize(s, cv::FONT_HERSHEY_SIMPLEX, scale, 1, &base);
  if (center) x -= sz.width / 2;
  cv::putText(m, s, {x, y}, cv::FONT_HERSHEY_SIMPLEX, scale, c, 1, cv::LINE_AA);
}

std::string num(double v) {
  char b[32];
  if (std::abs(v) >= 1000 || (std::abs(v) < 0.01 && v != 0)) std::snprintf(b, sizeof b, "%.3g", v);
  else std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

// A tick step of about n intervals over span: 1, 2 or 5 times a power of ten.
double nice_step(double span, int n) {
  const double raw = std::max(span, 1e-12) / n, p = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / p;
  return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * p;
}

// A tick label: as many decimals as the step needs, thousands plain up to 1e6.
std::string tick_label(double v, double step) {
  char b[32];
  if (std::abs(v) < step * 1e-6) v = 0;  // no "-0" or 1e-17 from accumulated steps
  if (std::abs(v) >= 1e6 || (step < 1e-4 && v != 0)) std::snprintf(b, sizeof b, "%.3g", v);
  else std::snprintf(b, sizeof b, "%.*f", step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9)), v);
  return b;
}

// A log axis: the exponents of 1, 2 and 5 times the powers of ten; the largest such at or below
// e, the smallest at or above it, and a tick's label (the value written out, 0.05 or 2000).
double log125_below(double e) {
  const double p = std::floor(e + 1e-9);
  for (double m : {5.0, 2.0, 1.0})
    if (p + std::log10(m) <= e + 1e-9) return p + std::log10(m);
  return p;
}
double log125_above(double e) {
  const double p = std::floor(e + 1e-9);
  for (double m : {1.0, 2.0, 5.0})
    if (p + std::log10(m) >= e - 1e-9) return p + std::log10(m);
  return p + 1;
}
std::string log_tick_label(double e) {
  char b[32];
  const double p = std::floor(e + 1e-9);
  if (p >= -4 && p <= 6) std::snprintf(b, sizeof b, "%.*f", p < 0 ? static_cast<int>(-p) : 0, std::pow(10, e));
  else std::snprintf(b, sizeof b, "%.0e", std::pow(10, e));
  return b;
}

// Ticks at multiples of step within [lo, hi].
std::vector<double> ticks_within(double lo, double hi, double step) {
  std::vector<double> out;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9 && out.size() < 64; k += 1)
    out.push_back(k * step);
  return out;
}

void frame(cv::Mat& m, const std::string& title, const std::string& x_label, const std::string& y_label) {
  text(m, title, W / 2, 32, 0.7, {0, 0, 0}, true);
  text(m, x_label, L + (W - L - R) / 2, H - 25, 0.5, {30, 30, 30}, true);
  cv::Mat yl(30, H, CV_8UC3, cv::Scalar(255, 255, 255));
  text(yl, y_label, H / 2, 20, 0.5, {30, 30, 30}, true);
  cv::rotate(yl, yl, cv::ROTATE_90_COUNTERCLOCKWISE);
  yl.copyTo(m(cv::Rect(5, 0, 30, H)));
  cv::rectangle(m, {L, T}, {W - R, H - B}, {0, 0, 0}, 1);
}

void save(const std::string& path, const cv::Mat& m) {
  if (!cv::imwrite(path, m)) throw Error(str_cat("plot: cannot write '", path, "'"));
}

}  // namespace

void bar_chart(const std::string& path, const std::string& title, const std::string& y_label,
               const std::vector<std::pair<std::string, double>>& bars) {
  cv::Mat m(H, W, CV_8UC3, cv::Scalar(255, 255, 255));
  frame(m, title, "", y_label);
  double lo = 0, hi = 1e-9;
  for (auto& b : bars)
    if (std::isfinite(b.second)) hi = std::max(hi, b.second), lo = std::min(lo, b.second);
  hi *= 1.1;
  const double step = nice_step(hi - lo, 5);
  lo = std::floor(lo / step) * step, hi = std::ceil(hi / step) * step;
  const int n = static_cast<int>(bars.size());
  const double slot = static_cast<double>(W - L - R) / std::max(1, n);
  auto ymap = [&](double v) { return static_cast<int>(H - B - (v - lo) / (hi - lo) * (H - B - T)); };
  for (double v : ticks_within(lo, hi, step)) {
    cv::line(m, {L, ymap(v)}, {W - R, ymap(v)}, {225, 225, 225}, 1);
    text(m, tick_label(v, step), 38, ymap(v) + 4, 0.4);
  }
  for (int i = 0; i < n; ++i) {
    const int x0 = static_cast<int>(L + slot * i + slot * 0.2), x1 = static_cast<int>(L + slot * (i + 1) - slot * 0.2);
    const double v = std::isfinite(bars[i].second) ? bars[i].second : 0;
    cv::rectangle(m, {x0, ymap(v)}, {x1, ymap(0 > lo ? 0 : lo)}, kPalette[i % 8], cv::FILLED);
    text(m, num(bars[i].second), (x0 + x1) / 2, ymap(v) - 6, 0.5, {0, 0, 0}, true);
    text(m, bars[i].first, (x0 + x1) / 2, H - B + 20, 0.45, {0, 0, 0}, true);
  }
  save(path, m);
}

namespace {

// A line chart's axes: the x range, the y range (exponents on a log axis) and its ticks, and
// where a point lands in pixels.
struct Axes {
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  bool log_y = false;
  std::vector<double> y_ticks;

  double ty(double y) const { return log_y ? std::log10(std::max(y, 1e-12)) : y; }
  int px(double x) const { return static_cast<int>(L + (x - x0) / (x1 - x0) * (W - L - R)); }
  int py(double y) const { return static_cast<int>(H - B - (ty(y) - y0) / (y1 - y0) * (H - B - T)); }

  // The y range over the data's [d0, d1] with the share `headroom` of the plot above it; ticks
  // at round steps, the bottom at a tick (a log axis: both ends at 1, 2 or 5 times a power of
  // ten, ticks at each of those when the range spans up to 2.5 decades, else at whole decades).
  void set_y(double d0, double d1, double headroom) {
    y0 = d0, y1 = d0 + (d1 - d0) / (1 - headroom);
    y_ticks.clear();
    if (!log_y) {
      const double step = nice_step(y1 - y0, 5);
      y0 = std::floor(y0 / step + 1e-9) * step;
      y_ticks = ticks_within(y0, y1, step);
      return;
    }
    y0 = log125_below(y0), y1 = log125_above(y1);
    if (y1 - y0 <= 2.5) {  // 1, 2, 5 in every decade
      for (double p = std::floor(y0 + 1e-9); p <= y1 + 1e-9; p += 1)
        for (double mult : {1.0, 2.0, 5.0}) {
          const double e = p + std::log10(mult);
          if (e >= y0 - 1e-9 && e <= y1 + 1e-9) y_ticks.push_back(e);
        }
    } else {  // whole decades, every one or a round number of them
      y0 = std::floor(y0 + 1e-9), y1 = std::ceil(y1 - 1e-9);
      y_ticks = ticks_within(y0, y1, std::max(1.0, nice_step(y1 - y0, 5)));
    }
  }
};

// No point or line of the series passes through `box` (with a dot's radius and some around it).
bool free_at(const cv::Rect& box, const std::vector<Series>& series, const Axes& ax) {
  const cv::Rect near(box.x - 8, box.y - 8, box.width + 16, box.height + 16);
  for (const auto& s : series)
    for (size_t i = 0; i < s.points.size(); ++i) {
      if (!std::isfinite(s.points[i].second)) continue;
      const cv::Point b(ax.px(s.points[i].first), ax.py(s.points[i].second));
      if (near.contains(b)) return false;
      if (i == 0 || !std::isfinite(s.points[i - 1].second)) continue;
      const cv::Point a(ax.px(s.points[i - 1].first), ax.py(s.points[i - 1].second));
      for (int k = 1; k < 32; ++k)
        if (near.contains(a + (b - a) * (k / 32.0))) return false;
    }
  return true;
}

// Each series' line, and a dot on each point when it has few (a single one draws no line).
void draw_series(cv::Mat& m, const std::vector<Series>& series, const Axes& ax) {
  for (size_t si = 0; si < series.size(); ++si) {
    const auto& s = series[si];
    for (size_t i = 1; i < s.points.size(); ++i)
      if (std::isfinite(s.points[i].second) && std::isfinite(s.points[i - 1].second))
        cv::line(m, {ax.px(s.points[i - 1].first), ax.py(s.points[i - 1].second)},
                 {ax.px(s.points[i].first), ax.py(s.points[i].second)}, kPalette[si % kColours], 2, cv::LINE_AA);
    if (s.points.size() <= 32)
      for (const auto& [x, y] : s.points)
        if (std::isfinite(y)) cv::circle(m, {ax.px(x), ax.py(y)}, 4, kPalette[si % kColours], cv::FILLED, cv::LINE_AA);
  }
}

// The legend, on a box of its own so that no line runs through it.
void draw_legend(cv::Mat& m, const std::vector<Series>& series, const cv::Rect& legend) {
  cv::rectangle(m, legend, {255, 255, 255}, cv::FILLED);
  cv::rectangle(m, legend, {200, 200, 200}, 1);
  for (size_t si = 0; si < series.size(); ++si) {
    const int y = legend.y + 12 + 20 * static_cast<int>(si);
    cv::line(m, {legend.x + 10, y}, {legend.x + 35, y}, kPalette[si % kColours], 3);
    text(m, series[si].name, legend.x + 42, y + 5, 0.45);
  }
}

}  // namespace

void line_chart(const std::string& path, const std::string& title, const std::string& x_label,
                const std::string& y_label, const std::vector<Series>& series, bool log_y) {
  cv::Mat m(H, W, CV_8UC3, cv::Scalar(255, 255, 255));
  frame(m, title, x_label, y_label);
  Axes ax;
  ax.log_y = log_y;
  double x0 = std::numeric_limits<double>::max(), x1 = -x0, y0 = x0, y1 = -x0;
  bool integer_x = true;
  for (auto& s : series)
    for (auto& [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, ax.ty(y)), y1 = std::max(y1, ax.ty(y));
      integer_x = integer_x && x == std::round(x);
    }
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x0 -= 0.5, x1 += 0.5;  // one x: the points in the middle
  if (!log_y) y0 = std::min(y0, 0.0);
  if (y1 == y0) y1 = y0 + 1;
  ax.x0 = x0, ax.x1 = x1;
  double x_step = nice_step(x1 - x0, 6);
  if (integer_x) x_step = std::max(1.0, x_step);
  // The legend goes in the first corner (top right, top left, bottom right, bottom left) that
  // no point or line passes through; if none is free, top right above a band at the top kept
  // for it, so that no data hides under it.
  const int lw = 194, lh = 20 * static_cast<int>(series.size()) + 8;
  ax.set_y(y0, y1, 0.05);
  const std::vector<cv::Rect> corners = {{W - R - 6 - lw, T + 6, lw, lh},
                                         {L + 6, T + 6, lw, lh},
                                         {W - R - 6 - lw, H - B - 6 - lh, lw, lh},
                                         {L + 6, H - B - 6 - lh, lw, lh}};
  cv::Rect legend = corners[0];
  bool placed = false;
  for (const auto& c : corners)
    if (!placed && free_at(c, series, ax)) legend = c, placed = true;
  if (!placed && !series.empty()) ax.set_y(y0, y1, std::min(0.8, 0.05 + (lh + 6.0) / (H - B - T)));
  const std::vector<double>& y_ticks = ax.y_ticks;
  for (double v : y_ticks) {
    const int yy = static_cast<int>(H - B - (v - ax.y0) / (ax.y1 - ax.y0) * (H - B - T));
    cv::line(m, {L, yy}, {W - R, yy}, {225, 225, 225}, 1);
    text(m, log_y ? log_tick_label(v) : tick_label(v, y_ticks.size() > 1 ? y_ticks[1] - y_ticks[0] : 1), 38, yy + 4, 0.4);
  }
  for (double xv : ticks_within(x0, x1, x_step)) text(m, tick_label(xv, x_step), ax.px(xv), H - B + 18, 0.4, {30, 30, 30}, true);
  draw_series(m, series, ax);
  if (!series.empty()) draw_legend(m, series, legend);
  save(path, m);
}

}  // namespace wm::rollout
