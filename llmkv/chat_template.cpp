#include "llmkv/chat_template.h"

#include <filesystem>
#include <optional>
#include <fstream>
#include <sstream>

#include "llmkv/jinja.h"
#include "llmkv/json_file.h"
#include "llmkv/tokenizer.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

struct BuiltinTemplate {
  const char* name;
  const char* bos_token;  // nullptr: the family has none
  const char* eos_token;
  const char* source;
};

// The sources, byte for byte, of tests/llmkv/fixtures/chat_templates/templates/<name>.jinja.
const BuiltinTemplate kBuiltins[] = {
#include "llmkv/chat_template_builtin.inc"
};

std::string without_final_newline(std::string s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// The token as the template sees it: the text of a string, or of an added-token object's content.
std::string config_token_text(const nlohmann::json& config, const char* key, const std::string& origin) {
  if (!config.contains(key) || config[key].is_null()) return "";
  const nlohmann::json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  throw Error(origin + ": " + key + " is neither a string nor an object with a string 'content'");
}

// A chat_template.jinja file, at most 1 MiB (the interpreter's limit on a template's size).
std::string read_template_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(path.string() + ": cannot be read (" + ec.message() + ")");
  if (size > (size_t{1} << 20))
    throw Error(path.string() + ": " + std::to_string(size) + " bytes, over the 1 MiB a chat template may have");
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (!f.good() && !f.eof()) throw Error(path.string() + ": cannot be read");
  return ss.str();
}

constexpr const char* kStart = "<|im_start|>";
constexpr const char* kEnd = "<|im_end|>";

void check_roles(const std::vector<ChatMessage>& messages, const char* where) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      throw Error(str_cat(where, ": message ", i, " has role \"", r,
                          "\" (expected system, user, assistant or tool)"));
  }
}

int64_t special_id(const Tokenizer& tok, const char* text) {
  const auto id = tok.token_to_id(text);
  if (!id || !tok.is_special(*id))
    throw Error(str_cat("encode_chatml: ", tok.origin(), " has no special token ", text));
  return *id;
}

}  // namespace

ChatTemplate ChatTemplate::from_source(std::string source, std::string bos_token, std::string eos_token) {
  ChatTemplate t;
  t.name_ = "custom";
  for (const BuiltinTemplate& b : kBuiltins)
    if (without_final_newline(b.source) == without_final_newline(source)) t.name_ = b.name;
  t.template_ = std::make_shared<const jinja::Template>(jinja::Template::parse(source, "chat template " + t.name_));
  t.source_ = std::move(source);
  t.bos_ = std::move(bos_token);
  t.eos_ = std::move(eos_token);
  return t;
}

ChatTemplate ChatTemplate::named(const std::string& name) {
  for (const BuiltinTemplate& b : kBuiltins)
    if (name == b.name) return from_source(b.source, b.bos_token != nullptr ? b.bos_token : "", b.eos_token);
  std::string names;
  for (const std::string& n : builtin_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error("ChatTemplate::named: no built-in chat template '" + name + "' (have: " + names + ")");
}

std::vector<std::string> ChatTemplate::builtin_names() {
  std::vector<std::string> out;
  for (const BuiltinTemplate& b : kBuiltins) out.emplace_back(b.name);
  return out;
}

ChatTemplate ChatTemplate::from_hf_folder(const std::string& folder) {
  namespace fs = std::filesystem;
  const fs::path dir(folder);
  const fs::path config_path = dir / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (fs::exists(config_path)) config = read_json_file(config_path.string());
  const std::string origin = config_path.string();
  if (!config.is_object()) throw Error(origin + ": not a JSON object");
  const std::string bos = config_token_text(config, "bos_token", origin),
                    eos = config_token_text(config, "eos_token", origin);
  const fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::is_regular_file(jinja_path)) return from_source(read_template_file(jinja_path), bos, eos);
  if (!config.contains("chat_template") || config["chat_template"].is_null())
    throw Error(folder +
                ": no chat template (neither chat_template.jinja nor a chat_template in tokenizer_config.json)");
  const nlohmann::json& ct = config["chat_template"];
  if (ct.is_string()) return from_source(ct.get<std::string>(), bos, eos);
  if (ct.is_array())
    for (const nlohmann::json& entry : ct)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return from_source(entry["template"].get<std::string>(), bos, eos);
  throw Error(origin + ": chat_template is neither a string nor a list holding a 'default' template");
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return render_json(list, add_generation_prompt);
}

