#pragma once
// Chat formats. ChatTemplate renders a model's own chat template (the Jinja source a GGUF file
// keeps under tokenizer.chat_template, a Hugging Face folder in tokenizer_config.json or
// chat_template.jinja) as transformers' apply_chat_template does, byte for byte, through the
// Jinja interpreter of llmkv/jinja.h; a few templates are built in by name.
// render_chatml / encode_chatml below are the fixed ChatML of Qwen2:
//   <|im_start|>{role}\n{content}<|im_end|>\n
// and a prompt that asks for the assistant's turn ends with <|im_start|>assistant\n.
#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace wm::llm {

class Tokenizer;

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" or "tool"
  std::string content;  // any text
};

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  // Parses source once. bos_token / eos_token are the model's texts of those tokens, which the
  // template sees as bos_token and eos_token; an empty one stays undefined, as transformers leaves
  // a token the model lacks. name() is the built-in name whose source this is (a trailing
  // newline aside), else "custom". Throws wm::Error "chat template NAME:line:column: what" on a
  // syntax error or a construct the interpreter refuses (llmkv/jinja.h lists them).
  static ChatTemplate from_source(std::string source, std::string bos_token, std::string eos_token);

  // A built-in template with its family's tokens: "chatml" (the text of render_chatml),
  // "smollm2" (SmolLM2-Instruct), "qwen2" (Qwen2-Instruct), "qwen2.5" (Qwen2.5-Instruct, with
  // tools), "llama3" (Llama-3-Instruct), "llama3.1" (Llama-3.1-Instruct, with tools).
  // Throws wm::Error listing the names for any other name.
  static ChatTemplate named(const std::string& name);
  static std::vector<std::string> builtin_names();

  // A Hugging Face model folder's template: chat_template.jinja when present, else
  // tokenizer_config.json's chat_template (a string, or a list of named templates, of which
  // "default" is taken), with its bos_token / eos_token (strings or {"content": ...}). Throws
  // wm::Error naming the file when there is none or it is malformed.
  static ChatTemplate from_hf_folder(const std::string& folder);

  // The prompt text of these messages (each {role, content}); add_generation_prompt asks the
  // template for the assistant turn's opening. Throws wm::Error (with line and column) when the
  // template fails, e.g. calls raise_exception on a role it does not accept.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  // The same for richer chats: messages as JSON objects (role; content a string or any JSON;
  // tool_calls, tool_call_id, reasoning_content, ...), tools (null, or an array of JSON schemas),
  // and more variables (date_string, tools_in_user_message, builtin_tools, enable_thinking, ...).
  // As apply_chat_template does, a message's keys whose value is null are dropped first. Objects
  // keep their key order (tojson prints them in it), hence ordered_json.
  std::string render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                          const nlohmann::ordered_json& tools = nullptr,
                          const nlohmann::ordered_json& variables = nlohmann::ordered_json::object()) const;

  // A copy whose strftime_now() formats this time (local) instead of the clock's.
  ChatTemplate with_time(std::time_t now) const;

  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  std::string name_, source_, bos_, eos_;
  std::shared_ptr<const jinja::Template> template_;
  std::optional<std::time_t> now_;
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

// The ids of `messages` rendered by `tmpl`, with what the template writes encoded with its special
// tokens and every message's content encoded as plain text (allow_special = false), so that text
// in a message that looks like a special token stays text. Each content is rendered as a marker
// first and the text split there: a template that alters or drops a content (a filter on it, say)
// is an error naming it, never a silent mismatch. For contents free of special-token text this
// equals tokenizer.encode(tmpl.render(messages, add_generation_prompt)) wherever the template's
// text and the contents meet at a special token (ChatML, Llama 3). Throws wm::Error as render does.
std::vector<int64_t> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                                 const std::vector<ChatMessage>& messages, bool add_generation_prompt);

// For a template that writes ChatML turns: the system message it puts before a conversation that
// has none (SmolLM2's "You are a helpful AI assistant named SmolLM, ..."), "" when it puts none.
// nullopt when the template does not write ChatML turns (Llama 3's, say).
std::optional<std::string> chatml_default_system(const ChatTemplate& tmpl);

// What `tmpl` writes around the content of a user message that is the whole conversation, with
// the generation prompt: {before, after}, before holding any default system turn and the user
// turn's opening, after the user turn's end and the assistant turn's opening (SmolLM2's: before
// "<|im_start|>system\n...<|im_end|>\n<|im_start|>user\n", after
// "<|im_end|>\n<|im_start|>assistant\n"). Throws wm::Error when the template does not write the
// content once as it is.
std::pair<std::string, std::string> user_message_frame(const ChatTemplate& tmpl);

}  // namespace wm::llm
