// wm_serve_load: a bounded load test of a running wm_serve over HTTP. C clients each send R
// streamed text completions, greedy, each a recall prompt of its own ("rode 42 / sora 17 /
// Recall: / rode", numbers drawn per request, so that answers differ from request to request): some continue the client's own session, some are one-shot,
// and every D-th request is dropped by its client mid-stream. Then every answered request is run
// again alone, in order (a session's on a fresh session that replays the client's earlier
// turns), and its text compared: a response that differs is "mixed up". Prints answered,
// refused (429), dropped, lost (no answer, no refusal), mixed up, TTFT and per-token latency
// percentiles (a request's time from its first to its last token over its tokens after the
// first) and the aggregate tokens/s; --json writes them.
//
// Crash safety: with --record FILE every client logs, as it goes (a line each, flushed), what
// it sends in its session and what it was answered, and stops at its first request that got no
// answer (the server gone). After the server was killed and started again on its state folder,
// --verify FILE checks each session against the log: one whose last request was answered must
// be found with that answer, and continuing it must give what a fresh session replaying its
// turns gives; one with a request in flight may be found before or after it.
#include <CLI/CLI.hpp>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "tools/cli/error_text.h"
#include "tools/cli/output_file.h"

// Each program's code is in a namespace of its own: wm_tools, the one binary of the programs,
// compiles several of them in one unit (tools/README.md, "Building").
namespace wm_tool_serve_load {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string host = "127.0.0.1", model = "tiny-llm", api_key, json_out, record, verify;
  int port = 8080, clients = 16, requests = 25, drop_every = 5, max_tokens = 8;
  double session_share = 0.5;
  uint64_t seed = 1;
};

struct Outcome {
  int client = 0, index = 0;
  std::string session;  // empty: one-shot
  std::string message;
  std::vector<std::pair<std::string, std::string>> history;  // the session's earlier turns (for the replay)
  bool dropped = false, answered = false, refused = false;
  std::string text;
  int tokens = 0;
  double ttft_s = 0, total_s = 0;
  double per_token_s = 0;  // (end - first token) / (tokens - 1)
};

std::string body_of(const Options& o, const std::string& prompt) {
  return json{{"model", o.model}, {"prompt", prompt}, {"max_tokens", o.max_tokens}, {"stream", true}}.dump();
}

// Sends one streamed request; fills text, tokens (from usage), timings. drop: leave after the
// first piece.
void send(const Options& o, const std::string& session, const std::string& body, bool drop, Outcome& out) {
  httplib::Client c(o.host, o.port);
  c.set_read_timeout(300, 0);
  httplib::Headers h;
  if (!session.empty()) h.emplace("X-Session-Id", session);
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = h;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  std::string buf;
  const auto t0 = Clock::now();
  auto last = t0;
  bool first = true;
  req.response_handler = [&](const httplib::Response& r) {
    if (r.status == 429) out.refused = true;
    return r.status == 200;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t at;
    while ((at = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, at);
      buf.erase(0, at + 2);
      if (ev.rfind("data: ", 0) != 0 || ev == "data: [DONE]") continue;
      const json j = json::parse(ev.substr(6), nullptr, false);
      if (j.is_discarded() || !j.contains("choices")) continue;
      const json& d = j["choices"][0];
      if (d.contains("text") && !d["text"].get<std::string>().empty()) {
        const auto now = Clock::now();
        if (first) out.ttft_s = std::chrono::duration<double>(now - t0).count(), first = false;
        last = now;
        out.text += d["text"].get<std::string>();
        if (drop) return false;
      }
      if (j.contains("usage")) {
        out.tokens = j["usage"]["completion_tokens"].get<int>();
        out.answered = true;
      }
    }
    return true;
  };
  c.send(req);
  out.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (out.tokens > 1) out.per_token_s = (std::chrono::duration<double>(last - t0).count() - out.ttft_s) / (out.tokens - 1);
}

