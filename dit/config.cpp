#include "dit/config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <type_traits>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/error.h"

namespace wm::dit {
namespace {

using nlohmann::json;

// Strict conversions: integers must be integers within the target's range (no silent
// truncation of 2^32 + 192 to 192, nor of 3.7 to 3), reals finite numbers, flags booleans.
template <class T>
bool convert(const json& v, T& out, std::string& why) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return why = "expected true or false", false;
    out = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) return why = "expected an integer", false;
    const bool neg = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
    if (neg ? v.get<int64_t>() < static_cast<int64_t>(std::numeric_limits<T>::min())
            : v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max()))
      return why = str_cat("out of range [", std::numeric_limits<T>::min(), ", ", std::numeric_limits<T>::max(), "]"),
             false;
    out = neg ? static_cast<T>(v.get<int64_t>()) : static_cast<T>(v.get<uint64_t>());
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return why = "expected a number", false;
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::abs(d) > static_cast<double>(std::numeric_limits<T>::max()))
      return why = "expected a finite number", false;
    out = static_cast<T>(d);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return why = "expected a string", false;
    out = v.get<std::string>();
  } else {
    if (!v.is_array()) return why = "expected an array", false;
    T items;
    for (const auto& e : v) {
      typename T::value_type x{};
      if (!convert(e, x, why)) return why = "an element: " + why, false;
      items.push_back(std::move(x));
    }
    out = std::move(items);
  }
  return true;
}

// Reads fields of one JSON object, rejecting unknown keys and wrong types with "where: field: ...".
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) throw Error(str_cat(where_, ": expected a JSON object, got ", j_.type_name()));
  }
  template <class T>
  void get(const char* key, T& out, bool required = false) {
    seen_.insert(key);
    if (!j_.contains(key)) {
      if (required) throw Error(str_cat(where_, ": missing required field '", key, "'"));
      return;
    }
    std::string why;
    if (!convert(j_.at(key), out, why))
      throw Error(str_cat(where_, ": field '", key, "': ", why, " (got ", j_.at(key).dump(), ")"));
  }
  const json* sub(const char* key) {
    seen_.insert(key);
    return j_.contains(key) ? &j_.at(key) : nullptr;
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key())) throw Error(str_cat(where_, ": unknown field '", it.key(), "'"));
  }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
  std::set<std::string> seen_;
};

template <class F>
void field_check(bool ok, const std::string& where, const char* field, F&& msg) {
  if (!ok) throw Error(str_cat(where, ": field '", field, "': ", msg()));
}

}  // namespace

const char* prediction_name(Prediction p) { return p == Prediction::X0 ? "x0" : "v"; }

std::optional<Prediction> parse_prediction(const std::string& name) {
  if (name == "v") return Prediction::V;
  if (name == "x0") return Prediction::X0;
  return std::nullopt;
}

