#include "llmkv/json_file.h"

#include <filesystem>
#include <sstream>

#include "runtime/error.h"

namespace wm::llm {

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
