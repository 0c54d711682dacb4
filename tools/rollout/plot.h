#pragma once
// Small PNG charts for the benchmark's report (OpenCV drawing): bars per category, and lines of
// y against x per series.
#include <string>
#include <utility>
#include <vector>

namespace wm::rollout {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y)
};

// A bar chart: one bar per (label, value), the value printed on each bar. Throws on a write failure.
void bar_chart(const std::string& path, const std::string& title, const std::string& y_label,
               const std::vector<std::pair<std::string, double>>& bars);

// A line chart of every series, with a legend. log_y: a logarithmic y axis.
void line_chart(const std::string& path, const std::string& title, const std::string& x_label,
                const std::string& y_label, const std::vector<Series>& series, bool log_y = false);

}  // namespace wm::rollout
