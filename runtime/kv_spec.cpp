#include "runtime/kv_spec.h"

#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace wm {

int RopeSpec::rotated_channels() const {
  int c = 0;
  for (auto& a : axes) c += a.channels;
  return c;
}

int RopeSpec::axis_index(const std::string& name) const {
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i].name == name) return static_cast<int>(i);
  throw Error(str_cat("RopeSpec: no axis named '", name, "'"));
}

void RopeSpec::validate(int head_dim) const {
  for (auto& a : axes) {
    WM_CHECK(a.channels > 0 && a.channels % 2 == 0, "RoPE axis '", a.name,
             "' needs a positive even channel count, got ", a.channels);
    WM_CHECK(a.theta > 0, "RoPE axis '", a.name, "' needs theta > 0, got ", a.theta);
  }
  WM_CHECK(rotated_channels() <= head_dim, "RoPE axes rotate ", rotated_channels(),
           " channels but head_dim is ", head_dim);
}

RopeSpec RopeSpec::video3d(int head_dim, double theta) {
  const int s = 2 * (head_dim / 6);
  RopeSpec r;
  r.axes = {{"t", head_dim - 2 * s, theta}, {"h", s, theta}, {"w", s, theta}};
  r.style = RopeStyle::Interleaved;
  return r;
}

RopeSpec RopeSpec::text1d(int head_dim, double theta, RopeStyle style) {
  RopeSpec r;
  r.axes = {{"t", head_dim, theta}};
  r.style = style;
  return r;
}

size_t KvSpec::bytes_per_token_layer() const {
  return 2ull * n_kv_heads * head_dim * c10::elementSize(dtype);
}

void KvSpec::validate() const {
  WM_CHECK(n_layers > 0, "n_layers must be > 0, got ", n_layers);
  WM_CHECK(n_kv_heads > 0, "n_kv_heads must be > 0, got ", n_kv_heads);
  WM_CHECK(head_dim > 0 && head_dim % 2 == 0, "head_dim must be positive and even, got ", head_dim);
  rope.validate(head_dim);
}

void to_json(nlohmann::json& j, const RopeSpec& r) {
  j = nlohmann::json::object();
  j["style"] = r.style == RopeStyle::Interleaved ? "interleaved" : "half";
  j["axes"] = nlohmann::json::array();
  for (auto& a : r.axes) j["axes"].push_back({{"name", a.name}, {"channels", a.channels}, {"theta", a.theta}});
}

void from_json(const nlohmann::json& j, RopeSpec& r) {
  r = RopeSpec{};
  const std::string style = j.value("style", "interleaved");
  if (style == "interleaved") r.style = RopeStyle::Interleaved;
  else if (style == "half") r.style = RopeStyle::Half;
  else throw Error(str_cat("RopeSpec: style must be 'interleaved' or 'half', got '", style, "'"));
  if (!j.contains("axes") || !j["axes"].is_array()) throw Error("RopeSpec: 'axes' must be an array");
  for (auto& a : j["axes"]) {
    RopeAxis ax;
    ax.name = a.at("name").get<std::string>();
    ax.channels = a.at("channels").get<int>();
    ax.theta = a.value("theta", 10000.0);
    r.axes.push_back(ax);
  }
}

}  // namespace wm
