#include "tools/serve/openai_server.h"

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <future>
#include <mutex>
#include <stdexcept>

#include "llmkv/chat_template.h"
#include "llmkv/hf_folder.h"
#include "tools/cli/error_text.h"

namespace wm::serve {

using json = nlohmann::json;

void write_error(httplib::Response& res, int status, const std::string& message, const std::string& param,
                 const std::string& code) {
  res.status = status;
  res.set_content(error_body(status, message, param, code), "application/json");
}

namespace {

// The Idempotency-Key header: printable ASCII, 1-255 bytes. Throws ApiError 400 otherwise.
std::string idempotency_key(const httplib::Request& req) {
  const std::string k = req.get_header_value("Idempotency-Key");
  if (k.empty() && !req.has_header("Idempotency-Key")) return "";
  bool ok = !k.empty() && k.size() <= 255;
  for (const char c : k) ok = ok && c >= 0x21 && c <= 0x7e;
  if (!ok) throw ApiError(400, "the Idempotency-Key header must be 1-255 printable ASCII characters", "Idempotency-Key");
  return k;
}

json usage_of(const llm::Generation& g) {
  return json{{"prompt_tokens", g.stats.prompt_tokens},
              {"completion_tokens", g.stats.new_tokens},
              {"total_tokens", g.stats.prompt_tokens + g.stats.new_tokens}};
}

// The error a result that has no finish_reason becomes (an engine failure, the drain's cut).
std::optional<ApiError> result_error(const llm::ServeResult& r) {
  if (!r.error.empty())
    return ApiError(r.stopped ? 503 : r.bad_request ? 400 : 500, cli::error_text(std::runtime_error(r.error)));
  if (r.generation.stop_reason == "interrupted")
    return ApiError(503, str_cat("the server stopped while this answer was generated (", r.generation.stats.new_tokens,
                                 " tokens; a session keeps them as its last reply): send it again to the server "
                                 "when it is back"),
                    "", "server_shutdown");
  if (!finish_reason(r.generation.stop_reason))
    return ApiError(500, "the generation ended without an answer (" + r.generation.stop_reason + ")");
  return std::nullopt;
}

}  // namespace

static_assert(kMaxTopLogprobs == llm::kMaxTopLogprobs, "the API's limit on top_logprobs is the engine's");

// What a streamed response waits on: pieces of text from the engine's thread, then the end.
struct OpenAIServer::Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<llm::TextPiece> pieces;
  std::atomic<bool> gone{false};
  int64_t text_offset = 0;  // a text completion's logprobs: characters sent so far (the HTTP thread's)
};

std::vector<LogprobToken> OpenAIServer::logprob_tokens(const std::vector<llm::TokenLogprob>& lps) const {
  auto bytes = [this](int64_t id) {
    try {
      return tok_.token_bytes(id);
    } catch (const std::exception&) {
      return std::string();
    }
  };
  std::vector<LogprobToken> out;
  out.reserve(lps.size());
  for (const llm::TokenLogprob& lp : lps) {
    LogprobToken t{lp.token, bytes(lp.token), lp.logprob, {}};
    for (const auto& [id, logprob] : lp.top) t.top.push_back({id, bytes(id), logprob, {}});
    out.push_back(std::move(t));
  }
  return out;
}

json OpenAIServer::logprobs_json(bool chat, const std::vector<llm::TokenLogprob>& lps, int64_t* offset) const {
  return chat ? chat_logprobs(logprob_tokens(lps)) : text_logprobs(logprob_tokens(lps), offset);
}

OpenAIServer::OpenAIServer(ServerOptions o, llm::LlmModel model, llm::Tokenizer tok, at::Device dev,
                           at::ScalarType dt, llm::ServeOptions engine_options)
    : o_(std::move(o)),
      tok_(tok),
      im_end_(tok.token_to_id("<|im_end|>")),
      max_positions_(model->config().max_position_embeddings),
      engine_(model, tok, dev, dt, std::move(engine_options)) {
  WM_CHECK(o_.limits.default_max_tokens <= o_.limits.max_tokens_limit, "the default max_tokens (",
           o_.limits.default_max_tokens, ") is above the limit (", o_.limits.max_tokens_limit, ")");
  if (o_.model_name.empty()) o_.model_name = "model";
  stop_tokens_ = model->config().eos_token_ids;
  stop_tokens_.insert(stop_tokens_.end(), o_.stop_tokens.begin(), o_.stop_tokens.end());
  if (im_end_) stop_tokens_.push_back(*im_end_);
  created_ = static_cast<int64_t>(std::time(nullptr));
}