// The --record log: JSON lines, each flushed as written (the log outlives a killed server).
class Record {
 public:
  explicit Record(const std::string& path) {
    if (path.empty()) return;
    f_ = std::fopen(path.c_str(), "w");
    if (!f_) throw wm::Error("cannot write the record " + path);
  }
  ~Record() {
    if (f_) std::fclose(f_);
  }
  bool on() const { return f_ != nullptr; }
  void add(const json& j) {
    if (!f_) return;
    const std::string line = j.dump() + "\n";
    std::lock_guard<std::mutex> lk(mu_);
    std::fwrite(line.data(), 1, line.size(), f_);
    std::fflush(f_);
  }

 private:
  std::FILE* f_ = nullptr;
  std::mutex mu_;
};

httplib::Headers auth(const Options& o) {
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  return h;
}

// `message` on session `fresh` (empty: one-shot) after replaying `history`'s messages on it;
// the session ended after.
Outcome replayed(const Options& o, const std::string& fresh,
                 const std::vector<std::pair<std::string, std::string>>& history, const std::string& message) {
  for (const auto& [msg, reply] : history) {
    Outcome r;
    send(o, fresh, body_of(o, msg), false, r);
  }
  Outcome out;
  send(o, fresh, body_of(o, message), false, out);
  if (!fresh.empty()) {
    httplib::Client c(o.host, o.port);
    c.Delete("/v1/sessions/" + fresh, auth(o));
  }
  return out;
}

// --verify: each recorded session against what the restarted server holds. Returns the exit
// status (0: nothing wrong).
int verify(const Options& o) {
  struct Seen {
    std::vector<std::pair<std::string, std::string>> history;  // answered turns since (re)made
    int64_t turns = 0, pending = 0;
    std::string last = "none";
  };
  std::map<std::string, Seen> sessions;
  {
    std::ifstream in(o.verify);
    if (!in) throw wm::Error("cannot read the record " + o.verify);
    std::string line;
    while (std::getline(in, line)) {
      const json j = json::parse(line, nullptr, false);
      if (j.is_discarded()) throw wm::Error("the record " + o.verify + " has a malformed line: " + line);
      Seen& s = sessions[j.at("s").get<std::string>()];
      const std::string ev = j.at("ev");
      s.last = ev;
      if (ev == "send") s.pending = j.at("turn");
      if (ev == "answer") s.history.push_back({j.at("msg"), j.at("reply")}), s.turns = j.at("turn");
      if (ev == "deleted") s.history.clear(), s.turns = 0;
    }
  }
  int answered = 0, found = 0, continued = 0, in_flight = 0, in_flight_ok = 0, unsure = 0, wrong = 0;
  httplib::Client c(o.host, o.port);
  c.set_read_timeout(300, 0);
  auto get = [&](const std::string& id) -> std::optional<json> {
    auto r = c.Get("/v1/sessions/" + id, auth(o));
    if (!r) throw wm::Error("the server does not answer");
    if (r->status == 404) return std::nullopt;
    if (r->status != 200) throw wm::Error(wm::str_cat("GET /v1/sessions/", id, ": ", r->status, " ", r->body));
    return json::parse(r->body);
  };
  auto complain = [&](const std::string& id, const std::string& what) {
    ++wrong;
    if (wrong <= 5) std::fprintf(stderr, "wm_serve_load: session %s: %s\n", id.c_str(), what.c_str());
  };
  for (const auto& [id, s] : sessions) {
    const std::optional<json> got = get(id);
    const int64_t turns = got ? (*got)["turns"].get<int64_t>() : 0;
    const std::string reply = got && got->contains("last_reply") ? (*got)["last_reply"].get<std::string>() : "";
    if (s.last == "answer") {
      ++answered;
      if (!got || turns != s.turns || reply != s.history.back().second) {
        complain(id, wm::str_cat("its last answer (turn ", s.turns, ", '", s.history.back().second, "') is not what the server holds (",
                                 got ? wm::str_cat("turn ", turns, ", '", reply, "'") : std::string("no session"), ")"));
        continue;
      }
      ++found;
      // Its K/V: one more turn equals the same turn after a fresh session's replay of the history.
      const std::string probe = "rode 77\nsora 31\nRecall:\nsora";
      Outcome a;
      send(o, id, body_of(o, probe), false, a);
      const Outcome b = replayed(o, "verify-" + id, s.history, probe);
      if (a.answered && b.answered && a.text == b.text)
        ++continued;
      else
        complain(id, wm::str_cat("continued it answers '", a.text, "', a replay of its turns '", b.text, "'"));
    } else if (s.last == "send") {
      // In flight when the server went: found after that request (answered, not heard) or before it.
      ++in_flight;
      const bool after = got && turns == s.pending;
      const bool before = s.pending - 1 == 0 ? !got || turns == 0
                                             : got && turns == s.pending - 1 && !s.history.empty() &&
                                                   reply == s.history.back().second;
      if (after || before)
        ++in_flight_ok;
      else
        complain(id, wm::str_cat("a request in flight (turn ", s.pending, "), and the server holds ",
                                 got ? wm::str_cat("turn ", turns) : std::string("no session")));
    } else if (s.last == "deleted") {
      if (got) complain(id, "deleted, and the server still holds it");
    } else {
      ++unsure;  // a drop or a delete in flight: either state is right
    }
  }
  std::printf("%zu recorded sessions: %d with their last request answered: %d found with that answer, %d of them "
              "continuing as a replay of their turns does; %d with a request in flight: %d found before or after "
              "it; %d left unchecked (a drop or delete in flight); wrong %d\n",
              sessions.size(), answered, found, continued, in_flight, in_flight_ok, unsure, wrong);
  if (!o.json_out.empty()) {
    wm::cli::OutputFile f(o.json_out);
    f.stream() << json{{"sessions", sessions.size()}, {"answered_last", answered}, {"found", found},
                       {"continued", continued},        {"in_flight", in_flight},   {"in_flight_ok", in_flight_ok},
                       {"unchecked", unsure},           {"wrong", wrong}}
                      .dump(2)
               << "\n";
    f.commit();
  }
  return wrong == 0 ? 0 : 3;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::min<double>(v.size() - 1, std::floor(p * (v.size() - 1) + 0.5)))];
}

