#pragma once
// Qwen2's chat format (ChatML): each message is
//   <|im_start|>{role}\n{content}<|im_end|>\n
// and a prompt that asks for the assistant's turn ends with <|im_start|>assistant\n.
#include <cstdint>
#include <string>
#include <vector>

namespace wm::llm {

class Tokenizer;

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" or "tool"
  std::string content;  // any text
};

// The ChatML text of `messages`, followed by "<|im_start|>assistant\n" when add_generation_prompt.
// Contents are copied as they are: text in them that looks like a special token will encode as one
// with encode(..., allow_special = true); encode_chatml below does not have that problem.
// Throws wm::Error naming the message index when a role is not one of the four above.
std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt);

// The ids of the same text, with <|im_start|> / <|im_end|> as their special tokens and every role
// and content encoded as plain text (allow_special = false), so that text in a message that looks
// like a special token stays text. For messages free of special-token text this equals
// tokenizer.encode(render_chatml(messages, add_generation_prompt)). Throws wm::Error when a role
// is invalid or the tokenizer lacks <|im_start|> or <|im_end|> as special tokens.
std::vector<int64_t> encode_chatml(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt);

}  // namespace wm::llm
