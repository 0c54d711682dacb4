#pragma once
// Saving and loading a CausalDit's parameters as safetensors, by tensor name (the names are the
// module paths, which mirror Wan checkpoint keys; see model.h). The config JSON travels in the
// file's metadata under "config".
#include <map>
#include <string>
#include <vector>

#include "dit/config.h"
#include "dit/model.h"
#include "runtime/safetensors.h"

namespace wm::dit {

struct LoadOptions {
  std::string strip_prefix;  // removed from every file name that starts with it ("model.", ...)
  bool strict = true;        // a file tensor the model does not have is an error (else ignored)
  std::string ignore_prefix; // file tensors whose names start with it are not looked at
                             // (load_weights: "" means kCodecPrefix)
};

// Names of a codec's tensors carried in a DiT file (see save_weights).
inline constexpr const char* kCodecPrefix = "codec.";

// Copies every parameter of `module` from the open file `st` (file names are the module's
// parameter paths once opt.strip_prefix is removed). Throws wm::Error naming st's file and the
// tensor for a missing tensor, an unexpected one (strict), a shape mismatch (both shapes), a
// non-float tensor or non-finite values; `what` names the model in those messages. The module
// is unchanged on error.
void load_parameters(torch::nn::Module& module, const SafeTensors& st, const LoadOptions& opt,
                     const std::string& what);

// Writes every parameter (float32 or its own dtype, moved to the CPU) and the config JSON.
// A model whose codec is "conv_ae" carries it: the codec file's tensors ("codec.*") and its
// "codec_config" go into the file too, and the stored config's codec.weights is "" (this file;
// config_from_weights reads it back as the file's path). Throws wm::Error on an I/O failure or
// a conv_ae codec file that cannot be read.
void save_weights(CausalDitImpl& model, const std::string& path,
                  const std::map<std::string, std::string>& extra_metadata = {});

// Copies every parameter from the file into the model (converted to the parameter's dtype and
// device). Throws wm::Error naming the file and the tensor for a missing tensor, an unexpected
// one (strict), or a shape mismatch (both shapes named). The model is unchanged on error.
void load_weights(CausalDitImpl& model, const std::string& path, const LoadOptions& opt = {});

// The config stored in a file's metadata (a carried conv_ae codec's weights: the file itself).
// Throws wm::Error if there is none.
DitConfig config_from_weights(const std::string& path);

// What init_from copied.
struct InitReport {
  int copied = 0;                  // tensors of the same name and shape
  std::vector<std::string> fresh;  // left as they were (no tensor of that name, or another shape)
};

// Starts `to` from another model's parameters: tensors of the same name and shape are copied, the
// rest is left as it is (a reference_embedding that init_weights(.., zero_head) zeroed keeps the
// model computing what `from` did). Both models on one device.
InitReport init_from(const CausalDitImpl& from, CausalDitImpl& to);

// Builds the model a file describes (its stored config), loads it and moves it to device.
CausalDit load_model(const std::string& path, at::Device device, const LoadOptions& opt = {});

}  // namespace wm::dit