std::string OpenAIServer::scoped(const httplib::Request& req, const std::string& id) const {
  if (id.empty() || o_.api_keys.empty()) return id;
  const auto token = bearer_token(req.get_header_value("Authorization"));
  const auto k = token ? match_key(*token, o_.api_keys) : std::nullopt;
  if (!k) throw ApiError(401, "a valid API key is needed (Authorization: Bearer KEY)");
  return key_tag(o_.api_keys[*k]) + "." + id;
}

void OpenAIServer::routes(HttpServer& svr) {
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (o_.api_keys.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const auto token = bearer_token(req.get_header_value("Authorization"));
    if (!token || !match_key(*token, o_.api_keys)) {
      write_error(res, 401, "a valid API key is needed (Authorization: Bearer KEY)");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json_text({{"status", "ok"},
                               {"model", o_.model_name},
                               {"active", engine_.active()},
                               {"queued", engine_.queued()},
                               {"sessions", engine_.sessions()}}),
                    "application/json");
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json_text({{"object", "list"},
                               {"data", json::array({{{"id", o_.model_name},
                                                      {"object", "model"},
                                                      {"created", created_},
                                                      {"owned_by", "worldmem"}}})}}),
                    "application/json");
  });
  svr.Get("/metrics", [this, &svr](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(&svr), "text/plain; version=0.0.4");
  });
  auto guarded = [](auto fn) {
    return [fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        write_error(res, e.status, e.what(), e.param, e.code);
      } catch (const std::exception& e) {
        write_error(res, 500, cli::error_text(e));
      }
    };
  };
  const std::string session_path = R"(/v1/sessions/([^/]{1,256}))";
  svr.Get(session_path, guarded([this](const httplib::Request& q, httplib::Response& s) { session_get(q, s); }));
  svr.Delete(session_path, guarded([this](const httplib::Request& q, httplib::Response& s) { session_delete(q, s); }));
  svr.post_body("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res, const std::string& b) {
    complete(req, res, b, true);
  });
  svr.post_body("/v1/completions", [this](const httplib::Request& req, httplib::Response& res, const std::string& b) {
    complete(req, res, b, false);
  });
}

void OpenAIServer::session_get(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  if (!valid_session_id(id)) throw ApiError(400, "a session id is 1-128 letters, digits, '_', '.' or '-'", "session_id");
  const auto info = engine_.session_info(scoped(req, id));
  if (!info) throw ApiError(404, "no session '" + id + "'", "session_id");
  json out = {{"id", id},
              {"object", "session"},
              {"turns", info->turns},
              {"position", info->position},
              {"in_memory", info->in_memory},
              {"kv_bytes", info->kv_bytes}};
  const json& n = info->note;
  if (n.is_object())
    for (const char* k : {"messages", "last_prompt", "last_reply"})
      if (n.contains(k)) out[k] = n[k];
  res.set_content(json_text(out), "application/json");
}

void OpenAIServer::session_delete(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  if (!valid_session_id(id)) throw ApiError(400, "a session id is 1-128 letters, digits, '_', '.' or '-'", "session_id");
  if (!engine_.erase_session(scoped(req, id))) throw ApiError(404, "no session '" + id + "'", "session_id");
  res.set_content(json_text({{"id", id}, {"object", "session"}, {"deleted", true}}), "application/json");
}

