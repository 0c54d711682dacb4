#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/error.h"
#include "runtime/mapped_storage.h"
#include "test_util.h"

namespace wm::mapped_storage_test {

namespace fs = std::filesystem;

// The /proc/self/maps line of the mapping that holds address p, or "" when none does.
std::string mapping_of(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    in >> std::hex >> lo >> dash >> hi;
    if (a >= lo && a < hi) return line;
  }
  return "";
}

// A tensor from the storage is a shared mapping of a file in its folder, which no one can name
// (the folder lists nothing); what is written reads back; the bytes are counted while a view
// lives and given back with the last one.
TEST(MappedStorage, TensorsAreUnnamedFilesInTheFolder) {
  const test::TempFolder dir("wm_mapped_");
  const MappedStorage storage(dir.path.string());
  at::Tensor t = storage.empty({3, 1000, 16}, at::kBFloat16);
  ASSERT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(storage.bytes(), 3u * 1000 * 16 * 2);
  const std::string line = mapping_of(t.data_ptr());
  EXPECT_NE(line.find(" rw-s "), std::string::npos) << line;                      // shared, writable
  EXPECT_NE(line.find(fs::canonical(dir.path).string()), std::string::npos) << line;  // a file of the folder
  EXPECT_TRUE(fs::is_empty(dir.path));  // and no name there
  const at::Tensor src = at::randn({3, 1000, 16}).to(at::kBFloat16);
  t.copy_(src);
  EXPECT_TRUE(test::bit_equal(t, src));
  at::Tensor view = t.narrow(1, 10, 5);
  t = at::Tensor();
  EXPECT_EQ(storage.bytes(), 3u * 1000 * 16 * 2);  // the view keeps the file
  EXPECT_TRUE(test::bit_equal(view, src.narrow(1, 10, 5)));
  const void* p = view.data_ptr();
  view = at::Tensor();
  EXPECT_EQ(storage.bytes(), 0u);
  EXPECT_EQ(mapping_of(p), "");  // unmapped
  EXPECT_EQ(storage.empty({0, 16}, at::kFloat).numel(), 0);
}

// The limit holds: a tensor that would pass it is refused, naming the folder, and nothing is
// counted for it; room given back can be used again.
TEST(MappedStorage, RefusesTensorsPastItsLimit) {
  const test::TempFolder dir("wm_mapped_");
  const MappedStorage storage(dir.path.string(), 4096);
  at::Tensor a = storage.empty({512}, at::kFloat);  // 2048 bytes
  try {
    storage.empty({513}, at::kFloat);
    FAIL() << "a tensor past the limit was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path.string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(storage.bytes(), 2048u);
  at::Tensor b = storage.empty({512}, at::kFloat);  // exactly at the limit
  a = at::Tensor();
  EXPECT_NO_THROW(storage.empty({512}, at::kFloat));
}

// Only a real folder: a missing path, a file and a symbolic link to a folder are refused.
TEST(MappedStorage, RefusesWhatIsNotAFolder) {
  const test::TempFolder dir("wm_mapped_");
  EXPECT_THROW(MappedStorage((dir.path / "missing").string()), Error);
  std::ofstream(dir.path / "file") << "x";
  EXPECT_THROW(MappedStorage((dir.path / "file").string()), Error);
  fs::create_directory(dir.path / "real");
  fs::create_directory_symlink(dir.path / "real", dir.path / "link");
  EXPECT_THROW(MappedStorage((dir.path / "link").string()), Error);
  EXPECT_THROW(MappedStorage(""), Error);
  EXPECT_NO_THROW(MappedStorage((dir.path / "real").string()));
}

}  // namespace wm::mapped_storage_test
