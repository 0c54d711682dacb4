#pragma once
// Writes a float32 array as a NumPy .npy file (format 1.0, little-endian '<f4', C order), which
// numpy.load reads. Header-only; the file is whole or absent (cli::OutputFile).
#include <ATen/ATen.h>

#include <string>

#include "tools/cli/output_file.h"

namespace wm::cli {

// The .npy bytes of a float32 array of the given shape (header padded so the data starts at a
// multiple of 64 bytes, as numpy writes it).
inline std::string npy_header(const std::vector<int64_t>& shape) {
  std::string dims;  // Python's tuple repr: "(5,)", "(2, 3)", "()"
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t pre = 10;  // magic (6) + version (2) + header length (2)
  size_t total = pre + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string h = "\x93NUMPY";
  h += static_cast<char>(1);
  h += static_cast<char>(0);
  h += static_cast<char>(dict.size() & 0xff);
  h += static_cast<char>((dict.size() >> 8) & 0xff);
  return h + dict;
}

// Writes t (any float dtype and device; converted to float32 on the CPU) into f's stream; the
// caller commits f (a program that opens its outputs up front and commits them together).
inline void write_npy(OutputFile& f, const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU, at::kFloat).contiguous();
  const std::string h = npy_header(c.sizes().vec());
  f.stream().write(h.data(), static_cast<std::streamsize>(h.size()));
  f.stream().write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * sizeof(float)));
}

// Writes t (as write_npy) to path. Throws wm::Error if the file cannot be written; nothing is
// left under path then.
inline void save_npy(const std::string& path, const at::Tensor& t) {
  OutputFile f(path);
  write_npy(f, t);
  f.commit();
}

}  // namespace wm::cli
