#include "llmkv/json_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"

namespace wm::llm {

nlohmann::json read_json_file(const std::string& path) {
  std::error_code ec;
  if (path.empty()) throw Error("a JSON file's path is empty");
  if (std::filesystem::is_directory(path, ec)) throw Error(str_cat(path, ": is a folder, not a JSON file"));
  if (std::filesystem::is_symlink(path, ec) && !std::filesystem::exists(path, ec))
    throw Error(str_cat(path, ": is a link to ", std::filesystem::read_symlink(path, ec).string(),
                        ", which does not exist"));
  // A device or FIFO (a link to /dev/zero) would be read without end; a model's largest JSON, a
  // tokenizer.json, is tens of MB.
  constexpr uintmax_t kMaxBytes = uintmax_t(256) << 20;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw Error(str_cat(path, ": is not a regular file"));
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxBytes)
    throw Error(str_cat(path, ": is ", size, " bytes, more than a JSON file of a model folder may be (", kMaxBytes, ")"));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str_cat(path, ": cannot open"));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(str_cat(path, ": cannot read"));
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw CorruptData(str_cat(path, ": not valid JSON: ", e.what()));
  }
}

}  // namespace wm::llm