void DitConfig::validate() const {
  const std::string w = str_cat("DitConfig '", name, "'");
  // Upper bounds far above any real model keep every product the code forms (tokens x dim,
  // dim x ffn_dim, ...) inside int64 and reject a typo before it becomes a huge allocation.
  auto in = [&](const char* f, int v, int lo, int hi) {
    field_check(v >= lo && v <= hi, w, f, [&] { return str_cat("must be in [", lo, ", ", hi, "], got ", v); });
  };
  in("dim", dim, 1, 1 << 16);
  in("n_layers", n_layers, 1, 1024);
  in("n_heads", n_heads, 1, 1024);
  in("ffn_dim", ffn_dim, 1, 1 << 18);
  in("latent_channels", latent_channels, 1, 1 << 12);
  in("frames_per_chunk", frames_per_chunk, 1, 1024);
  in("freq_dim", freq_dim, 1, 1 << 16);
  in("latent_size", latent_height, 1, 1 << 12);
  in("latent_size", latent_width, 1, 1 << 12);
  in("patch", patch_h, 1, 1 << 12);
  in("patch", patch_w, 1, 1 << 12);
  in("codec.stride", codec.stride, 1, 64);
  field_check(codec.dtype.empty() || codec.dtype == "float32" || codec.dtype == "bfloat16" || codec.dtype == "float16",
              w, "codec.dtype",
              [&] { return str_cat("must be \"float32\", \"bfloat16\", \"float16\" or absent, got \"", codec.dtype, "\""); });
  in("conditioning.action_dim", cond.action_dim, 0, 1 << 12);
  in("conditioning.pos_bands", cond.pos_bands, 0, 64);
  in("conditioning.yaw_harmonics", cond.yaw_harmonics, 0, 64);
  in("conditioning.hidden", cond.hidden, 0, 1 << 16);
  field_check(std::isfinite(timestep_scale) && timestep_scale > 0, w, "timestep_scale",
              [&] { return str_cat("must be a finite number > 0, got ", timestep_scale); });
  field_check(eps < 1, w, "eps", [&] { return str_cat("must be in (0, 1), got ", eps); });
  field_check(freq_dim % 2 == 0, w, "freq_dim", [&] { return str_cat("must be even, got ", freq_dim); });
  field_check(dim % n_heads == 0, w, "n_heads",
              [&] { return str_cat("dim ", dim, " is not a multiple of n_heads ", n_heads); });
  field_check(head_dim == dim / n_heads, w, "head_dim",
              [&] { return str_cat("must be dim / n_heads = ", dim / n_heads, ", got ", head_dim); });
  field_check(patch_t == 1, w, "patch",
              [&] { return str_cat("only a temporal patch of 1 is supported, got ", patch_t); });
  field_check(patch_h > 0 && patch_w > 0 && latent_height > 0 && latent_width > 0 && latent_height % patch_h == 0 &&
                  latent_width % patch_w == 0,
              w, "patch", [&] {
                return str_cat("latent ", latent_height, "x", latent_width, " is not divisible by patch ", patch_h,
                               "x", patch_w);
              });
  field_check(prediction == Prediction::V || prediction == Prediction::X0, w, "prediction",
              [&] { return str_cat("must be \"v\" or \"x0\", got value ", static_cast<int>(prediction)); });
  field_check(eps > 0, w, "eps", [&] { return str_cat("must be > 0, got ", eps); });
  field_check(rope.n_axes() == 3, w, "rope",
              [&] { return str_cat("needs 3 axes (t, h, w), got ", rope.n_axes()); });
  try {
    rope.validate(head_dim);
  } catch (const Error& e) {
    throw Error(str_cat(w, ": field 'rope': ", e.what()));
  }
  field_check(cond.action_dim >= 0, w, "conditioning.action_dim",
              [&] { return str_cat("must be >= 0, got ", cond.action_dim); });
  field_check(cond.hfov_deg > 0 && cond.hfov_deg < 180, w, "conditioning.hfov_deg",
              [&] { return str_cat("must be in (0, 180), got ", cond.hfov_deg); });
  field_check(cond.pos_bands >= 0 && cond.yaw_harmonics >= 0 && cond.hidden >= 0, w, "conditioning",
              [&] { return std::string("pos_bands, yaw_harmonics and hidden must be >= 0"); });
  field_check(!cond.ray_embedding || cond.pos_bands + cond.yaw_harmonics > 0, w, "conditioning.ray_embedding",
              [&] { return std::string("needs pos_bands or yaw_harmonics > 0"); });
  field_check(!cond.reference_residual || (cond.warp_reference && prediction == Prediction::X0), w,
              "conditioning.reference_residual",
              [&] { return std::string("needs warp_reference and prediction \"x0\""); });
  field_check(cond.yaw_rope_pairs >= 0 && rope.rotated_channels() + 2 * cond.yaw_rope_pairs <= head_dim, w,
              "conditioning.yaw_rope_pairs", [&] {
                return str_cat(cond.yaw_rope_pairs, " pairs do not fit: the (t, h, w) RoPE rotates ",
                               rope.rotated_channels(), " of head_dim ", head_dim, " channels");
              });
  field_check(cond.pos_scale > 0, w, "conditioning.pos_scale",
              [&] { return str_cat("must be > 0, got ", cond.pos_scale); });
  field_check(codec.stride > 0, w, "codec.stride", [&] { return str_cat("must be > 0, got ", codec.stride); });
  field_check(codec.image_height == latent_height * codec.stride && codec.image_width == latent_width * codec.stride,
              w, "codec", [&] {
                return str_cat("image ", codec.image_height, "x", codec.image_width, " must be latent ", latent_height,
                               "x", latent_width, " times stride ", codec.stride);
              });
  field_check(codec.kind != "pixel_patch" || latent_channels == 3 * codec.stride * codec.stride, w,
              "latent_channels", [&] {
                return str_cat("a pixel_patch codec with stride ", codec.stride, " gives ",
                               3 * codec.stride * codec.stride, " channels, got ", latent_channels);
              });
}