std::string ChatTemplate::render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                      const nlohmann::ordered_json& tools,
                                      const nlohmann::ordered_json& variables) const {
  const std::string where = "chat template " + name_;
  if (!messages.is_array()) throw Error(where + ": the messages must be a JSON array");
  if (!tools.is_null() && !tools.is_array()) throw Error(where + ": tools must be null or a JSON array");
  if (!variables.is_object()) throw Error(where + ": the variables must be a JSON object");
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  if (!bos_.empty()) vars["bos_token"] = bos_;
  if (!eos_.empty()) vars["eos_token"] = eos_;
  for (auto it = variables.begin(); it != variables.end(); ++it) vars[it.key()] = it.value();
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) throw Error(where + ": message " + std::to_string(i) + " is not a JSON object");
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (auto it = messages[i].begin(); it != messages[i].end(); ++it)
      if (!it.value().is_null()) m[it.key()] = it.value();
    msgs.push_back(std::move(m));
  }
  vars["messages"] = std::move(msgs);
  vars["tools"] = tools;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  jinja::RenderOptions options;
  options.now = now_;
  return template_->render(vars, options);
}

ChatTemplate ChatTemplate::with_time(std::time_t now) const {
  ChatTemplate t = *this;
  t.now_ = now;
  return t;
}

std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  check_roles(messages, "render_chatml");
  std::string out;
  for (const ChatMessage& m : messages) {
    out += kStart;
    out += m.role;
    out += '\n';
    out += m.content;
    out += kEnd;
    out += '\n';
  }
  if (add_generation_prompt) {
    out += kStart;
    out += "assistant\n";
  }
  return out;
}

std::vector<int64_t> encode_chatml(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt) {
  check_roles(messages, "encode_chatml");
  const int64_t start = special_id(tokenizer, kStart), end = special_id(tokenizer, kEnd);
  std::vector<int64_t> out;
  auto append = [&](const std::string& text) {
    const auto ids = tokenizer.encode(text, /*allow_special=*/false);
    out.insert(out.end(), ids.begin(), ids.end());
  };
  for (const ChatMessage& m : messages) {
    out.push_back(start);
    append(m.role + "\n" + m.content);
    out.push_back(end);
    append("\n");
  }
  if (add_generation_prompt) {
    out.push_back(start);
    append("assistant\n");
  }
  return out;
}

std::vector<int64_t> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                                 const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  // Markers no text holds: a control byte, a per-call nonce and the index.
  const std::string nonce = std::to_string(reinterpret_cast<uintptr_t>(&messages) ^ 0x5bd1e995u);
  auto marker = [&](size_t i) { return "\x01wm-content-" + nonce + "-" + std::to_string(i) + "\x01"; };
  std::vector<ChatMessage> marked = messages;
  for (size_t i = 0; i < marked.size(); ++i) marked[i].content = marker(i);
  const std::string text = tmpl.render(marked, add_generation_prompt);
  std::vector<int64_t> ids;
  size_t at = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string m = marker(i);
    const size_t found = text.find(m, at);
    if (found == std::string::npos)
      throw Error(str_cat("chat template ", tmpl.name(), ": message ", i, "'s content does not appear in the rendered "
                          "text as it was given (the template changes or drops it); this template cannot be used"));
    if (text.find(m, found + m.size()) != std::string::npos)
      throw Error(str_cat("chat template ", tmpl.name(), ": message ", i, "'s content appears twice in the rendered text"));
    const std::vector<int64_t> head = tokenizer.encode(std::string_view(text).substr(at, found - at), true);
    ids.insert(ids.end(), head.begin(), head.end());
    const std::vector<int64_t> body = tokenizer.encode(messages[i].content, false);
    ids.insert(ids.end(), body.begin(), body.end());
    at = found + m.size();
  }
  const std::vector<int64_t> tail = tokenizer.encode(std::string_view(text).substr(at), true);
  ids.insert(ids.end(), tail.begin(), tail.end());
  return ids;
}

std::optional<std::string> chatml_default_system(const ChatTemplate& tmpl) {
  const std::vector<ChatMessage> user = {{"user", "u"}}, with_system = {{"system", "s"}, {"user", "u"}};
  if (tmpl.render(with_system, true) != render_chatml(with_system, true)) return std::nullopt;
  const std::string got = tmpl.render(user, true), plain = render_chatml(user, true);
  if (got == plain) return std::string();
  const std::string open = "<|im_start|>system\n", close = "<|im_end|>\n";
  if (got.size() < plain.size() + open.size() + close.size() || got.compare(0, open.size(), open) != 0 ||
      got.compare(got.size() - plain.size(), plain.size(), plain) != 0)
    return std::nullopt;
  const std::string block = got.substr(0, got.size() - plain.size());
  if (block.compare(block.size() - close.size(), close.size(), close) != 0) return std::nullopt;
  return block.substr(open.size(), block.size() - open.size() - close.size());
}

std::pair<std::string, std::string> user_message_frame(const ChatTemplate& tmpl) {
  const std::string mark = "\x01user message\x01";
  const std::string text = tmpl.render({{"user", mark}}, true);
  const size_t at = text.find(mark);
  if (at == std::string::npos || text.find(mark, at + 1) != std::string::npos)
    throw Error(str_cat("chat template ", tmpl.name(), ": a user message's content is not written once as it is"));
  return {text.substr(0, at), text.substr(at + mark.size())};
}

}  // namespace wm::llm
