#pragma once
// Reading the JSON files of a model folder (config.json, tokenizer.json, an index, ...).
#include <nlohmann/json.hpp>

#include <string>

namespace wm::llm {

// The file's JSON, read whole. Throws wm::Error naming the path when it cannot be opened or
// read, is a folder, a link to nothing, no regular file or over 256 MiB; wm::CorruptData (a
// wm::Error) naming it when it is not valid JSON.
nlohmann::json read_json_file(const std::string& path);

}  // namespace wm::llm