void add_options(CLI::App& app, Options& o) {
  app.add_option("--host", o.host, "wm_serve's address")->capture_default_str();
  app.add_option("--port", o.port, "wm_serve's port")->required()->check(CLI::Range(1, 65535));
  app.add_option("--model", o.model, "the model name wm_serve serves")->capture_default_str();
  app.add_option("--api-key", o.api_key, "wm_serve's --api-key, if it has one");
  app.add_option("--clients", o.clients, "concurrent clients")->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--requests", o.requests, "requests per client")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--drop-every", o.drop_every, "every N-th request of a client is dropped mid-stream (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app.add_option("--session-share", o.session_share, "share of requests that continue the client's session")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--max-tokens", o.max_tokens, "max_tokens of each request")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--seed", o.seed, "which requests are session ones and their texts")->capture_default_str();
  app.add_option("--json", o.json_out, "also write the figures as JSON to this file");
  app.add_option("--record", o.record,
                 "log each session request and its answer to this file as it goes (JSON lines); a client stops at "
                 "its first request with no answer (for a crash test)");
  app.add_option("--verify", o.verify,
                 "instead of a load: check the sessions a --record log names against the server (restarted on its "
                 "state folder)")
      ->check(CLI::ExistingFile);
}

// Client ci's o.requests requests, in order, into `mine`; `run` names this load's sessions and
// `done` counts the requests of all clients (progress every 50). With a record, the client stops
// at its first request the server did not answer (the server gone).
void run_client(const Options& o, int ci, const std::string& run, Record& record, std::vector<Outcome>& mine,
                std::atomic<int>& done) {
  const std::string session = "load-" + run + "-" + std::to_string(ci);
  std::vector<std::pair<std::string, std::string>> history;  // the session's turns so far
  int64_t turns = 0;  // requests that ended in the session (answered or dropped)
  uint64_t x = o.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(ci + 1) * 0xBF58476D1CE4E5B9ull;
  for (int i = 0; i < o.requests; ++i) {
    x ^= x >> 31, x *= 0x94D049BB133111EBull, x ^= x >> 29;
    Outcome out;
    out.client = ci, out.index = i;
    const bool in_session = static_cast<double>(x % 1000) / 1000.0 < o.session_share;
    out.dropped = o.drop_every > 0 && (i + 1) % o.drop_every == 0;
    const uint64_t a = 10 + (x >> 20) % 90, b = 10 + (x >> 30) % 90;
    out.message = wm::str_cat("rode ", a, "\nsora ", b, "\nRecall:\n", (x >> 40) % 2 ? "rode" : "sora");
    if (in_session) {
      out.session = session;
      out.history = history;
      record.add({{"s", session}, {"ev", "send"}, {"turn", turns + 1}, {"msg", out.message}});
    }
    // A session request sends only its new turn: the server holds the rest.
    send(o, out.session, body_of(o, out.message), out.dropped, out);
    const bool lost = !out.answered && !out.refused && !out.dropped;
    if (in_session && !out.refused && !lost) ++turns;
    if (in_session && out.answered) {
      history.push_back({out.message, out.text});
      record.add({{"s", session}, {"ev", "answer"}, {"turn", turns}, {"msg", out.message}, {"reply", out.text}});
    }
    // A dropped reply leaves the session with part of a reply the client never saw: the
    // client starts its session afresh after it.
    if (in_session && (out.dropped || !out.answered) && !(lost && record.on())) {
      record.add({{"s", session}, {"ev", out.dropped ? "drop" : "delete"}});
      httplib::Client c(o.host, o.port);
      auto d = c.Delete("/v1/sessions/" + session, auth(o));
      history.clear();
      turns = 0;
      if (d && (d->status == 200 || d->status == 404)) {
        record.add({{"s", session}, {"ev", "deleted"}});
      } else if (record.on()) {
        mine.push_back(std::move(out));
        break;  // the server is gone with the delete in flight
      }
    }
    mine.push_back(std::move(out));
    if (lost && record.on()) break;  // the server is gone
    const int d = ++done;
    if (d % 50 == 0) std::fprintf(stderr, "wm_serve_load: %d/%d requests\n", d, o.clients * o.requests);
  }
}

