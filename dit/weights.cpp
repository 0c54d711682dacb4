#include "dit/weights.h"

#include <ATen/core/grad_mode.h>

#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace wm::dit {

void save_weights(CausalDitImpl& model, const std::string& path,
                  const std::map<std::string, std::string>& extra_metadata) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& p : model.named_parameters(true)) tensors.emplace_back(p.key(), p.value().detach());
  std::map<std::string, std::string> meta = extra_metadata;
  meta["format"] = "wm_dit";
  DitConfig cfg = model.config();
  if (cfg.codec.kind == "conv_ae") {
    // The file carries its codec: the tensors and config of cfg.codec.weights, read whole
    // before the write (it may be the file being replaced).
    if (cfg.codec.weights.empty())
      throw Error(str_cat(path, ": the model's conv_ae codec has no weights file to carry"));
    SafeTensors src = SafeTensors::open(cfg.codec.weights);
    auto it = src.metadata().find("codec_config");
    if (it == src.metadata().end())
      throw Error(str_cat(cfg.codec.weights, ": no 'codec_config' in the safetensors metadata: not a conv_ae codec"));
    meta["codec_config"] = it->second;
    for (const auto& n : src.names())
      if (n.rfind(kCodecPrefix, 0) == 0) tensors.emplace_back(n, src.get(n).clone());
    cfg.codec.weights.clear();  // "": this file
  }
  meta["config"] = config_to_json(cfg).dump();
  save_safetensors(path, tensors, meta);
}

void load_parameters(torch::nn::Module& model, const SafeTensors& st, const LoadOptions& opt,
                     const std::string& what) {
  const std::string& path = st.path();
  auto file_name = [&](const std::string& n) {
    return !opt.strip_prefix.empty() && n.rfind(opt.strip_prefix, 0) == 0 ? n.substr(opt.strip_prefix.size()) : n;
  };
  std::map<std::string, std::string> in_file;  // model name -> file name
  for (const auto& n : st.names())
    if (opt.ignore_prefix.empty() || n.rfind(opt.ignore_prefix, 0) != 0) in_file[file_name(n)] = n;

  auto params = model.named_parameters(true);
  // Check everything before touching the model.
  for (const auto& p : params) {
    auto it = in_file.find(p.key());
    if (it == in_file.end())
      throw Error(str_cat(path, ": missing tensor '", opt.strip_prefix, p.key(), "' (expected shape ",
                          p.value().sizes(), ")"));
    const auto& e = st.entry(it->second);
    if (!at::isFloatingType(e.dtype))
      throw Error(str_cat(path, ": tensor '", it->second, "' is ", c10::toString(e.dtype),
                          ", a weight must be a floating-point type (F32, F16, BF16 or F64)"));
    if (at::IntArrayRef(e.shape) != p.value().sizes())
      throw Error(str_cat(path, ": tensor '", it->second, "' has shape ", at::IntArrayRef(e.shape),
                          ", the model expects ", p.value().sizes()));
  }
  if (opt.strict) {
    std::set<std::string> known;
    for (const auto& p : params) known.insert(p.key());
    for (const auto& kv : in_file)
      if (!known.count(kv.first))
        throw Error(str_cat(path, ": unexpected tensor '", kv.second, "' (shape ",
                            at::IntArrayRef(st.entry(kv.second).shape), ") not in model '", what, "'"));
  }
  // Read and check every tensor before the first copy, so a bad file leaves the model as it was.
  std::vector<at::Tensor> values;
  values.reserve(params.size());
  for (const auto& p : params) {
    const std::string& name = in_file.at(p.key());
    at::Tensor t = st.get(name);
    if (!at::isfinite(t).all().item<bool>())
      throw Error(str_cat(path, ": tensor '", name, "' holds ",
                          (~at::isfinite(t)).sum().item<int64_t>(), " non-finite values (NaN or inf)"));
    values.push_back(std::move(t));
  }
  at::NoGradGuard ng;
  for (size_t i = 0; i < params.size(); ++i) params[i].value().copy_(values[i]);
}

void load_weights(CausalDitImpl& model, const std::string& path, const LoadOptions& opt) {
  LoadOptions o = opt;
  if (o.ignore_prefix.empty()) o.ignore_prefix = kCodecPrefix;  // a carried codec is not the DiT's
  load_parameters(model, SafeTensors::open(path), o, model.config().name);
}

DitConfig config_from_weights(const std::string& path) {
  SafeTensors st = SafeTensors::open(path);
  auto it = st.metadata().find("config");
  if (it == st.metadata().end()) throw Error(str_cat(path, ": no 'config' in the safetensors metadata"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat(path, ": metadata 'config' is not valid JSON: ", e.what()));
  }
  DitConfig c = config_from_json(j, path + " (metadata config)");
  if (c.codec.kind == "conv_ae" && c.codec.weights.empty()) c.codec.weights = path;  // carried in the file
  return c;
}

CausalDit load_model(const std::string& path, at::Device device, const LoadOptions& opt) {
  CausalDit m(config_from_weights(path));
  load_weights(*m, path, opt);
  m->to(device);
  return m;
}

InitReport init_from(const CausalDitImpl& from, CausalDitImpl& to) {
  InitReport r;
  const auto src = from.named_parameters(true);
  at::NoGradGuard ng;
  for (auto& p : to.named_parameters(true)) {
    const at::Tensor* t = src.find(p.key());
    at::Tensor& dst = p.value();
    if (t && t->sizes() == dst.sizes()) {
      dst.copy_(*t);
      ++r.copied;
    } else {
      r.fresh.push_back(p.key());
    }
  }
  return r;
}

}  // namespace wm::dit
