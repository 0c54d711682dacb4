#pragma once
// PyTorch checkpoints written by torch.save (the zip format of torch >= 1.6), read without
// Python and without executing anything: a zip reader of our own and a restricted pickle
// interpreter that knows only what a state dict is made of.
//
// What is read: a top-level dict or collections.OrderedDict of name -> tensor (nn.Parameter
// too), or a top-level dict that nests such a dict under one key: "state_dict",
// "model_state_dict", "model" or "module" (tried in that order), else the only value that is a
// dict of tensors. Other values beside the nested state dict may be plain Python data (None,
// bools, ints, floats, strings, bytes, tuples, lists, dicts, tensors); anything else is refused.
//
// The archive: entries stored (uncompressed), as torch.save writes them, zip64 included;
// `<archive>/data.pkl` (the pickle; its CRC-32 is checked), `<archive>/data/<key>` (one storage
// each), `<archive>/byteorder` ("little"; a big-endian file is refused; a missing one means
// little). The pickle may use the opcodes of protocols 1-5 that a state dict needs; the only
// globals it may name are collections.OrderedDict, torch._utils._rebuild_tensor(_v2),
// torch._utils._rebuild_parameter(_with_state) and the typed storages torch.FloatStorage,
// HalfStorage, BFloat16Storage, DoubleStorage, LongStorage, IntStorage, ShortStorage,
// CharStorage, ByteStorage, BoolStorage. Every count, size and byte range is checked against the
// file: a malformed file gives wm::CorruptData naming the file and the fault, never a crash or
// an allocation out of proportion to the file (tensors built from it total at most
// 4 x the file size + 64 MiB, so stride-0 broadcasts and shared views stay bounded).
// Legacy (pre-1.6, non-zip) checkpoints and TorchScript archives are refused by name.
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace wm {

// One tensor of a state dict as saved, before its data is read.
struct PthTensorInfo {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;  // in elements, as saved (the loaded tensor is contiguous)
  int64_t storage_offset = 0;   // in elements, into the storage
  std::string storage;          // the storage's key: the entry <archive>/data/<key>
  int64_t storage_numel = 0;    // elements of that storage
  // The pickled tensor object: two names with the same object are one tensor saved twice
  // (tied weights); load_pth gives both names the same at::Tensor.
  size_t object = 0;
};

// An opened .pth file: the archive validated and the pickle interpreted; tensor data is read
// by get(), from the file, which stays open while the object (or a copy of it) lives. get() may
// be called from several threads at once.
class PthFile {
 public:
  // Opens and validates `path`. Throws wm::Error if it cannot be opened, wm::CorruptData naming
  // the file and the fault for anything malformed, refused or not a state dict.
  static PthFile open(const std::string& path);

  const std::string& path() const { return path_; }
  // The state dict's tensors in file order.
  const std::vector<PthTensorInfo>& tensors() const { return tensors_; }
  // "" when the top-level dict is the state dict, else the key it was found under.
  const std::string& state_dict_key() const { return state_dict_key_; }
  // Tensor i (< tensors().size()): on the CPU, contiguous, with the saved dtype and shape, owning
  // its memory (nothing shared with the file or with other results). Throws wm::Error if i is
  // out of range, wm::CorruptData if a bool tensor holds a byte other than 0 or 1.
  at::Tensor get(size_t i) const;

 private:
  struct Source;
  std::shared_ptr<const Source> src_;
  std::string path_;
  std::vector<PthTensorInfo> tensors_;
  std::vector<uint64_t> storage_begin_;  // per tensor: file offset of its storage's bytes
  std::string state_dict_key_;
};

// The state dict of a .pth file, in file order (PthFile::open, then every get(); tied names share
// one tensor). Throws as PthFile::open.
std::vector<std::pair<std::string, at::Tensor>> load_pth(const std::string& path);

// The kinds of checkpoint file that load_state_dict tells apart by their first bytes.
enum class CheckpointFormat { Safetensors, PthZip, PthLegacy, Unknown };

// The format of `path` from its first bytes (not its name): "PK\3\4" a zip (.pth), an 8-byte
// little-endian length then '{' safetensors, the pickled magic number of torch's pre-1.6 format
// legacy. Throws wm::Error if the file cannot be read.
CheckpointFormat sniff_checkpoint_format(const std::string& path);

// Every tensor of a safetensors file or a .pth zip by name, on the CPU, whichever the file is
// (sniff_checkpoint_format). Throws wm::CorruptData naming the file for a legacy .pth, an unknown
// format or a malformed file, wm::Error if it cannot be read.
std::map<std::string, at::Tensor> load_state_dict(const std::string& path);

}  // namespace wm
