#pragma once
// Writes a float32 array as a NumPy .npy file (format 1.0, little-endian '<f4', C order), which
// numpy.load reads, and reads float arrays back ('<f4' or '<f8', format 1.x to 3.x, C order).
// Header-only; a written file is whole or absent (cli::OutputFile).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>

#include "runtime/error.h"
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

// Reads a float .npy file ('<f4' or '<f8', C order; what numpy.save writes for float32/float64
// arrays) as a tensor of that dtype on the CPU. Throws wm::Error naming the file for anything
// else: another dtype, Fortran order, a bad header, a size that does not match the shape.
inline at::Tensor load_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str_cat(path, ": cannot open"));
  char pre[8];
  if (!f.read(pre, 8) || std::memcmp(pre, "\x93NUMPY", 6) != 0) throw Error(str_cat(path, ": not a .npy file"));
  const int major = static_cast<unsigned char>(pre[6]);
  uint32_t hlen = 0;
  unsigned char b[4] = {0, 0, 0, 0};
  if (major == 1) {
    if (!f.read(reinterpret_cast<char*>(b), 2)) throw Error(str_cat(path, ": truncated header"));
    hlen = b[0] | (uint32_t(b[1]) << 8);
  } else if (major == 2 || major == 3) {
    if (!f.read(reinterpret_cast<char*>(b), 4)) throw Error(str_cat(path, ": truncated header"));
    hlen = b[0] | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16) | (uint32_t(b[3]) << 24);
  } else {
    throw Error(str_cat(path, ": .npy format version ", major, " is not supported"));
  }
  if (hlen > (1u << 20)) throw Error(str_cat(path, ": header of ", hlen, " bytes"));
  std::string header(hlen, '\0');
  if (!f.read(header.data(), hlen)) throw Error(str_cat(path, ": truncated header"));
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'")))
    throw Error(str_cat(path, ": no descr in the header"));
  const std::string descr = m[1];
  if (descr != "<f4" && descr != "<f8")
    throw Error(str_cat(path, ": dtype '", descr, "' (only little-endian float32 '<f4' and float64 '<f8' are read)"));
  if (std::regex_search(header, std::regex("'fortran_order':\\s*True")))
    throw Error(str_cat(path, ": Fortran order is not supported"));
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    throw Error(str_cat(path, ": no shape in the header"));
  std::vector<int64_t> shape;
  const std::string dims = m[1];
  const std::regex number("[0-9]+");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it)
    shape.push_back(std::stoll(it->str()));
  const at::ScalarType dt = descr == "<f4" ? at::kFloat : at::kDouble;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d > (int64_t(1) << 40) / std::max<int64_t>(n, 1)) throw Error(str_cat(path, ": shape too large"));
    n *= d;
  }
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dt));
  const std::streamsize bytes = static_cast<std::streamsize>(n * int64_t(at::elementSize(dt)));
  if (!f.read(static_cast<char*>(t.data_ptr()), bytes))
    throw Error(str_cat(path, ": ", bytes, " bytes of data expected for shape ", t.sizes()));
  return t;
}

}  // namespace wm::cli