// What a chat request feeds, as blocks (a message each) and the tail (the assistant's header):
// for a session, only the messages it has not seen (a client may send the whole conversation or
// only the new turn), the previous reply closed first.
std::vector<llm::ServeBlock> OpenAIServer::chat_blocks(const std::string& sid, const std::vector<llm::ChatMessage>& msgs,
                                                       std::vector<llm::ChatMessage>* fed, std::vector<int64_t>* tail) {
  if (!im_end_) throw ApiError(400, "the model's tokenizer has no <|im_end|>: no chat template", "messages");
  std::vector<llm::ChatMessage> fresh = msgs;
  bool continued = false, ended_on_im_end = false;
  if (!sid.empty()) {
    const auto info = engine_.session_info(sid);
    if (info && info->note.is_object() && info->note.contains("messages") && info->note["messages"].is_array()) {
      continued = true;
      ended_on_im_end = info->note.value("ended_on_im_end", false);
      std::vector<llm::ChatMessage> seen;
      for (const auto& m : info->note["messages"])
        seen.push_back({m.value("role", std::string()), m.value("content", std::string())});
      bool prefix = msgs.size() > seen.size();
      for (size_t i = 0; prefix && i < seen.size(); ++i)
        prefix = msgs[i].role == seen[i].role && msgs[i].content == seen[i].content;
      if (prefix) fresh.assign(msgs.begin() + static_cast<std::ptrdiff_t>(seen.size()), msgs.end());
    }
  }
  *fed = fresh;
  std::vector<llm::ServeBlock> blocks;
  // A new conversation without a system message gets the one the model's template would add.
  if (!continued && !o_.default_system.empty() && (fresh.empty() || fresh.front().role != "system"))
    blocks.push_back({llm::encode_chatml(tok_, {{"system", o_.default_system}}, false), "system", false});
  for (const auto& m : fresh) blocks.push_back({llm::encode_chatml(tok_, {m}, false), m.role, m.role == "user"});
  *tail = llm::encode_chatml(tok_, {}, true);
  if (continued) {
    const std::vector<int64_t> join = tok_.encode(ended_on_im_end ? "\n" : "<|im_end|>\n", true);
    std::vector<int64_t>& first = blocks.empty() ? *tail : blocks.front().tokens;
    first.insert(first.begin(), join.begin(), join.end());
  }
  return blocks;
}

// A completion request made ready for the engine: parsed, its session resolved, its prompt
// encoded. Throws ApiError (400, 401, 404) naming what is wrong.
OpenAIServer::Prepared OpenAIServer::prepare(const httplib::Request& req, const std::string& body, bool chat) {
  Prepared p;
  p.chat = chat;
  const CompletionRequest cr = parse_completion(body, chat, o_.limits);
  if (cr.model != o_.model_name)
    throw ApiError(404, "the model '" + cr.model + "' is not served here (only '" + o_.model_name + "')", "model",
                   "model_not_found");
  p.stream = cr.stream;
  p.include_usage = cr.include_usage;
  p.logprobs = cr.logprobs;
  p.client_sid = choose_session(req.get_header_value("X-Session-Id"), cr.session_id);
  llm::ServeRequest& sr = p.request;
  sr.session = scoped(req, p.client_sid);
  if (!sr.session.empty()) sr.idempotency_key = idempotency_key(req);
  sr.gen.max_new_tokens = cr.max_tokens;
  sr.gen.sampling.temperature = cr.temperature;
  sr.gen.sampling.top_p = cr.top_p;
  sr.gen.sampling.seed = cr.seed;
  sr.gen.stop_strings = cr.stop;
  sr.gen.stop_tokens = stop_tokens_;
  sr.gen.logprobs = cr.logprobs;
  sr.gen.top_logprobs = cr.top_logprobs;
  std::vector<llm::ChatMessage> fed;
  if (chat) {
    sr.blocks = chat_blocks(sr.session, cr.messages, &fed, &sr.prompt);
  } else {
    std::vector<int64_t> ids = tok_.encode(cr.prompt, false, true);
    if (ids.empty()) throw ApiError(400, "'prompt' is empty", "prompt");
    sr.blocks.push_back({std::move(ids), "user", true});
  }
  // Refused at once when it cannot fit; the engine checks again when the session is the
  // request's alone (another request of the session may run first).
  int64_t fresh = static_cast<int64_t>(sr.prompt.size());
  for (const auto& b : sr.blocks) fresh += static_cast<int64_t>(b.tokens.size());
  const int64_t reach = engine_.session_position(sr.session) + fresh + sr.gen.max_new_tokens;
  if (reach > max_positions_)
    throw ApiError(400,
                   str_cat("the context would reach ", reach, " tokens (the session's, the prompt's ", fresh,
                           " and max_tokens ", sr.gen.max_new_tokens, "), beyond the model's ", max_positions_),
                   chat ? "messages" : "prompt");
  // What the session keeps beside its K/V: the conversation (its messages, so that a client
  // sending the whole of it has only the new ones fed), the last prompt and reply.
  const std::optional<int64_t> im_end = im_end_;
  sr.note = [chat, fed, prompt_text = cr.prompt, im_end](const llm::Generation& g, const json& before) {
    json n = before.is_object() ? before : json::object();
    if (chat) {
      json& m = n["messages"];
      if (!m.is_array()) m = json::array();
      for (const auto& f : fed) m.push_back({{"role", f.role}, {"content", f.content}});
      m.push_back({{"role", "assistant"}, {"content", g.text}});
      n["ended_on_im_end"] = im_end && !g.tokens.empty() && g.tokens.back() == *im_end;
    } else {
      n["last_prompt"] = prompt_text;
    }
    n["last_reply"] = g.text;
    return n;
  };
  return p;
}

