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

namespace json_fields {

using nlohmann::json;

void corrupt(const std::string& origin, const std::string& what) { throw CorruptData(str_cat(origin, ": ", what)); }

void unsupported(const std::string& origin, const std::string& what) { throw Error(str_cat(origin, ": ", what)); }

const json& field(const json& obj, const char* key, const std::string& where, const std::string& origin) {
  if (!obj.is_object()) corrupt(origin, str_cat(where, " is not a JSON object"));
  auto it = obj.find(key);
  if (it == obj.end()) corrupt(origin, str_cat(where, " lacks the field \"", key, "\""));
  return *it;
}

bool opt_bool(const json& obj, const char* key, bool dflt, const std::string& where, const std::string& origin) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) corrupt(origin, str_cat(where, ".", key, " is not a boolean"));
  return it->get<bool>();
}

int64_t int_in(const json& v, int64_t lo, int64_t hi, const std::string& where, const std::string& origin) {
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    corrupt(origin, str_cat(where, " is not an integer in [", lo, ", ", hi, "]: ", v.dump()));
  return v.get<int64_t>();
}

std::string string_of(const json& v, const std::string& where, const std::string& origin) {
  if (!v.is_string()) corrupt(origin, str_cat(where, " is not a string"));
  return v.get<std::string>();
}

std::string type_of(const json& obj, const std::string& where, const std::string& origin) {
  return string_of(field(obj, "type", where, origin), str_cat(where, ".type"), origin);
}

std::string quoted(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace json_fields

}  // namespace wm::llm
