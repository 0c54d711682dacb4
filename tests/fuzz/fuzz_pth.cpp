// libFuzzer target: the .pth reader (runtime/pth.h), the zip archive and the restricted pickle
// interpreter, then every tensor read. An input that starts with "PK" is a whole .pth file;
// any other input is a data.pkl, wrapped into an archive (tests/runtime/pth_test_zip.h) with
// storages "0" to "15" of 64 bytes each, so that mutations of the pickle are not undone by the
// archive's offsets and CRC (the seeds *.pkl reference such storages).
#include "runtime/error.h"
#include "runtime/pth.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/runtime/pth_test_zip.h"

WM_FUZZ_TARGET(pth) {
  const bool whole = size >= 2 && data[0] == 'P' && data[1] == 'K';
  std::string wrapped;
  if (!whole) {
    std::vector<std::pair<std::string, std::string>> storages;
    for (int k = 0; k < 16; ++k) {  // bytes 0 and 1 only, so that bool storages read too
      std::string bytes(64, '\0');
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 7 + k) % 3 == 0);
      storages.emplace_back(std::to_string(k), bytes);
    }
    wrapped = wm::test::pth_archive(std::string(reinterpret_cast<const char*>(data), size), storages);
  }
  const std::string& path = whole ? wm::fuzz::write_input(data, size, ".pth")
                                  : wm::fuzz::write_input(reinterpret_cast<const uint8_t*>(wrapped.data()),
                                                          wrapped.size(), ".pth");
  try {
    const wm::PthFile f = wm::PthFile::open(path);
    for (size_t i = 0; i < f.tensors().size(); ++i) {
      const wm::PthTensorInfo& info = f.tensors()[i];
      at::Tensor t = f.get(i);
      if (t.sizes() != c10::IntArrayRef(info.shape) || t.scalar_type() != info.dtype || !t.is_contiguous()) std::abort();
    }
  } catch (const wm::Error&) {
  }
  return 0;
}