DitConfig config_from_json(const nlohmann::json& j, const std::string& where) {
  DitConfig c;
  Reader r(j, where);
  r.get("name", c.name);
  r.get("dim", c.dim, true);
  r.get("n_layers", c.n_layers, true);
  r.get("n_heads", c.n_heads, true);
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  r.get("head_dim", c.head_dim);
  r.get("ffn_dim", c.ffn_dim, true);
  std::vector<int> patch{1, 2, 2};
  r.get("patch", patch);
  if (patch.size() != 3) throw Error(str_cat(where, ": field 'patch': expected [pt, ph, pw], got ", patch.size(), " values"));
  c.patch_t = patch[0];
  c.patch_h = patch[1];
  c.patch_w = patch[2];
  r.get("latent_channels", c.latent_channels, true);
  std::vector<int> lsize;
  r.get("latent_size", lsize, true);
  if (lsize.size() != 2) throw Error(str_cat(where, ": field 'latent_size': expected [h, w], got ", lsize.size(), " values"));
  c.latent_height = lsize[0];
  c.latent_width = lsize[1];
  r.get("frames_per_chunk", c.frames_per_chunk);
  r.get("freq_dim", c.freq_dim);
  r.get("timestep_scale", c.timestep_scale);
  r.get("eps", c.eps);
  r.get("qk_norm", c.qk_norm);
  std::string prediction = prediction_name(c.prediction);
  r.get("prediction", prediction);
  int tpf = -1;
  r.get("tokens_per_frame", tpf);  // optional cross-check

  // RoPE: {"theta": 10000, "split": [t, h, w]}; default Wan's split of head_dim.
  double theta = 10000.0;
  std::vector<int> split;
  if (const json* rj = r.sub("rope")) {
    Reader rr(*rj, where + ": rope");
    rr.get("theta", theta);
    rr.get("split", split);
    rr.finish();
  }
  c.rope = RopeSpec::video3d(c.head_dim > 0 ? c.head_dim : 6, theta);
  if (!split.empty()) {
    if (split.size() != 3) throw Error(str_cat(where, ": field 'rope.split': expected [t, h, w], got ", split.size(), " values"));
    for (int a = 0; a < 3; ++a) c.rope.axes[a].channels = split[a];
  }

  if (const json* cj = r.sub("conditioning")) {
    Reader cr(*cj, where + ": conditioning");
    cr.get("pose", c.cond.pose);
    cr.get("action_dim", c.cond.action_dim);
    cr.get("ray_embedding", c.cond.ray_embedding);
    cr.get("hfov_deg", c.cond.hfov_deg);
    cr.get("pos_bands", c.cond.pos_bands);
    cr.get("pos_scale", c.cond.pos_scale);
    cr.get("yaw_harmonics", c.cond.yaw_harmonics);
    cr.get("hidden", c.cond.hidden);
    cr.get("yaw_rope_pairs", c.cond.yaw_rope_pairs);
    cr.get("warp_reference", c.cond.warp_reference);
    cr.get("reference_residual", c.cond.reference_residual);
    cr.finish();
  }
  c.codec.image_height = c.latent_height * c.codec.stride;
  c.codec.image_width = c.latent_width * c.codec.stride;
  if (const json* kj = r.sub("codec")) {
    Reader kr(*kj, where + ": codec");
    kr.get("kind", c.codec.kind);
    kr.get("stride", c.codec.stride);
    std::vector<int> isize{c.latent_height * c.codec.stride, c.latent_width * c.codec.stride};
    kr.get("image_size", isize);
    kr.get("weights", c.codec.weights);
    kr.get("dtype", c.codec.dtype);
    if (isize.size() != 2) throw Error(str_cat(where, ": field 'codec.image_size': expected [h, w]"));
    c.codec.image_height = isize[0];
    c.codec.image_width = isize[1];
    kr.finish();
  }
  r.finish();
  try {
    if (std::optional<Prediction> p = parse_prediction(prediction)) c.prediction = *p;
    else throw Error(str_cat("DitConfig '", c.name, "': field 'prediction': must be \"v\" or \"x0\", got \"",
                             prediction, "\""));
    c.validate();
  } catch (const Error& e) {
    throw Error(str_cat(where, ": ", e.what()));
  }
  if (tpf >= 0 && tpf != c.tokens_per_frame())
    throw Error(str_cat(where, ": field 'tokens_per_frame': ", tpf, " disagrees with latent_size / patch = ",
                        c.tokens_per_frame()));
  return c;
}