void OpenAIServer::complete(const httplib::Request& req, httplib::Response& res, const std::string& body, bool chat) {
  // Counted until the response is whole: a stream until its provider is released.
  struct Count {
    std::atomic<int64_t>& n;
    bool handed = false;
    explicit Count(std::atomic<int64_t>& c) : n(c) { ++n; }
    ~Count() {
      if (!handed) --n;
    }
  } count(in_flight_);
  Prepared p;
  try {
    p = prepare(req, body, chat);
  } catch (const ApiError& e) {
    return write_error(res, e.status, e.what(), e.param, e.code);
  } catch (const std::exception& e) {
    return write_error(res, 400, cli::error_text(e));
  }
  auto st = std::make_shared<Stream>();
  if (p.stream)
    p.request.on_text = [st](const llm::TextPiece& t) {
      if (st->gone) return false;
      std::lock_guard<std::mutex> lk(st->mu);
      st->pieces.push_back(t);
      st->cv.notify_all();
      return true;
    };
  std::shared_ptr<std::future<llm::ServeResult>> fut;
  try {
    fut = std::make_shared<std::future<llm::ServeResult>>(engine_.submit(std::move(p.request)));
  } catch (const llm::ServeBusy& e) {
    res.set_header("Retry-After", "1");
    return write_error(res, 429, std::string("busy: ") + e.what());
  } catch (const std::exception& e) {
    return write_error(res, 503, cli::error_text(e));
  }
  const Reply reply{p.chat, response_id(chat ? "chatcmpl" : "cmpl"), static_cast<int64_t>(std::time(nullptr)),
                    o_.model_name, p.client_sid, p.logprobs};
  if (!p.stream) return answer_whole(reply, fut->get(), res);
  answer_stream(req, res, reply, p.include_usage, st, fut);
  count.handed = true;
}

