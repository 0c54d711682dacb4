#include "tools/serve/openai_api.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>

#include "llmkv/byte_level.h"
#include "runtime/hash.h"

namespace wm::serve {

using json = nlohmann::json;

std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const char* error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 408: return "timeout_error";
    case 409: return "conflict_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string error_body(int status, const std::string& message, const std::string& param, const std::string& code) {
  json e = {{"message", message}, {"type", error_type(status)}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json_text(json{{"error", e}});
}

std::string sse_event(const json& j) { return "data: " + json_text(j) + "\n\n"; }

std::optional<std::string> finish_reason(const std::string& stop_reason) {
  if (stop_reason == "max_tokens") return std::string("length");
  if (stop_reason == "stop_token" || stop_reason == "stop_string") return std::string("stop");
  return std::nullopt;
}

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& message) { throw ApiError(400, message, field); }

template <class T>
T number(const json& body, const std::string& key, T lo, T hi, T fallback) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) bad(key, "'" + key + "' must be an integer");
    // An integer beyond int64 arrives as unsigned: out of range, not wrapped.
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad(key, str_cat("'", key, "' must be in [", lo, ", ", hi, "], got ", json_text(*it)));
  } else {
    if (!it->is_number()) bad(key, "'" + key + "' must be a number");
  }
  const T x = it->get<T>();
  if (!(x >= lo && x <= hi)) bad(key, str_cat("'", key, "' must be in [", lo, ", ", hi, "], got ", json_text(*it)));
  return x;
}

// A message's content: a string, or an array of content parts of which only text is understood.
std::string content_of(const json& m, const std::string& at) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) {
    // An assistant message may carry tool calls and no content; anything else must have some.
    if (m.value("role", "") == "assistant") return "";
    bad(at + ".content", "'" + at + ".content' is required");
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) bad(at + ".content", "'" + at + ".content' must be a string or an array of content parts");
  std::string text;
  for (size_t k = 0; k < it->size(); ++k) {
    const json& p = (*it)[k];
    const std::string pat = str_cat(at, ".content[", k, "]");
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      bad(pat, "'" + pat + "' must be a content part object with a 'type'");
    const std::string type = p["type"].get<std::string>();
    if (type != "text")
      bad(pat + ".type", "'" + pat + ".type' is '" + type + "': this model takes text parts only");
    if (!p.contains("text") || !p["text"].is_string()) bad(pat + ".text", "'" + pat + ".text' must be a string");
    if (!text.empty()) text += "\n";
    text += p["text"].get<std::string>();
  }
  return text;
}

std::vector<llm::ChatMessage> messages_of(const json& body, const RequestLimits& limits) {
  auto it = body.find("messages");
  if (it == body.end()) bad("messages", "'messages' is required");
  if (!it->is_array() || it->empty()) bad("messages", "'messages' must be a non-empty array");
  if (it->size() > limits.max_messages)
    bad("messages", str_cat("'messages' holds ", it->size(), " messages; at most ", limits.max_messages));
  std::vector<llm::ChatMessage> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string at = str_cat("messages[", i, "]");
    if (!m.is_object()) bad(at, "'" + at + "' must be an object");
    if (!m.contains("role") || !m["role"].is_string()) bad(at + ".role", "'" + at + ".role' must be a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad(at + ".role", "'" + at + ".role' must be system, developer, user, assistant or tool, got '" + role + "'");
    out.push_back({role, content_of(m, at)});
  }
  return out;
}

std::vector<std::string> stop_of(const json& body, const RequestLimits& limits) {
  std::vector<std::string> out;
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return out;
  const std::string what =
      str_cat("'stop' must be a string or an array of up to ", limits.max_stop, " strings of at most ",
              limits.max_stop_bytes, " bytes");
  auto take = [&](const json& s) {
    if (!s.is_string()) bad("stop", what);
    const std::string v = s.get<std::string>();
    if (v.size() > limits.max_stop_bytes) bad("stop", what);
    if (!v.empty()) out.push_back(v);  // an empty stop string stops nothing: ignored
  };
  if (it->is_string()) {
    take(*it);
  } else if (it->is_array() && it->size() <= limits.max_stop) {
    for (const auto& s : *it) take(s);
  } else {
    bad("stop", what);
  }
  return out;
}

