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
  size_t max_sessions = 256;
  int64_t max_tokens_limit = 1024, default_max_tokens = 256, prefill_chunk = 512;
  size_t max_body_bytes = 1 << 20;
  int read_timeout_s = 10;
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

// Per named session, what the server has fed it: the messages, so that a client that sends the
// whole conversation each time has only its new messages prefilled, and whether the last reply
// ended on <|im_end|> (then the session holds it).
struct Conversation {
  std::vector<wm::llm::ChatMessage> messages;
  bool ended_on_im_end = false;
};

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
    so.session.prefill_chunk = o.prefill_chunk;
    so.session.memory = o.memory;
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
      {
        std::lock_guard<std::mutex> lk(mu_);
        conversations_.erase(id);
      }
      res.set_content(json{{"id", id}, {"object", "session"}, {"deleted", true}}.dump(), "application/json");
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

  // The tokens a chat request feeds: for a session, only the messages it has not seen (a client
  // may send the whole conversation or only the new turn), closing the previous reply first.
  std::vector<int64_t> chat_prompt(const std::string& sid, const std::vector<wm::llm::ChatMessage>& msgs,
                                   std::vector<wm::llm::ChatMessage>* fed) {
    if (!im_end_) throw BadField("messages", "the model's tokenizer has no <|im_end|>: no chat template");
    std::vector<wm::llm::ChatMessage> fresh = msgs;
    bool continued = false, ended_on_im_end = false;
    if (!sid.empty() && engine_.has_session(sid)) {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = conversations_.find(sid);
      if (it != conversations_.end()) {
        continued = true;
        ended_on_im_end = it->second.ended_on_im_end;
        const auto& seen = it->second.messages;
        bool prefix = msgs.size() > seen.size();
        for (size_t i = 0; prefix && i < seen.size(); ++i)
          prefix = msgs[i].role == seen[i].role && msgs[i].content == seen[i].content;
        if (prefix) fresh.assign(msgs.begin() + static_cast<std::ptrdiff_t>(seen.size()), msgs.end());
      }
    }
    *fed = fresh;
    std::vector<int64_t> ids = wm::llm::encode_chatml(tok_, fresh, true);
    if (continued) {
      const std::vector<int64_t> join = tok_.encode(ended_on_im_end ? "\n" : "<|im_end|>\n", true);
      ids.insert(ids.begin(), join.begin(), join.end());
    }
    return ids;
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    json body;
    try {
      body = json::parse(req.body);
    } catch (const std::exception& e) {
      return fail(res, 400, std::string("the body is not valid JSON: ") + e.what());
    }
    if (!body.is_object()) return fail(res, 400, "the body must be a JSON object");
    std::string sid;
    std::vector<int64_t> prompt;
    std::vector<wm::llm::ChatMessage> fed;
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
        prompt = chat_prompt(sid, messages_of(body), &fed);
      } else {
        if (!body.contains("prompt") || !body["prompt"].is_string())
          throw BadField("prompt", "'prompt' must be a string");
        prompt = tok_.encode(body["prompt"].get<std::string>(), false, true);
        if (prompt.empty()) throw BadField("prompt", "'prompt' is empty");
      }
      const int64_t reach = engine_.session_position(sid) + static_cast<int64_t>(prompt.size()) + gen.max_new_tokens;
      if (reach > max_positions_)
        throw BadField(chat ? "messages" : "prompt",
                       wm::str_cat("the context would reach ", reach, " tokens (the session's, the prompt's ",
                                   prompt.size(), " and max_tokens ", gen.max_new_tokens, "), beyond the model's ",
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
    sr.prompt = prompt;
    sr.gen = gen;
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
    auto remember = [this, sid, fed](const wm::llm::Generation& g) {
      if (sid.empty()) return;
      std::lock_guard<std::mutex> lk(mu_);
      Conversation& c = conversations_[sid];
      c.messages.insert(c.messages.end(), fed.begin(), fed.end());
      c.messages.push_back({"assistant", g.text});
      c.ended_on_im_end = im_end_ && !g.tokens.empty() && g.tokens.back() == *im_end_;
    };
    auto usage = [](const wm::llm::Generation& g) {
      return json{{"prompt_tokens", g.stats.prompt_tokens},
                  {"completion_tokens", g.stats.new_tokens},
                  {"total_tokens", g.stats.prompt_tokens + g.stats.new_tokens}};
    };
    if (!stream) {
      wm::llm::ServeResult r = fut->get();
      if (!r.error.empty()) return fail(res, 400, r.error);
      if (chat) remember(r.generation);
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
    auto chunk = [=](const json& choice) {
      json c = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", name_}, {"choices", {choice}}};
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
            if (chat) remember(r.generation);
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
        [st](bool) { st->gone = true; });
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
    gauge("wm_serve_sessions", "Named sessions held.", static_cast<double>(engine_.sessions()));
    gauge("wm_serve_kv_bytes", "K/V bytes in the held sessions' windows (host or device memory).",
          static_cast<double>(engine_.kv_bytes()));
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
  std::mutex mu_;
  std::map<std::string, Conversation> conversations_;
};

httplib::Server* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}

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
  app.add_option("--max-sessions", o.max_sessions, "named sessions kept (least recently used leave beyond)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--policy", o.memory.policy, "every session's memory policy (token-wise: " +
                                                  std::string("full, recency, streaming_llm, h2o, snapkv, ...)"))
      ->capture_default_str()
      ->check(CLI::IsMember(wm::llm::text_policy_names()));
  app.add_option("--kv-budget", o.memory.budget, "the policy's KV budget in tokens per layer (not for full)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
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
  CLI::App app{"wm_serve: an OpenAI-compatible server (chat and text completions, streamed or whole) with sessions "
               "that keep their KV between requests and continuous batching"};
  add_options(app, o);
  app.footer("Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics, "
             "DELETE /v1/sessions/ID. A request names its session with the X-Session-Id header (or \"session_id\").");
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.memory.policy != "full" && o.memory.budget <= 0)
      throw wm::Error("--policy " + o.memory.policy + " needs --kv-budget TOKENS");
    o.memory.validate();
    const int nt = wm::init_threads(o.threads);
    const at::Device dev = wm::parse_device(o.device);
    const at::ScalarType dt = wm::parse_compute_dtype(o.dtype);
    wm::llm::LlmModel model = wm::llm::load_llm(o.model_dir, dev, dt);
    wm::llm::Tokenizer tok = wm::llm::Tokenizer::load(o.model_dir + "/tokenizer.json");
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
    g_server = &svr;
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    std::signal(SIGPIPE, SIG_IGN);
    std::printf("wm_serve: %s on %s, %d threads, %d parallel, policy %s; listening on http://%s:%d\n",
                o.model_dir.c_str(), wm::describe_device(dev).c_str(), nt, o.parallel, o.memory.policy.c_str(),
                o.host.c_str(), port);
    std::fflush(stdout);
    svr.listen_after_bind();
    std::fprintf(stderr, "wm_serve: stopping: finishing the requests under way\n");
    server.engine().drain();
    g_server = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_serve: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
  return 0;
}