json OpenAIServer::Reply::chunk(const json& choice) const {
  json c = {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", {choice}}};
  if (!client_sid.empty()) c["session_id"] = client_sid;
  return c;
}

json OpenAIServer::Reply::text_choice(const std::string& text, const json& logprobs) const {
  json choice = {{"index", 0}, {"finish_reason", nullptr}, {"logprobs", logprobs}};
  if (chat)
    choice["delta"] = {{"content", text}};
  else
    choice["text"] = text;
  return choice;
}

void OpenAIServer::answer_whole(const Reply& reply, const llm::ServeResult& r, httplib::Response& res) const {
  if (const auto err = result_error(r)) return write_error(res, err->status, err->what(), err->param, err->code);
  json choice = {{"index", 0}, {"finish_reason", *finish_reason(r.generation.stop_reason)}, {"logprobs", nullptr}};
  // A replayed answer has no logprobs: what a session keeps of its last answer is its text.
  int64_t offset = 0;
  if (reply.logprobs && !r.replayed) choice["logprobs"] = logprobs_json(reply.chat, r.generation.logprobs, &offset);
  if (reply.chat)
    choice["message"] = {{"role", "assistant"}, {"content", r.generation.text}};
  else
    choice["text"] = r.generation.text;
  json out = {{"id", reply.id},
              {"object", reply.chat ? "chat.completion" : "text_completion"},
              {"created", reply.created},
              {"model", reply.model},
              {"choices", {choice}},
              {"usage", usage_of(r.generation)}};
  if (!reply.client_sid.empty()) out["session_id"] = reply.client_sid;
  if (!r.saved) {
    out["session_saved"] = false;
    res.set_header("X-Session-Saved", "false");
  }
  if (r.replayed) res.set_header("Idempotency-Replayed", "true");
  res.set_content(json_text(out), "application/json");
}

void OpenAIServer::answer_stream(const httplib::Request& req, httplib::Response& res, const Reply& reply,
                                 bool include_usage, std::shared_ptr<Stream> st,
                                 std::shared_ptr<std::future<llm::ServeResult>> fut) {
  auto sent_role = std::make_shared<bool>(false);
  res.set_header("Cache-Control", "no-cache");
  HttpServer::stream(
      req, res, "text/event-stream",
      [=](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& line) {
          if (sink.write(line.data(), line.size())) return true;
          st->gone = true;
          return false;
        };
        if (reply.chat && !*sent_role) {
          *sent_role = true;
          if (!send(sse_event(reply.chunk({{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                           {"logprobs", nullptr}, {"finish_reason", nullptr}}))))
            return false;
        }
        std::deque<llm::TextPiece> pieces;
        bool ready = false;
        {
          std::unique_lock<std::mutex> lk(st->mu);
          st->cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return !st->pieces.empty(); });
          // Ready before the pieces are taken: every piece came before the result, so these are the last.
          ready = fut->wait_for(std::chrono::seconds(0)) == std::future_status::ready;
          pieces.swap(st->pieces);
        }
        const bool ended = ready;
        for (const auto& piece : pieces) {
          // A piece without text is sent only for the tokens it covers (the end token's logprob).
          if (piece.text.empty() && (!reply.logprobs || piece.logprobs.empty())) continue;
          const json lp = reply.logprobs ? logprobs_json(reply.chat, piece.logprobs, &st->text_offset) : json();
          if (!send(sse_event(reply.chunk(reply.text_choice(piece.text, lp))))) return false;
        }
        if (!sink.is_writable()) {
          st->gone = true;
          return false;
        }
        if (!ended) return true;
        const llm::ServeResult r = fut->get();
        if (const auto err = result_error(r)) {
          send("data: " + error_body(err->status, err->what(), err->param, err->code) + "\n\n");
        } else {
          if (r.replayed && !r.generation.text.empty() &&
              !send(sse_event(reply.chunk(reply.text_choice(r.generation.text, nullptr)))))
            return false;
          json choice = {{"index", 0},
                         {"finish_reason", *finish_reason(r.generation.stop_reason)},
                         {"logprobs", nullptr}};
          if (reply.chat)
            choice["delta"] = json::object();
          else
            choice["text"] = "";
          json last = reply.chunk(choice);
          if (include_usage) last["usage"] = usage_of(r.generation);
          if (!r.saved) last["session_saved"] = false;
          if (r.replayed) last["replayed"] = true;
          send(sse_event(last));
        }
        send(sse_done());
        sink.done();
        return true;
      },
      [st, this](bool) {
        st->gone = true;
        --in_flight_;
      });
}

