#pragma once
// The OpenAI wire format of wm_serve, apart from HTTP and from the model: a request body parsed
// and validated into what the engine needs (every field of the wrong type or out of range an
// ApiError naming it), the error object, server-sent-event framing, the Authorization header,
// session ids. Pure functions on strings and JSON: tests and the fuzz target call them directly.
//
// Text that reaches JSON here is dumped with invalid UTF-8 replaced by U+FFFD (json_text), so no
// byte a client or the model produces can make a response fail to serialize.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "llmkv/chat_template.h"
#include "runtime/error.h"

namespace wm::serve {

// A request the server refuses: the HTTP status, the message, the field it names (if any) and
// OpenAI's error code (if any).
struct ApiError : Error {
  int status;
  std::string param, code;
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "")
      : Error(message), status(status), param(std::move(param)), code(std::move(code)) {}
};

// The JSON text of j; strings that are not valid UTF-8 have their bad bytes replaced by U+FFFD
// (never throws on content).
std::string json_text(const nlohmann::json& j);

// OpenAI's error type for an HTTP status ("invalid_request_error", "authentication_error",
// "not_found_error", "rate_limit_error", "server_error", ...).
const char* error_type(int status);
// {"error": {"message", "type", "param", "code"}} as text; param and code null when empty.
std::string error_body(int status, const std::string& message, const std::string& param = "",
                       const std::string& code = "");

// One server-sent event carrying j: "data: <json>\n\n".
std::string sse_event(const nlohmann::json& j);
// The stream's last event.
inline const char* sse_done() { return "data: [DONE]\n\n"; }

// What the engine's stop reason is called in a response: "length" for max_tokens, "stop" for a
// stop token or string. Other reasons ("cancelled", "interrupted") have no finish_reason: the
// caller answers with an error instead.
std::optional<std::string> finish_reason(const std::string& stop_reason);

struct RequestLimits {
  int64_t max_tokens_limit = 1024;   // the largest max_tokens a request may ask
  int64_t default_max_tokens = 256;  // max_tokens of a request that gives none
  size_t max_messages = 4096;        // messages in one chat request
  size_t max_stop = 4;               // stop strings
  size_t max_stop_bytes = 256;       // bytes of one stop string
};

// A completion request as the engine needs it.
struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::vector<llm::ChatMessage> messages;  // chat: roles system (also "developer"), user, assistant, tool
  std::string prompt;                      // text completion
  int64_t max_tokens = 0;
  double temperature = 0.0, top_p = 1.0;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // non-empty strings
  bool stream = false;
  bool include_usage = true;      // stream_options.include_usage (the last chunk carries usage)
  std::string session_id;         // the body's "session_id" (validated; empty when absent)
  // Chat: "logprobs" (a boolean) and "top_logprobs" (0-20, only with logprobs true). Text
  // completions: "logprobs" is OpenAI's older integer (0-20 alternatives; null or absent: none).
  bool logprobs = false;
  int64_t top_logprobs = 0;
};

// Parses a /v1/chat/completions (chat) or /v1/completions body. Throws ApiError 400 naming the
// field: not JSON, not an object, invalid UTF-8, a field of the wrong type or out of range, an
// unknown role, a content part that is not text, n other than 1, top_logprobs without logprobs.
// "max_completion_tokens" is taken as max_tokens (both given and different: 400). Empty stop
// strings are ignored, as a string or in an array. Never throws anything else on any body.
CompletionRequest parse_completion(const std::string& body, bool chat, const RequestLimits& limits);

// The most alternatives a response's logprobs give per token ("top_logprobs", OpenAI's limit).
constexpr int64_t kMaxTopLogprobs = 20;

// A generated token as a response's logprobs show it: its id, its exact bytes (a token of a
// byte-level tokenizer may hold part of a character), its log-probability, and (for a chosen
// token) the most probable tokens at its step, most probable first.
struct LogprobToken {
  int64_t id = 0;
  std::string bytes;
  double logprob = 0.0;
  std::vector<LogprobToken> top;
};
// A token's text for JSON: its bytes as valid UTF-8, each byte sequence that is not a whole
// character (part of one: a token that ends or starts mid-character) as U+FFFD. Never throws.
std::string token_text(const std::string& bytes);
// A log-probability for JSON: in [-9999, 0] (OpenAI's floor for the improbable; NaN as -9999).
double json_logprob(double logprob);
// A chat completion's "logprobs" (whole, or one chunk's): {"content": [{"token", "logprob",
// "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]}, each entry and
// alternative also carrying its token "id" (as llama.cpp's server does). Never throws on content.
nlohmann::json chat_logprobs(const std::vector<LogprobToken>& tokens);
// A text completion's "logprobs" in OpenAI's older form: {"tokens", "token_logprobs",
// "top_logprobs": [{token: logprob, ...}, ...], "text_offset"}. text_offset counts characters
// (UTF-8 lead bytes of the tokens' bytes) from the completion's start; `*offset` is the count before
// these tokens and is advanced past them (a stream's chunks continue one another). Two
// alternatives with the same text keep the first (the more probable). Never throws on content.
nlohmann::json text_logprobs(const std::vector<LogprobToken>& tokens, int64_t* offset);

// True when id is a valid session id: 1-128 of [A-Za-z0-9_.-].
bool valid_session_id(const std::string& id);
// The request's session: the X-Session-Id header when given, else the body's. Throws ApiError 400
// when the chosen one is invalid or the two disagree.
std::string choose_session(const std::string& header, const std::string& body_id);

// The API key an Authorization header carries, if it is a bearer token: the scheme is
// case-insensitive ("Bearer", "bearer"), one or more spaces after it. nullopt otherwise.
std::optional<std::string> bearer_token(const std::string& authorization);
// The index of the key in `keys` equal to `token` (compared in constant time per key), or
// nullopt.
std::optional<size_t> match_key(const std::string& token, const std::vector<std::string>& keys);
// Keys from a file: one per line; blank lines and lines starting with '#' skipped, surrounding
// whitespace trimmed. Throws wm::Error naming the file when it cannot be read, holds no key, or
// a key has a character outside printable ASCII.
std::vector<std::string> read_key_file(const std::string& path);
// A key's tenant tag: 12 hex digits of a hash of the key. Sessions are scoped by it (a client
// sees only the sessions of its own key).
std::string key_tag(const std::string& key);

// A fresh response id: prefix, '-', then 24 random hex digits (unique across restarts).
std::string response_id(const char* prefix);

}  // namespace wm::serve
