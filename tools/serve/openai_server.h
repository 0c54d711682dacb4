#pragma once
// wm_serve's routes over the serving engine (llmkv/serve_engine.h): OpenAI's chat and text
// completions (streamed or whole), /v1/models, /health, /metrics, and the sessions' GET and
// DELETE. Requests are parsed by tools/serve/openai_api.h and carried by the hardened HTTP
// server of tools/serve/http_server.h; nothing a request holds escapes a handler as an exception.
//
// Sessions: a request names one with the X-Session-Id header (or "session_id"). With API keys,
// each key's sessions are its own: the engine holds them under the key's tag, so a client never
// reads, continues or deletes a session of another key, whatever name it guesses.
//
// Documented response extensions: "session_id" (the session answered), "session_saved": false and
// the header X-Session-Saved: false when the session's state could not be written to the state
// folder (it lives on in memory while the limits allow, and is lost beyond them or at a restart),
// the header Idempotency-Replayed: true when an Idempotency-Key repeated the session's last
// request and its answer came back without running again, and each logprobs entry's and
// alternative's token "id" (as llama.cpp's server gives it).
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "llmkv/serve_engine.h"
#include "tools/serve/http_server.h"
#include "tools/serve/openai_api.h"

namespace wm::serve {

struct ServerOptions {
  std::string model_name;          // the name clients ask for
  std::vector<int64_t> stop_tokens;  // beside the model's EOS: generation_config.json's end tokens
  std::string default_system;        // put before a new chat that has no system message (the model's template's)
  RequestLimits limits;
  std::vector<std::string> api_keys;  // empty: no key needed
};

class OpenAIServer {
 public:
  // Starts the engine (its thread, and with a state folder its writer). Throws wm::Error on bad
  // options and what ServeEngine's constructor throws (a state folder in use, ...).
  OpenAIServer(ServerOptions o, llm::LlmModel model, llm::Tokenizer tok, at::Device dev, at::ScalarType dt,
               llm::ServeOptions engine_options);
  // Registers the routes, the key check and the error bodies on svr.
  void routes(HttpServer& svr);
  llm::ServeEngine& engine() { return engine_; }
  const std::string& name() const { return o_.model_name; }
  // Requests whose response is still being written (a stream until its last chunk).
  int64_t in_flight() const { return in_flight_; }
  std::string metrics(const HttpServer* http) const;

 private:
  // The engine's name of a client's session: its id under the tag of the request's key.
  std::string scoped(const httplib::Request& req, const std::string& id) const;
  std::vector<llm::ServeBlock> chat_blocks(const std::string& sid, const std::vector<llm::ChatMessage>& msgs,
                                           std::vector<llm::ChatMessage>* fed, std::vector<int64_t>* tail);
  // A request parsed and encoded for the engine.
  struct Prepared {
    bool chat = false, stream = false, include_usage = true, logprobs = false;
    std::string client_sid;    // the session id as the client named it
    llm::ServeRequest request;  // its session scoped to the key
  };
  // What every chunk or answer of one response repeats.
  struct Reply {
    bool chat;
    std::string id;
    int64_t created;
    std::string model, client_sid;
    bool logprobs = false;  // the request asked for them
    nlohmann::json chunk(const nlohmann::json& choice) const;       // a streamed chunk
    // A streamed choice carrying text and its tokens' logprobs (null when not asked for).
    nlohmann::json text_choice(const std::string& text, const nlohmann::json& logprobs) const;
  };
  struct Stream;
  // The engine's log-probabilities with the tokens' bytes. Never throws on ids (a token the
  // tokenizer lacks has no bytes).
  std::vector<LogprobToken> logprob_tokens(const std::vector<llm::TokenLogprob>& lps) const;
  // A choice's "logprobs" for these tokens (chat or the text completions' older form; the
  // latter's text_offset continues from *offset).
  nlohmann::json logprobs_json(bool chat, const std::vector<llm::TokenLogprob>& lps, int64_t* offset) const;
  Prepared prepare(const httplib::Request& req, const std::string& body, bool chat);
  void complete(const httplib::Request& req, httplib::Response& res, const std::string& body, bool chat);
  void answer_whole(const Reply& reply, const llm::ServeResult& r, httplib::Response& res) const;
  void answer_stream(const httplib::Request& req, httplib::Response& res, const Reply& reply, bool include_usage,
                     std::shared_ptr<Stream> st, std::shared_ptr<std::future<llm::ServeResult>> fut);
  void session_get(const httplib::Request& req, httplib::Response& res);
  void session_delete(const httplib::Request& req, httplib::Response& res);

  ServerOptions o_;
  llm::Tokenizer tok_;
  std::optional<int64_t> im_end_;
  int64_t max_positions_;
  std::vector<int64_t> stop_tokens_;
  llm::ServeEngine engine_;
  int64_t created_ = 0;
  std::atomic<int64_t> in_flight_{0};
};

// Writes an OpenAI error object with the status (the HTTP server's ErrorWriter).
void write_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "",
                 const std::string& code = "");

}  // namespace wm::serve