std::string OpenAIServer::metrics(const HttpServer* http) const {
  const llm::ServeCounters c = engine_.counters();
  std::string m;
  auto line = [&](const std::string& s) { m += s + "\n"; };
  auto counter = [&](const char* name, const char* help, int64_t v) {
    line(str_cat("# HELP ", name, " ", help));
    line(str_cat("# TYPE ", name, " counter"));
    line(str_cat(name, " ", v));
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    line(str_cat("# HELP ", name, " ", help));
    line(str_cat("# TYPE ", name, " gauge"));
    line(str_cat(name, " ", v));
  };
  auto histogram = [&](const char* name, const char* help, const std::vector<double>& bounds,
                       const std::vector<int64_t>& b, double sum, int64_t n) {
    line(str_cat("# HELP ", name, " ", help));
    line(str_cat("# TYPE ", name, " histogram"));
    for (size_t i = 0; i < bounds.size(); ++i) line(str_cat(name, "_bucket{le=\"", bounds[i], "\"} ", b[i]));
    line(str_cat(name, "_bucket{le=\"+Inf\"} ", n));
    line(str_cat(name, "_sum ", sum));
    line(str_cat(name, "_count ", n));
  };
  counter("wm_serve_requests_total", "Requests taken into the queue.", c.requests);
  counter("wm_serve_requests_refused_total", "Requests refused with 429 (queue full).", c.refused);
  counter("wm_serve_requests_cancelled_total", "Generations ended because the client left.", c.cancelled);
  counter("wm_serve_requests_failed_total", "Requests that failed in the engine.", c.failed);
  counter("wm_serve_requests_too_long_total", "Requests refused by the engine: the context would pass the model's.",
          c.too_long);
  counter("wm_serve_requests_replayed_total", "Requests answered again from their Idempotency-Key.", c.replayed);
  counter("wm_serve_prompt_tokens_total", "Prompt tokens prefilled.", c.prompt_tokens);
  counter("wm_serve_completion_tokens_total", "Tokens generated.", c.completion_tokens);
  counter("wm_serve_batched_steps_total", "Decode steps run (each for every generation running).", c.batched_steps);
  counter("wm_serve_batched_tokens_total", "Tokens those steps decoded.", c.batched_tokens);
  gauge("wm_serve_active", "Generations decoding now.", static_cast<double>(engine_.active()));
  gauge("wm_serve_queued", "Requests waiting for a slot.", static_cast<double>(engine_.queued()));
  counter("wm_serve_session_saves_total", "Session files written to the state folder.", c.saves);
  counter("wm_serve_session_save_bytes_total", "Bytes of those files.", c.save_bytes);
  counter("wm_serve_session_save_failed_total", "Session saves that failed (the file before stays).", c.save_failed);
  counter("wm_serve_session_loads_total", "Sessions brought back from the state folder.", c.loads);
  counter("wm_serve_session_load_failed_total", "Session files found damaged (those sessions started afresh).",
          c.load_failed);
  counter("wm_serve_sessions_unloaded_total", "Idle sessions that left memory for the state folder.", c.unloaded);
  counter("wm_serve_sessions_ended_total",
          "Idle sessions ended beyond the limits (no state folder, or their last save failed).", c.ended);
  counter("wm_serve_sessions_state_evicted_total",
          "Saved sessions ended by --state-max-mib (least recently used first).", c.state_evicted);
  counter("wm_serve_evictions_total", "Blocks the sessions' memory policies moved out of their windows.", c.evictions);
  counter("wm_serve_recoveries_total", "Blocks they brought back.", c.recoveries);
  gauge("wm_serve_sessions", "Named sessions held (in memory or in the state folder).",
        static_cast<double>(engine_.sessions()));
  gauge("wm_serve_sessions_in_memory", "Named sessions in memory.", static_cast<double>(engine_.sessions_in_memory()));
  gauge("wm_serve_kv_bytes", "K/V bytes in the sessions' windows (host or device memory).",
        static_cast<double>(engine_.kv_bytes()));
  {
    const auto b = engine_.bank_bytes();
    line("# HELP wm_serve_bank_bytes Bytes of the sessions' banks (blocks their policies moved out), per tier.");
    line("# TYPE wm_serve_bank_bytes gauge");
    for (int t = 0; t < kTiers; ++t)
      line(str_cat("wm_serve_bank_bytes{tier=\"", tier_name(static_cast<Tier>(t)), "\"} ", b[t]));
  }
  histogram("wm_serve_ttft_seconds", "Time from a request's start in the engine to its first token.",
            llm::ServeEngine::ttft_bounds(), c.ttft_buckets, c.ttft_sum, c.ttft_count);
  histogram("wm_serve_token_seconds", "Time between a generation's tokens.", llm::ServeEngine::token_bounds(),
            c.token_buckets, c.token_sum, c.token_count);
  if (http != nullptr) m += http->metrics_text("wm_serve_http");
  return m;
}

}  // namespace wm::serve
