#pragma once
// The JSON and text files of a model folder: read whole and bounded, written whole, and the file
// names an index (`*.safetensors.index.json`) gives checked to stay inside its folder.
#include <nlohmann/json.hpp>

#include <string>

namespace wm {

// The file's JSON, read whole. Throws wm::Error naming the path when it cannot be opened or
// read, is a folder, a link to nothing, no regular file or over 256 MiB; wm::CorruptData (a
// wm::Error) naming it when it is not valid JSON.
nlohmann::json read_json_file(const std::string& path);

// Throws wm::Error naming `index` unless `name` (a shard an index names) is a plain file name
// inside the index's folder: not empty, not absolute, no folder part, not "." or "..".
void check_index_file_name(const std::string& name, const std::string& index);

// Writes text to path whole: a temporary file beside it (its name and this process's id), then
// a rename over path; the temporary is created exclusively (an existing file or link of that
// name is an error, never written through or removed) and removed on failure. Throws wm::Error
// naming `who` and the file.
void write_text_atomically(const std::string& path, const std::string& text, const std::string& who);

}  // namespace wm