// "logprobs" and "top_logprobs" into r. Chat: logprobs a boolean, top_logprobs an integer in
// [0, 20] given only with logprobs true. Text completions: logprobs OpenAI's older integer.
void logprobs_of(const json& body, bool chat, CompletionRequest& r) {
  auto lp = body.find("logprobs");
  const bool given = lp != body.end() && !lp->is_null();
  if (!chat) {
    if (given && !lp->is_number_integer())
      bad("logprobs", str_cat("'logprobs' must be an integer in [0, ", kMaxTopLogprobs, "] (alternatives per token)"));
    r.top_logprobs = number<int64_t>(body, "logprobs", 0, kMaxTopLogprobs, 0);
    r.logprobs = given;
    return;
  }
  if (given) {
    if (!lp->is_boolean()) bad("logprobs", "'logprobs' must be a boolean");
    r.logprobs = lp->get<bool>();
  }
  auto top = body.find("top_logprobs");
  if (top == body.end() || top->is_null()) return;
  r.top_logprobs = number<int64_t>(body, "top_logprobs", 0, kMaxTopLogprobs, 0);
  if (!r.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
}

}  // namespace

std::string token_text(const std::string& bytes) { return llm::utf8_valid(bytes); }

double json_logprob(double logprob) { return logprob >= -9999.0 ? std::min(logprob, 0.0) : -9999.0; }

json chat_logprobs(const std::vector<LogprobToken>& tokens) {
  auto entry = [](const LogprobToken& t) {
    json bytes = json::array();
    for (const char c : t.bytes) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
    return json{{"id", t.id}, {"token", token_text(t.bytes)}, {"logprob", json_logprob(t.logprob)}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const LogprobToken& t : tokens) {
    json e = entry(t);
    json top = json::array();
    for (const LogprobToken& a : t.top) top.push_back(entry(a));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return json{{"content", std::move(content)}};
}

json text_logprobs(const std::vector<LogprobToken>& tokens, int64_t* offset) {
  json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const LogprobToken& t : tokens) {
    out["tokens"].push_back(token_text(t.bytes));
    out["token_logprobs"].push_back(json_logprob(t.logprob));
    json top = json::object();
    for (const LogprobToken& a : t.top) {
      const std::string text = token_text(a.bytes);
      if (!top.contains(text)) top[text] = json_logprob(a.logprob);
    }
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(*offset);
    for (const char c : t.bytes) *offset += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }
  return out;
}

namespace {
// The deepest nesting of arrays and objects in JSON text (strings skipped); stops counting past
// `cap`. A request is a few levels deep; thousands are an attack on the parser's stack.
int nesting(const std::string& t, int cap) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : t) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > cap) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}
}  // namespace

CompletionRequest parse_completion(const std::string& body_text, bool chat, const RequestLimits& limits) {
  if (nesting(body_text, 64) > 64) throw ApiError(400, "the body nests arrays and objects more than 64 deep");
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::exception& e) {
    // e.what() may quote the offending bytes: json_text replaces any that are not UTF-8.
    throw ApiError(400, std::string("the body is not valid JSON (UTF-8): ") + e.what());
  }
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  try {
    if (!body.contains("model") || !body["model"].is_string()) bad("model", "'model' must be a string");
    r.model = body["model"].get<std::string>();
    if (chat) {
      r.messages = messages_of(body, limits);
    } else {
      if (!body.contains("prompt") || !body["prompt"].is_string()) bad("prompt", "'prompt' must be a string");
      r.prompt = body["prompt"].get<std::string>();
      if (r.prompt.empty()) bad("prompt", "'prompt' is empty");
    }
    const int64_t mt = number<int64_t>(body, "max_tokens", 1, limits.max_tokens_limit, 0);
    const int64_t mct = number<int64_t>(body, "max_completion_tokens", 1, limits.max_tokens_limit, 0);
    if (mt && mct && mt != mct)
      bad("max_completion_tokens", str_cat("'max_tokens' (", mt, ") and 'max_completion_tokens' (", mct,
                                           ") disagree: give one"));
    r.max_tokens = mct ? mct : mt ? mt : limits.default_max_tokens;
    r.temperature = number<double>(body, "temperature", 0.0, 2.0, 0.0);
    r.top_p = number<double>(body, "top_p", 1e-9, 1.0, 1.0);
    r.seed = static_cast<uint64_t>(number<int64_t>(body, "seed", 0, INT64_MAX, 0));
    r.stop = stop_of(body, limits);
    if (body.contains("stream") && !body["stream"].is_null()) {
      if (!body["stream"].is_boolean()) bad("stream", "'stream' must be a boolean");
      r.stream = body["stream"].get<bool>();
    }
    if (body.contains("stream_options") && !body["stream_options"].is_null()) {
      const json& so = body["stream_options"];
      if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
      if (so.contains("include_usage")) {
        if (!so["include_usage"].is_boolean())
          bad("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
        r.include_usage = so["include_usage"].get<bool>();
      }
    }
    logprobs_of(body, chat, r);
    if (body.contains("n") && !body["n"].is_null() && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1))
      bad("n", "'n' must be 1 (one choice per request)");
    if (body.contains("session_id") && !body["session_id"].is_null()) {
      if (!body["session_id"].is_string()) bad("session_id", "'session_id' must be a string");
      r.session_id = body["session_id"].get<std::string>();
      if (!valid_session_id(r.session_id))
        bad("session_id", "a session id is 1-128 letters, digits, '_', '.' or '-'");
    }
  } catch (const ApiError&) {
    throw;
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("a malformed request: ") + e.what());
  }
  return r;
}

