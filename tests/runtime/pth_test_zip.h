#pragma once
// A minimal zip writer for the .pth reader's tests and fuzz target: entries stored (no
// compression), with their CRC-32, a central directory and an end record, as torch.save lays
// them out (without its alignment padding). Header-only, no libtorch.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace wm::test {

inline uint32_t zip_crc32(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

// A zip archive of (name, bytes) entries, all stored.
inline std::string zip_stored(const std::vector<std::pair<std::string, std::string>>& entries) {
  auto put = [](std::string& s, uint64_t v, int bytes) {
    for (int k = 0; k < bytes; ++k) s.push_back(static_cast<char>((v >> (8 * k)) & 0xFF));
  };
  std::string out, central;
  for (const auto& [name, data] : entries) {
    const uint32_t crc = zip_crc32(data);
    const uint64_t offset = out.size();
    put(out, 0x04034b50u, 4), put(out, 20, 2), put(out, 0, 2), put(out, 0, 2), put(out, 0, 4);
    put(out, crc, 4), put(out, data.size(), 4), put(out, data.size(), 4), put(out, name.size(), 2), put(out, 0, 2);
    out += name;
    out += data;
    put(central, 0x02014b50u, 4), put(central, 20, 2), put(central, 20, 2), put(central, 0, 2), put(central, 0, 2);
    put(central, 0, 4), put(central, crc, 4), put(central, data.size(), 4), put(central, data.size(), 4);
    put(central, name.size(), 2), put(central, 0, 2), put(central, 0, 2), put(central, 0, 2), put(central, 0, 2);
    put(central, 0, 4), put(central, offset, 4);
    central += name;
  }
  const uint64_t cd_offset = out.size();
  out += central;
  put(out, 0x06054b50u, 4), put(out, 0, 2), put(out, 0, 2), put(out, entries.size(), 2), put(out, entries.size(), 2);
  put(out, central.size(), 4), put(out, cd_offset, 4), put(out, 0, 2);
  return out;
}

// A .pth archive around a pickle: archive/data.pkl, archive/byteorder ("little") and the
// storages archive/data/<key>.
inline std::string pth_archive(const std::string& pickle,
                               const std::vector<std::pair<std::string, std::string>>& storages) {
  std::vector<std::pair<std::string, std::string>> entries = {{"archive/data.pkl", pickle},
                                                              {"archive/byteorder", "little"}};
  for (const auto& [key, bytes] : storages) entries.emplace_back("archive/data/" + key, bytes);
  return zip_stored(entries);
}

}  // namespace wm::test