DitConfig load_config(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(str_cat(path, ": cannot open the config file"));
  nlohmann::json j;
  try {
    f >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat(path, ": invalid JSON: ", e.what()));
  }
  return config_from_json(j, path);
}

nlohmann::json config_to_json(const DitConfig& c) {
  nlohmann::json j;
  j["name"] = c.name;
  j["dim"] = c.dim;
  j["n_layers"] = c.n_layers;
  j["n_heads"] = c.n_heads;
  j["head_dim"] = c.head_dim;
  j["ffn_dim"] = c.ffn_dim;
  j["patch"] = {c.patch_t, c.patch_h, c.patch_w};
  j["latent_channels"] = c.latent_channels;
  j["latent_size"] = {c.latent_height, c.latent_width};
  j["tokens_per_frame"] = c.tokens_per_frame();
  j["frames_per_chunk"] = c.frames_per_chunk;
  j["freq_dim"] = c.freq_dim;
  j["timestep_scale"] = c.timestep_scale;
  j["eps"] = c.eps;
  j["qk_norm"] = c.qk_norm;
  j["prediction"] = prediction_name(c.prediction);
  j["rope"] = {{"theta", c.rope.axes.empty() ? 10000.0 : c.rope.axes[0].theta},
               {"split", {c.rope.axes.at(0).channels, c.rope.axes.at(1).channels, c.rope.axes.at(2).channels}}};
  j["conditioning"] = {{"pose", c.cond.pose},
                       {"action_dim", c.cond.action_dim},
                       {"ray_embedding", c.cond.ray_embedding},
                       {"hfov_deg", c.cond.hfov_deg},
                       {"pos_bands", c.cond.pos_bands},
                       {"pos_scale", c.cond.pos_scale},
                       {"yaw_harmonics", c.cond.yaw_harmonics},
                       {"hidden", c.cond.hidden},
                       {"yaw_rope_pairs", c.cond.yaw_rope_pairs},
                       {"warp_reference", c.cond.warp_reference}};
  if (c.cond.reference_residual) j["conditioning"]["reference_residual"] = true;
  j["codec"] = {{"kind", c.codec.kind},
                {"stride", c.codec.stride},
                {"image_size", {c.codec.image_height, c.codec.image_width}}};
  if (!c.codec.weights.empty()) j["codec"]["weights"] = c.codec.weights;
  if (!c.codec.dtype.empty()) j["codec"]["dtype"] = c.codec.dtype;
  return j;
}

}  // namespace wm::dit
