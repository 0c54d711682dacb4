#include "llmkv/chat_template.h"

#include "llmkv/tokenizer.h"
#include "runtime/error.h"

namespace wm::llm {
namespace {

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

}  // namespace wm::llm
