#include "llmkv/json_file.h"

#include <fstream>
#include <sstream>

#include "runtime/error.h"

namespace wm::llm {

nlohmann::json read_json_file(const std::string& path) {
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