// The outcomes counted, with the answered requests' latencies, and how many answered requests
// gave another text alone.
struct Tally {
  int answered = 0, refused = 0, dropped = 0, lost = 0, mixed = 0, tokens = 0;
  std::vector<double> ttft, gaps;
};

// Counts the outcomes; with `replay`, runs each answered request again, alone (a session one on
// a fresh session that replays its client's earlier turns first) and compares its text.
Tally tally(const Options& o, const std::vector<std::vector<Outcome>>& per, const std::string& run, bool replay) {
  Tally t;
  for (const auto& v : per)
    for (const auto& out : v) {
      if (out.dropped) {
        ++t.dropped;
        continue;
      }
      if (out.refused) {
        ++t.refused;
        continue;
      }
      if (!out.answered) {
        ++t.lost;
        continue;
      }
      ++t.answered;
      t.tokens += out.tokens;
      t.ttft.push_back(out.ttft_s);
      if (out.tokens > 1) t.gaps.push_back(out.per_token_s);
      if (!replay) continue;
      const std::string fresh = out.session.empty() ? "" : wm::str_cat("replay-", run, "-", out.client, "-", out.index);
      const Outcome alone = replayed(o, fresh, out.history, out.message);
      if (alone.text != out.text) {
        ++t.mixed;
        if (t.mixed <= 3)
          std::fprintf(stderr, "wm_serve_load: client %d request %d differs alone: '%s' against '%s'\n", out.client,
                       out.index, alone.text.c_str(), out.text.c_str());
      }
    }
  return t;
}

