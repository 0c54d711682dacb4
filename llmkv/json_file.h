#pragma once
// Reading the JSON files of a model folder (config.json, tokenizer.json, an index, ...).
#include <nlohmann/json.hpp>

#include "runtime/json_file.h"

#include <cstdint>
#include <string>

namespace wm::llm {

// The core's (runtime/json_file.h), by the name the LLM path has always used.
using wm::read_json_file;

// Reading the fields of a tokenizer file's JSON, each failure naming the file (origin) and the
// field's place in it (where: "model", "normalizer.normalizers[2]", ...).
namespace json_fields {
// Throw wm::CorruptData (a value the format does not allow) or wm::Error (one we do not support),
// as "origin: what".
[[noreturn]] void corrupt(const std::string& origin, const std::string& what);
[[noreturn]] void unsupported(const std::string& origin, const std::string& what);
// obj[key]; corrupt when obj is no object or lacks key.
const nlohmann::json& field(const nlohmann::json& obj, const char* key, const std::string& where, const std::string& origin);
// obj[key] as a boolean, dflt when absent or null; corrupt when it is something else.
bool opt_bool(const nlohmann::json& obj, const char* key, bool dflt, const std::string& where, const std::string& origin);
// v as an integer in [lo, hi]; corrupt otherwise.
int64_t int_in(const nlohmann::json& v, int64_t lo, int64_t hi, const std::string& where, const std::string& origin);
// v as a string; corrupt otherwise.
std::string string_of(const nlohmann::json& v, const std::string& where, const std::string& origin);
// obj["type"] as a string.
std::string type_of(const nlohmann::json& obj, const std::string& where, const std::string& origin);
// s as a JSON string literal, invalid UTF-8 replaced: for quoting input in messages.
std::string quoted(const std::string& s);
}  // namespace json_fields

}  // namespace wm::llm