bool valid_session_id(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (const char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) return false;
  return true;
}

std::string choose_session(const std::string& header, const std::string& body_id) {
  if (header.empty()) return body_id;
  if (!valid_session_id(header))
    throw ApiError(400, "the X-Session-Id header must be 1-128 letters, digits, '_', '.' or '-'", "session_id");
  if (!body_id.empty() && body_id != header)
    throw ApiError(400, "the X-Session-Id header and the body's 'session_id' name different sessions", "session_id");
  return header;
}

std::optional<std::string> bearer_token(const std::string& a) {
  static const char kScheme[] = "bearer";
  constexpr size_t n = sizeof kScheme - 1;
  if (a.size() <= n || !std::isblank(static_cast<unsigned char>(a[n]))) return std::nullopt;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != kScheme[i]) return std::nullopt;
  size_t i = n;
  while (i < a.size() && std::isblank(static_cast<unsigned char>(a[i]))) ++i;
  size_t j = a.size();
  while (j > i && std::isblank(static_cast<unsigned char>(a[j - 1]))) --j;
  if (i == j) return std::nullopt;
  return a.substr(i, j - i);
}

std::optional<size_t> match_key(const std::string& token, const std::vector<std::string>& keys) {
  std::optional<size_t> found;
  for (size_t k = 0; k < keys.size(); ++k) {
    const std::string& key = keys[k];
    // Every byte of the longer compared, whatever matched: the time says nothing of the key.
    unsigned char diff = token.size() == key.size() ? 0 : 1;
    const size_t n = std::max(token.size(), key.size());
    for (size_t i = 0; i < n; ++i) {
      const unsigned char a = i < token.size() ? static_cast<unsigned char>(token[i]) : 0;
      const unsigned char b = i < key.size() ? static_cast<unsigned char>(key[i]) : 0;
      diff |= static_cast<unsigned char>(a ^ b);
    }
    if (diff == 0 && !found) found = k;
  }
  return found;
}

std::vector<std::string> read_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(str_cat("cannot read the API key file '", path, "'"));
  std::vector<std::string> keys;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (keys.size() >= 100000) throw Error(str_cat("the API key file '", path, "' holds more than 100000 keys"));
    size_t i = 0, j = line.size();
    while (i < j && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    while (j > i && std::isspace(static_cast<unsigned char>(line[j - 1]))) --j;
    if (i == j || line[i] == '#') continue;
    const std::string key = line.substr(i, j - i);
    for (const char c : key)
      if (c < 0x21 || c > 0x7e)
        throw Error(str_cat("the API key file '", path, "', line ", lineno,
                            ": a key must be printable ASCII without spaces"));
    keys.push_back(key);
  }
  if (in.bad()) throw Error(str_cat("cannot read the API key file '", path, "'"));
  if (keys.empty()) throw Error(str_cat("the API key file '", path, "' holds no key"));
  return keys;
}

std::string key_tag(const std::string& key) { return hex64(xxh64(key.data(), key.size())).substr(0, 12); }

std::string response_id(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng([] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }());
  uint64_t a, b;
  {
    std::lock_guard<std::mutex> lk(mu);
    a = rng();
    b = rng();
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b & 0xffffffffULL));
  return std::string(prefix) + "-" + buf;
}

}  // namespace wm::serve