// Prints the figures of a load that took `wall` seconds.
void print_figures(const Options& o, const Tally& t, double wall) {
  const int total = o.clients * o.requests;
  std::printf("%d clients x %d requests (streamed completions, greedy, max_tokens %d; %.0f%% continuing a session; every %d-th "
              "dropped mid-stream) in %.1f s\n",
              o.clients, o.requests, o.max_tokens, 100 * o.session_share, o.drop_every, wall);
  std::printf("answered %d, refused (429) %d, dropped by the client %d, lost %d, mixed up %d (of %d)\n", t.answered,
              t.refused, t.dropped, t.lost, t.mixed, total);
  std::printf("TTFT p50 %.1f ms, p99 %.1f ms; per token p50 %.1f ms, p99 %.1f ms; %d tokens, %.1f tokens/s in all\n",
              1e3 * percentile(t.ttft, 0.5), 1e3 * percentile(t.ttft, 0.99), 1e3 * percentile(t.gaps, 0.5),
              1e3 * percentile(t.gaps, 0.99), t.tokens, t.tokens / wall);
}

json figures_json(const Options& o, const Tally& t, double wall) {
  return json{{"clients", o.clients},
              {"requests_per_client", o.requests},
              {"max_tokens", o.max_tokens},
              {"answered", t.answered},
              {"refused", t.refused},
              {"dropped", t.dropped},
              {"lost", t.lost},
              {"mixed_up", t.mixed},
              {"wall_s", wall},
              {"ttft_p50_s", percentile(t.ttft, 0.5)},
              {"ttft_p99_s", percentile(t.ttft, 0.99)},
              {"token_p50_s", percentile(t.gaps, 0.5)},
              {"token_p99_s", percentile(t.gaps, 0.99)},
              {"tokens", t.tokens},
              {"tokens_per_s", t.tokens / wall}};
}

// The load test: the clients at once, then the replay. Returns the exit status (0: nothing lost
// or mixed up).
int load(const Options& o) {
  Record record(o.record);
  std::unique_ptr<wm::cli::OutputFile> json_file;
  if (!o.json_out.empty()) json_file = std::make_unique<wm::cli::OutputFile>(o.json_out);
  {
    httplib::Client c(o.host, o.port);
    auto h = c.Get("/health");
    if (!h || h->status != 200) throw wm::Error(wm::str_cat("no wm_serve answers at ", o.host, ":", o.port, "/health"));
  }
  const std::string run = std::to_string(static_cast<long long>(std::time(nullptr)));
  std::vector<std::vector<Outcome>> per(o.clients);
  std::atomic<int> done{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int ci = 0; ci < o.clients; ++ci)
    ts.emplace_back([&, ci] { run_client(o, ci, run, record, per[ci], done); });
  for (auto& t : ts) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  // Recording a crash test: once the server is gone there is nothing to replay against.
  bool gone = false;
  for (auto& v : per)
    for (auto& out : v) gone = gone || (!out.dropped && !out.refused && !out.answered);
  const bool replay = !(gone && record.on());
  if (!replay) std::fprintf(stderr, "wm_serve_load: the server went away: no replay\n");
  const Tally t = tally(o, per, run, replay);
  print_figures(o, t, wall);
  if (json_file) {
    json_file->stream() << figures_json(o, t, wall).dump(2) << "\n";
    json_file->commit();
  }
  return t.lost == 0 && t.mixed == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"wm_serve_load: a bounded load test of a running wm_serve: concurrent streamed completions, sessions "
               "and one-shot, some dropped mid-stream; then each answered request again alone, compared"};
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    return o.verify.empty() ? load(o) : verify(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wm_serve_load: error: %s\n", wm::cli::error_text(e).c_str());
    return 1;
  }
}

}  // namespace wm_tool_serve_load
