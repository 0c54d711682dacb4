// wm_serve over loopback, with the embedded model: every endpoint, streamed and whole; a session
// continued over three requests against the same conversation run in one session in-process;
// concurrent requests each answered as when run alone (continuous batching mixes nothing up);
// the bad inputs (400 naming the field, 404, 401, 413, 429 with Retry-After); a client that
// leaves mid-stream; SIGTERM; the state folder: a session continued after a restart, a damaged
// session file, idle sessions leaving memory for it, evoke's bank across a restart, kill -9
// during the load test; logprobs whole and streamed. Skipped, with the reason, when wm_serve or
// cpp-httplib is absent.
#include <gtest/gtest.h>

#ifdef WM_HAVE_HTTPLIB
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "llmkv/byte_level.h"
#include "llmkv/chat_template.h"
#include "llmkv/hf_folder.h"
#include "llmkv/session.h"
#include "llmkv/tokenizer.h"
#include "runtime/build_paths.h"
#include "tests/cli/program_runner.h"
#include "tests/temp_dir.h"

namespace wm::testing {
namespace {

using json = nlohmann::json;

// A wm_serve of its own, on a free port, with the embedded model.
class ServeProcess {
 public:
  // `env`: variables for the server; `prefix`: a program it runs under (prlimit ...).
  explicit ServeProcess(std::vector<std::string> extra, std::vector<std::pair<std::string, std::string>> env = {},
                        std::vector<std::string> prefix = {}) {
    const std::string exe = program_path("wm_serve");
    dir_ = make_temp_dir("wm_serve_test_");
    std::vector<std::string> argv = prefix;
    for (const std::string& a : {exe, std::string("--port"), std::string("0"), std::string("--threads"), std::string("1")})
      argv.push_back(a);
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc_ = std::make_unique<Started>(argv, dir_, fs::path(WM_SOURCE_DIR), env, Launch::Forked);
    const std::regex re(R"(listening on http://127\.0\.0\.1:(\d+))");
    for (int i = 0; i < 600 && port_ == 0 && proc_->running(); ++i) {
      std::smatch m;
      const std::string out = read_text(dir_ / ".run.out");
      if (std::regex_search(out, m, re)) port_ = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~ServeProcess() {
    proc_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  int port() const { return port_; }
  Started& proc() { return *proc_; }
  std::string err() const { return read_text(dir_ / ".run.err"); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }

 private:
  fs::path dir_;
  std::unique_ptr<Started> proc_;
  int port_ = 0;
};

std::string chat_body(const std::vector<std::pair<std::string, std::string>>& msgs, int max_tokens, bool stream = false,
                      const std::string& extra = "") {
  json m = json::array();
  for (const auto& [r, c] : msgs) m.push_back({{"role", r}, {"content", c}});
  json b = {{"model", "tiny-llm"}, {"messages", m}, {"max_tokens", max_tokens}, {"stream", stream}};
  if (!extra.empty()) b.update(json::parse(extra));
  return b.dump();
}

// The text of a streamed response: its chunks' content in order, and the last chunk.
std::pair<std::string, json> stream_text(const std::string& body) {
  std::string text;
  json last;
  bool done = false;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string data = line.substr(6);
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    const json j = json::parse(data);
    if (!j.contains("choices")) {  // an error event
      last = j;
      continue;
    }
    const json& c = j["choices"][0];
    if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    if (c.contains("text")) text += c["text"].get<std::string>();
    last = j;
  }
  EXPECT_TRUE(done) << "no [DONE] at the end";
  return {text, last};
}

std::string repeat(const std::string& s, int n) {
  std::string r;
  for (int i = 0; i < n; ++i) r += s;
  return r;
}

// The replies of one in-process session fed the conversation's user turns, greedy, as wm_llm
// --chat runs it (policy full); with `tokens`, each reply's tokens too.
std::vector<std::string> reference_chat(const std::vector<std::string>& turns, int max_tokens,
                                        std::vector<std::vector<int64_t>>* tokens = nullptr) {
  const std::string dir = std::string(WM_SOURCE_DIR) + "/assets/models/tiny-llm";
  llm::LlmModel model = llm::load_llm(dir, at::kCPU);
  llm::Tokenizer tok = llm::Tokenizer::load(dir + "/tokenizer.json");
  llm::LlmSession session(model, tok, at::kCPU);
  const int64_t im_end = *tok.token_to_id("<|im_end|>");
  llm::GenerateOptions go;
  go.max_new_tokens = max_tokens;
  go.stop_tokens = model->config().eos_token_ids;
  const auto defaults = llm::GenerationDefaults::load(dir + "/generation_config.json");
  go.stop_tokens.insert(go.stop_tokens.end(), defaults.eos_token_ids.begin(), defaults.eos_token_ids.end());
  go.stop_tokens.push_back(im_end);
  bool ended_on_im_end = false;
  std::vector<std::string> out;
  for (size_t i = 0; i < turns.size(); ++i) {
    std::vector<int64_t> ids = llm::encode_chatml(tok, {{"user", turns[i]}}, true);
    if (i > 0) {
      const std::vector<int64_t> join = tok.encode(ended_on_im_end ? "\n" : "<|im_end|>\n", true);
      ids.insert(ids.begin(), join.begin(), join.end());
    }
    const llm::Generation g = session.generate(ids, go);
    ended_on_im_end = !g.tokens.empty() && g.tokens.back() == im_end;
    out.push_back(g.text);
    if (tokens) tokens->push_back(g.tokens);
  }
  return out;
}

// A chat request of one user turn in session `sid`: its reply (empty with a failure noted).
std::string chat_turn(ServeProcess& s, const std::string& sid, const std::string& text, int max_tokens) {
  auto c = s.client();
  auto r = c.Post("/v1/chat/completions", {{"X-Session-Id", sid}}, chat_body({{"user", text}}, max_tokens),
                  "application/json");
  EXPECT_TRUE(r && r->status == 200) << (r ? r->body : std::string("no answer")) << s.err();
  if (!r || r->status != 200) return "";
  return json::parse(r->body)["choices"][0]["message"]["content"];
}

// A counter's value in /metrics (-1 when absent).
int64_t metric(ServeProcess& s, const std::string& name) {
  auto m = s.client().Get("/metrics");
  if (!m) return -1;
  std::smatch v;
  const std::string body = m->body;
  if (!std::regex_search(body, v, std::regex("\n" + name + " (\\d+)"))) return -1;
  return std::stoll(v[1]);
}

#define SKIP_WITHOUT_SERVE()                                                       \
  if (program_path("wm_serve").empty()) GTEST_SKIP() << "wm_serve is not built"; \
  do {                                                                             \
  } while (0)

TEST(Serve, EndpointsStreamedAndWholeAgree) {
  SKIP_WITHOUT_SERVE();
  ServeProcess s({});
  ASSERT_GT(s.port(), 0) << s.err();
  auto c = s.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny-llm");
  const std::string body = chat_body({{"user", "Recall fada: 3117. Recall fada?"}}, 16);
  auto whole = c.Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json w = json::parse(whole->body);
  EXPECT_EQ(w["object"], "chat.completion");
  EXPECT_EQ(w["usage"]["completion_tokens"].get<int>() + w["usage"]["prompt_tokens"].get<int>(),
            w["usage"]["total_tokens"].get<int>());
  auto streamed = c.Post("/v1/chat/completions", chat_body({{"user", "Recall fada: 3117. Recall fada?"}}, 16, true),
                         "application/json");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200);
  EXPECT_NE(streamed->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  auto [text, last] = stream_text(streamed->body);
  EXPECT_EQ(text, w["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(last["choices"][0]["finish_reason"], w["choices"][0]["finish_reason"]);
  EXPECT_EQ(last["usage"], w["usage"]);
  // Text completions, whole and streamed.
  const json cb = {{"model", "tiny-llm"}, {"prompt", "a b c d e"}, {"max_tokens", 8}};
  auto tc = c.Post("/v1/completions", cb.dump(), "application/json");
  ASSERT_TRUE(tc);
  ASSERT_EQ(tc->status, 200) << tc->body;
  json cbs = cb;
  cbs["stream"] = true;
  auto tcs = c.Post("/v1/completions", cbs.dump(), "application/json");
  ASSERT_TRUE(tcs);
  EXPECT_EQ(stream_text(tcs->body).first, json::parse(tc->body)["choices"][0]["text"].get<std::string>());
  // Metrics count what ran.
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("wm_serve_requests_total 4"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("wm_serve_ttft_seconds_count 4"), std::string::npos);
  EXPECT_NE(m->body.find("# TYPE wm_serve_token_seconds histogram"), std::string::npos);
}

// Three requests of one session (the client sending the whole conversation each time, then only
// the new turn) give the replies of one in-process session fed the same turns, greedy.
TEST(Serve, SessionOverThreeRequestsEqualsOneConversation) {
  SKIP_WITHOUT_SERVE();
  ServeProcess s({});
  ASSERT_GT(s.port(), 0) << s.err();
  auto c = s.client();
  const std::vector<std::string> turns = {"Recall fada: 3117.", "Recall piti: 42.", "Recall fada?"};
  const httplib::Headers sid = {{"X-Session-Id", "conv-1"}};
  std::vector<std::pair<std::string, std::string>> history;
  std::vector<std::string> got;
  for (size_t i = 0; i < turns.size(); ++i) {
    history.push_back({"user", turns[i]});
    // Turns 1-2 send the whole conversation; turn 3 only its new message.
    const std::string body = i < 2 ? chat_body(history, 12) : chat_body({{"user", turns[i]}}, 12);
    auto r = c.Post("/v1/chat/completions", sid, body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["session_id"], "conv-1");
    got.push_back(j["choices"][0]["message"]["content"]);
    history.push_back({"assistant", got.back()});
  }
  const std::vector<std::string> want = reference_chat(turns, 12);
  for (size_t i = 0; i < turns.size(); ++i) EXPECT_EQ(got[i], want[i]) << "turn " << i;
  // Ending the session; a second end finds nothing.
  auto d = c.Delete("/v1/sessions/conv-1");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 200);
  auto d2 = c.Delete("/v1/sessions/conv-1");
  ASSERT_TRUE(d2);
  EXPECT_EQ(d2->status, 404);
}

// Eight requests at once (parallel 4: batched, joining as others leave) each answer what it
// answers alone.
TEST(Serve, ConcurrentRequestsEachAnswerAsAlone) {
  SKIP_WITHOUT_SERVE();
  ServeProcess s({"--parallel", "4"});
  ASSERT_GT(s.port(), 0) << s.err();
  std::vector<std::string> bodies;
  for (int i = 0; i < 8; ++i)
    bodies.push_back(chat_body({{"user", "Recall k" + std::to_string(i) + ": " + std::to_string(100 + 37 * i) + "."}},
                               6 + 3 * i, i % 2 == 1));
  auto answer = [&](const std::string& b) {
    auto c = s.client();
    auto r = c.Post("/v1/chat/completions", b, "application/json");
    if (!r || r->status != 200) return std::string("<failed>");
    const json j = json::parse(b);
    return j["stream"].get<bool>() ? stream_text(r->body).first
                                   : json::parse(r->body)["choices"][0]["message"]["content"].get<std::string>();
  };
  std::vector<std::string> alone;
  for (const auto& b : bodies) alone.push_back(answer(b));
  std::vector<std::future<std::string>> together;
  for (const auto& b : bodies) together.push_back(std::async(std::launch::async, answer, b));
  for (size_t i = 0; i < bodies.size(); ++i) {
    EXPECT_NE(alone[i], "<failed>");
    EXPECT_EQ(together[i].get(), alone[i]) << "request " << i;
  }
  auto m = s.client().Get("/metrics");
  ASSERT_TRUE(m);
  // Some steps ran more than one generation: batched tokens exceed the steps.
  std::smatch steps, tokens;
  ASSERT_TRUE(std::regex_search(m->body, steps, std::regex(R"(wm_serve_batched_steps_total (\d+))")));
  ASSERT_TRUE(std::regex_search(m->body, tokens, std::regex(R"(wm_serve_batched_tokens_total (\d+))")));
  EXPECT_GT(std::stoll(tokens[1]), std::stoll(steps[1]));
}

// The logprobs entries of a streamed response, its chunks' in order (chat: content entries; text:
// the older form's four lists concatenated); each chunk with text carries its tokens' entries.
json streamed_logprobs(const std::string& body, bool chat) {
  json all = chat ? json::array() : json{{"tokens", json::array()}, {"token_logprobs", json::array()},
                                         {"top_logprobs", json::array()}, {"text_offset", json::array()}};
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: {", 0) != 0) continue;
    const json c = json::parse(line.substr(6))["choices"][0];
    const bool text = chat ? c["delta"].contains("content") && !c["delta"]["content"].get<std::string>().empty()
                           : !c["text"].get<std::string>().empty();
    if (text) EXPECT_TRUE(c["logprobs"].is_object()) << "a chunk with text and no logprobs: " << line;
    if (!c["logprobs"].is_object()) continue;
    if (chat)
      for (const auto& e : c["logprobs"]["content"]) all.push_back(e);
    else
      for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        for (const auto& e : c["logprobs"][k]) all[k].push_back(e);
  }
  return all;
}

// A greedy chat answer with logprobs and 5 alternatives: one entry per generated token (those of
// the same conversation run in-process, in order, the end token included), its bytes the answer's
// (then the end token's), its token those bytes as valid UTF-8, the chosen one the most probable
// (greedy), the alternatives sorted with log-probabilities <= 0 summing to at most probability 1;
// the stream's entries the whole answer's; the answer the same as without logprobs. A text
// completion's older form likewise, whole and streamed.
TEST(Serve, LogprobsWholeAndStreamedAgree) {
  SKIP_WITHOUT_SERVE();
  ServeProcess s({});
  ASSERT_GT(s.port(), 0) << s.err();
  auto c = s.client();
  const std::string turn = "Recall fada: 3117. Recall fada?";
  const std::string lp = R"({"temperature": 0, "logprobs": true, "top_logprobs": 5})";
  auto whole = c.Post("/v1/chat/completions", chat_body({{"user", turn}}, 16, false, lp), "application/json");
  auto plain = c.Post("/v1/chat/completions", chat_body({{"user", turn}}, 16), "application/json");
  auto streamed = c.Post("/v1/chat/completions", chat_body({{"user", turn}}, 16, true, lp), "application/json");
  ASSERT_TRUE(whole && plain && streamed);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json w = json::parse(whole->body)["choices"][0];
  const json p = json::parse(plain->body)["choices"][0];
  EXPECT_EQ(w["message"], p["message"]) << "logprobs changed the greedy answer";
  EXPECT_TRUE(p["logprobs"].is_null());
  std::vector<std::vector<int64_t>> ref;
  reference_chat({turn}, 16, &ref);
  const json& entries = w["logprobs"]["content"];
  ASSERT_EQ(entries.size(), ref[0].size());
  const llm::Tokenizer tok =
      llm::Tokenizer::load(std::string(WM_SOURCE_DIR) + "/assets/models/tiny-llm/tokenizer.json");
  std::string bytes, last;
  for (size_t i = 0; i < entries.size(); ++i) {
    const json& e = entries[i];
    EXPECT_EQ(e["id"].get<int64_t>(), ref[0][i]) << i;
    std::string b;
    for (const auto& x : e["bytes"]) b += static_cast<char>(x.get<int>());
    EXPECT_EQ(b, tok.token_bytes(ref[0][i])) << i;
    EXPECT_EQ(e["token"].get<std::string>(), llm::utf8_valid(b)) << i;
    (i + 1 < entries.size() ? bytes : last) += b;
    const json& top = e["top_logprobs"];
    ASSERT_EQ(top.size(), 5u);
    EXPECT_EQ(e["logprob"].get<double>(), top[0]["logprob"].get<double>()) << "greedy, token " << i;
    double mass = 0.0;
    for (size_t k = 0; k < top.size(); ++k) {
      EXPECT_LE(top[k]["logprob"].get<double>(), 0.0);
      if (k > 0) EXPECT_GE(top[k - 1]["logprob"].get<double>(), top[k]["logprob"].get<double>());
      mass += std::exp(top[k]["logprob"].get<double>());
    }
    EXPECT_LE(mass, 1.0 + 1e-9);
  }
  const std::string text = w["message"]["content"];
  if (w["finish_reason"] == "stop") {  // the end token: an entry, not text
    EXPECT_EQ(bytes, text);
  } else {
    EXPECT_EQ(bytes + last, text);
  }
  EXPECT_EQ(streamed_logprobs(streamed->body, true), entries);
  EXPECT_EQ(stream_text(streamed->body).first, text);
  // A text completion: the older form, whole and streamed; a stop string ends it, whose token the
  // stream carries in a chunk without text.
  const json cb = {{"model", "tiny-llm"}, {"prompt", "rode 42\nsora 17\nRecall:\nrode"}, {"max_tokens", 6},
                   {"logprobs", 3}, {"stop", "\n"}};
  auto tc = c.Post("/v1/completions", cb.dump(), "application/json");
  json cbs = cb;
  cbs["stream"] = true;
  auto tcs = c.Post("/v1/completions", cbs.dump(), "application/json");
  ASSERT_TRUE(tc && tcs);
  ASSERT_EQ(tc->status, 200) << tc->body;
  const json tw = json::parse(tc->body)["choices"][0];
  const json& older = tw["logprobs"];
  EXPECT_EQ(tw["text"], " 42");
  EXPECT_EQ(tw["finish_reason"], "stop");
  const size_t n = older["tokens"].size();
  ASSERT_GE(n, 2u) << older.dump();
  EXPECT_EQ(older["tokens"][n - 1], "\n") << "the stop string's token";
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(older["top_logprobs"][i].size(), 3u) << older.dump();
    EXPECT_LE(older["token_logprobs"][i].get<double>(), 0.0);
  }
  EXPECT_EQ(older["text_offset"][0], 0);
  EXPECT_EQ(streamed_logprobs(tcs->body, false), older);
  EXPECT_EQ(stream_text(tcs->body).first, tw["text"].get<std::string>());
}

TEST(Serve, BadRequestsAreAnsweredNamingTheField) {
  SKIP_WITHOUT_SERVE();
  ServeProcess s({"--max-body-bytes", "65536", "--max-tokens-limit", "64"});
  ASSERT_GT(s.port(), 0) << s.err();
  auto c = s.client();
  const std::string ok = chat_body({{"user", "hi"}}, 4);
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {"{not json", 400, ""},
      {"[1, 2]", 400, ""},
      {R"({"messages": [{"role": "user", "content": "hi"}]})", 400, "model"},
      {R"({"model": "other", "messages": [{"role": "user", "content": "hi"}]})", 404, "model"},
      {R"({"model": "tiny-llm"})", 400, "messages"},
      {R"({"model": "tiny-llm", "messages": []})", 400, "messages"},
      {R"({"model": "tiny-llm", "messages": [{"role": "king", "content": "hi"}]})", 400, "messages[0].role"},
      {R"({"model": "tiny-llm", "messages": [{"role": "user", "content": 7}]})", 400, "messages[0].content"},
      {chat_body({{"user", "hi"}}, 0), 400, "max_tokens"},
      {chat_body({{"user", "hi"}}, 65), 400, "max_tokens"},
      {chat_body({{"user", "hi"}}, 4, false, R"({"max_tokens": "4"})"), 400, "max_tokens"},
      {chat_body({{"user", "hi"}}, 4, false, R"({"temperature": -1})"), 400, "temperature"},
      {chat_body({{"user", "hi"}}, 4, false, R"({"top_p": 0})"), 400, "top_p"},
      {chat_body({{"user", "hi"}}, 4, false, R"({"stop": 5})"), 400, "stop"},
      {chat_body({{"user", "hi"}}, 4, false, R"({"stream": "yes"})"), 400, "stream"},
      {chat_body({{"user", "hi"}}, 4, false, R"({"session_id": "bad id!"})"), 400, "session_id"},
      {chat_body({{"user", "hi"}}, 4, false, R"({"n": 2})"), 400, "n"},
      {chat_body({{"user", "hi"}}, 4, false, R"({"logprobs": "yes"})"), 400, "logprobs"},
      {chat_body({{"user", "hi"}}, 4, false, R"({"top_logprobs": 3})"), 400, "top_logprobs"},
      {chat_body({{"user", "hi"}}, 4, false, R"({"logprobs": true, "top_logprobs": 21})"), 400, "top_logprobs"},
      {chat_body({{"user", repeat("x y ", 5000)}}, 4), 400, "messages"},  // past the model's 4,096 positions
  };
  for (const auto& k : cases) {
    auto r = c.Post("/v1/chat/completions", k.body, "application/json");
    ASSERT_TRUE(r) << k.body;
    EXPECT_EQ(r->status, k.status) << k.body.substr(0, 120) << " -> " << r->body;
    const json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.contains("error")) << r->body;
    if (!k.param.empty()) EXPECT_EQ(e["error"]["param"], k.param) << r->body;
  }
  auto big = c.Post("/v1/chat/completions", chat_body({{"user", std::string(70000, 'y')}}, 4), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  auto unknown = c.Get("/v1/nothing");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  // Still serving.
  auto r = c.Post("/v1/chat/completions", ok, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(Serve, ApiKeyQueueLimitDisconnectAndSigterm) {
  SKIP_WITHOUT_SERVE();
  ServeProcess s({"--api-key", "sesame", "--parallel", "1", "--queue", "0", "--max-tokens-limit", "4000"});
  ASSERT_GT(s.port(), 0) << s.err();
  auto c = s.client();
  const std::string body = chat_body({{"user", "Recall fada: 3117."}}, 4);
  auto no_key = c.Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(c.Get("/health")->status, 200);  // health needs no key
  const httplib::Headers key = {{"Authorization", "Bearer sesame"}};
  auto with_key = c.Post("/v1/chat/completions", key, body, "application/json");
  ASSERT_TRUE(with_key);
  EXPECT_EQ(with_key->status, 200) << with_key->body;
  // One slot, no queue: of several long requests at once, some are refused with Retry-After.
  const std::string slow = chat_body({{"user", "Recall fada: 3117."}}, 400, false, R"({"stop": ["never seen"]})");
  std::vector<std::future<std::pair<int, std::string>>> fs;
  for (int i = 0; i < 4; ++i)
    fs.push_back(std::async(std::launch::async, [&] {
      auto cl = s.client();
      auto r = cl.Post("/v1/chat/completions", key, slow, "application/json");
      return r ? std::make_pair(r->status, r->get_header_value("Retry-After")) : std::make_pair(-1, std::string());
    }));
  int ok = 0, refused = 0;
  for (auto& f : fs) {
    auto [status, retry] = f.get();
    if (status == 200) ++ok;
    if (status == 429) {
      ++refused;
      EXPECT_EQ(retry, "1");
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(refused, 1);
  EXPECT_EQ(ok + refused, 4);
  // A client that leaves mid-stream: its generation is cancelled and the slot freed.
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(s.port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    // 4,000 tokens: seconds of generation, whatever else the machine runs, to notice the drop in.
    const std::string sb = chat_body({{"user", "Recall fada: 3117."}}, 4000, true, R"({"stop": ["never seen"]})");
    const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sesame\r\n"
                            "Content-Type: application/json\r\nContent-Length: " +
                            std::to_string(sb.size()) + "\r\n\r\n" + sb;
    ASSERT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
    char buf[512];
    ASSERT_GT(::read(fd, buf, sizeof buf), 0);  // the stream started
    ::close(fd);
  }
  bool cancelled = false;
  for (int i = 0; i < 200 && !cancelled; ++i) {
    auto m = c.Get("/metrics", key);
    cancelled = m && m->body.find("wm_serve_requests_cancelled_total 1") != std::string::npos;
    if (!cancelled) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(cancelled) << "the abandoned stream was not cancelled";
  auto after = c.Post("/v1/chat/completions", key, body, "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << "the slot was not freed";
  // SIGTERM: the server ends cleanly.
  s.proc().signal(SIGTERM);
  const RunResult rr = s.proc().wait(30);
  EXPECT_TRUE(rr.exited && rr.code == 0) << rr.err;
}

// SIGTERM with --drain-timeout: the generation under way ends where it is once the time is up
// (its stream ends with an error event, code server_shutdown), requests still waiting get 503, and
// the server exits cleanly.
TEST(Serve, SigtermDrainIsBounded) {
  SKIP_WITHOUT_SERVE();
  ServeProcess s({"--parallel", "1", "--queue", "4", "--max-tokens-limit", "4000", "--drain-timeout", "0.2"});
  ASSERT_GT(s.port(), 0) << s.err();
  httplib::Client c = s.client();
  auto long_one = std::async(std::launch::async, [&] {
    auto r = c.Post("/v1/completions",
                    json{{"model", "tiny-llm"}, {"prompt", "rode 42"}, {"max_tokens", 4000}, {"stream", true},
                         {"stop", "never seen"}}
                        .dump(),
                    "application/json");
    return r ? r->body : std::string();
  });
  // Two more wait behind it (one slot).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<std::future<int>> waiting;
  for (int i = 0; i < 2; ++i)
    waiting.push_back(std::async(std::launch::async, [&] {
      auto cl = s.client();
      auto r = cl.Post("/v1/completions", json{{"model", "tiny-llm"}, {"prompt", "sora 17"}, {"max_tokens", 4}}.dump(),
                       "application/json");
      return r ? r->status : -1;
    }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  s.proc().signal(SIGTERM);
  const RunResult rr = s.proc().wait(60);
  EXPECT_TRUE(rr.exited && rr.code == 0) << rr.err;
  // Cut at the drain's limit: said as an error event, never as a finished answer.
  const auto [text, last] = stream_text(long_one.get());
  ASSERT_TRUE(last.contains("error")) << last.dump();
  EXPECT_EQ(last["error"]["code"], "server_shutdown") << last.dump();
  for (auto& w : waiting) EXPECT_EQ(w.get(), 503);
}

// The load test against a server of 2 slots and a short queue: 8 clients x 6 streamed requests,
// sessions and one-shot, every 3rd dropped mid-stream: none lost, none mixed up (each answer
// equals the same request run alone), every request answered, refused or dropped.
TEST(Serve, LoadTestLosesAndMixesUpNothing) {
  SKIP_WITHOUT_SERVE();
  const std::string load = program_path("wm_serve_load");
  if (load.empty()) GTEST_SKIP() << "wm_serve_load is not built";
  ServeProcess s({"--parallel", "2", "--queue", "4"});
  ASSERT_GT(s.port(), 0) << s.err();
  const fs::path dir = make_temp_dir("wm_serve_load_");
  const fs::path out = dir / "load.json";
  const RunResult r = run_program({load, "--port", std::to_string(s.port()), "--clients", "8", "--requests", "6",
                                   "--drop-every", "3", "--json", out.string()},
                                  dir, fs::path(WM_SOURCE_DIR), 300);
  EXPECT_TRUE(r.exited && r.code == 0) << r.out << r.err;
  const json j = json::parse(read_text(out));
  EXPECT_EQ(j["lost"], 0);
  EXPECT_EQ(j["mixed_up"], 0);
  EXPECT_EQ(j["dropped"], 16);
  EXPECT_EQ(j["answered"].get<int>() + j["refused"].get<int>(), 32);
  EXPECT_GT(j["answered"].get<int>(), 0);
  fs::remove_all(dir);
}

// A state folder: a session continued after a restart answers as one never interrupted; the
// bank's blocks come back with it; a damaged session file is reported and that session starts
// afresh, the others found.
TEST(Serve, SessionsSurviveRestartAndADamagedFileIsNotUsed) {
  SKIP_WITHOUT_SERVE();
  const fs::path root = make_temp_dir("wm_serve_state_");
  const fs::path state = root / "state";  // made by the server
  const std::vector<std::string> turns = {"Recall fada: 3117.", "Recall piti: 42.", "Recall fada?"};
  const std::vector<std::string> want = reference_chat(turns, 12);
  {
    ServeProcess s({"--state-dir", state.string()});
    ASSERT_GT(s.port(), 0) << s.err();
    EXPECT_EQ(chat_turn(s, "conv-r", turns[0], 12), want[0]);
    EXPECT_EQ(chat_turn(s, "conv-r", turns[1], 12), want[1]);
    EXPECT_EQ(chat_turn(s, "conv-other", "Recall hemo: 55.", 6).empty(), false);
    EXPECT_EQ(metric(s, "wm_serve_session_saves_total"), 3);
    s.proc().signal(SIGTERM);
    const RunResult rr = s.proc().wait(30);
    EXPECT_TRUE(rr.exited && rr.code == 0) << rr.err;
  }
  {
    ServeProcess s({"--state-dir", state.string()});
    ASSERT_GT(s.port(), 0) << s.err();
    auto info = s.client().Get("/v1/sessions/conv-r");
    ASSERT_TRUE(info);
    ASSERT_EQ(info->status, 200) << info->body;
    const json j = json::parse(info->body);
    EXPECT_EQ(j["turns"], 2);
    EXPECT_EQ(j["in_memory"], false);
    EXPECT_EQ(j["messages"].size(), 4u);
    EXPECT_EQ(j["last_reply"], want[1]);
    EXPECT_EQ(chat_turn(s, "conv-r", turns[2], 12), want[2]) << "the restarted session answers otherwise";
    EXPECT_EQ(metric(s, "wm_serve_session_loads_total"), 1);
    s.proc().signal(SIGKILL);
    s.proc().wait(30);
  }
  // One byte of conv-r's file changed.
  fs::path damaged;
  for (const auto& e : fs::directory_iterator(state)) {
    if (e.path().extension() != ".wmsess") continue;
    const std::string bytes = read_text(e.path());
    if (bytes.find("conv-r") != std::string::npos) damaged = e.path();
  }
  ASSERT_FALSE(damaged.empty());
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(damaged) / 2);
    char c = 0;
    ASSERT_TRUE(f.seekg(at).get(c));
    ASSERT_TRUE(f.seekp(at).put(static_cast<char>(~c)));  // the complement: always a change
  }
  {
    ServeProcess s({"--state-dir", state.string()});
    ASSERT_GT(s.port(), 0) << s.err();
    EXPECT_NE(s.err().find("session 'conv-r'"), std::string::npos) << s.err();
    EXPECT_NE(s.err().find("starts afresh"), std::string::npos) << s.err();
    EXPECT_EQ(s.client().Get("/v1/sessions/conv-r")->status, 404);
    EXPECT_EQ(s.client().Get("/v1/sessions/conv-other")->status, 200);
    EXPECT_FALSE(fs::exists(damaged)) << "the damaged file stays";
    EXPECT_EQ(chat_turn(s, "conv-r", turns[0], 12), want[0]) << "a fresh session answers otherwise";
  }
  fs::remove_all(root);
}

// With no memory for idle sessions, each leaves memory for the folder when its request ends and
// comes back on its next: the replies are those of one uninterrupted conversation.
TEST(Serve, IdleSessionsLeaveMemoryForTheFolderAndComeBack) {
  SKIP_WITHOUT_SERVE();
  const fs::path root = make_temp_dir("wm_serve_unload_");
  const fs::path state = root / "state";  // made by the server
  const std::vector<std::string> turns = {"Recall fada: 3117.", "Recall piti: 42.", "Recall fada?"};
  const std::vector<std::string> want = reference_chat(turns, 12);
  ServeProcess s({"--state-dir", state.string(), "--session-memory", "0"});
  ASSERT_GT(s.port(), 0) << s.err();
  for (size_t i = 0; i < turns.size(); ++i) {
    EXPECT_EQ(chat_turn(s, "conv-u", turns[i], 12), want[i]) << "turn " << i;
    auto info = s.client().Get("/v1/sessions/conv-u");
    ASSERT_TRUE(info);
    EXPECT_EQ(json::parse(info->body)["in_memory"], false);
  }
  EXPECT_EQ(metric(s, "wm_serve_sessions_unloaded_total"), 3);
  EXPECT_EQ(metric(s, "wm_serve_session_loads_total"), 2);
  fs::remove_all(root);
}

// Under evoke with a small budget, turns leave the window for the bank and the one a message
// needs comes back; the bank persists between requests and through a restart.
TEST(Serve, EvokeBanksTurnsAndBringsThemBackAcrossARestart) {
  SKIP_WITHOUT_SERVE();
  const fs::path root = make_temp_dir("wm_serve_evoke_");
  const fs::path state = root / "state";  // made by the server
  const std::vector<std::string> facts = {"Recall fada: 3117.", "Recall piti: 42.", "Recall hemo: 55.",
                                          "Recall sora: 17.", "Recall rode: 90.", "Recall fada: 3117."};
  {
    ServeProcess s({"--state-dir", state.string(), "--kv-budget", "64", "--default-max-tokens", "8"});
    ASSERT_GT(s.port(), 0) << s.err();
    for (const auto& f : facts) chat_turn(s, "ev", f, 4);
    EXPECT_GT(metric(s, "wm_serve_evictions_total"), 0) << "nothing left the window at a budget of 48";
    s.proc().signal(SIGTERM);
    s.proc().wait(30);
  }
  ServeProcess s({"--state-dir", state.string(), "--kv-budget", "64", "--default-max-tokens", "8"});
  ASSERT_GT(s.port(), 0) << s.err();
  chat_turn(s, "ev", "Recall fada?", 4);
  EXPECT_GT(metric(s, "wm_serve_recoveries_total"), 0) << "no banked turn came back after the restart";
  auto info = s.client().Get("/v1/sessions/ev");
  ASSERT_TRUE(info);
  EXPECT_EQ(json::parse(info->body)["turns"], 7);
  fs::remove_all(root);
}

// kill -9 during the load test, a restart on the same folder: every session whose last request
// had been answered is found with that answer, and continues as a replay of its turns does.
TEST(Serve, KilledDuringLoadEveryAnsweredSessionIsFound) {
  SKIP_WITHOUT_SERVE();
  const std::string load = program_path("wm_serve_load");
  if (load.empty()) GTEST_SKIP() << "wm_serve_load is not built";
  const fs::path root = make_temp_dir("wm_serve_crash_");
  const fs::path state = root / "state";  // made by the server
  const fs::path rec = root / "record.jsonl";
  const fs::path out = root / "verify.json";
  const fs::path logs = root / "logs";
  fs::create_directories(logs);
  int sessions_answered = 0;
  {
    ServeProcess s({"--state-dir", state.string(), "--parallel", "4"});
    ASSERT_GT(s.port(), 0) << s.err();
    Started l({load, "--port", std::to_string(s.port()), "--clients", "8", "--requests", "100000", "--drop-every", "5",
               "--record", rec.string()},
              logs, fs::path(WM_SOURCE_DIR));
    // Killed once some sessions have answers recorded.
    for (int i = 0; i < 1200; ++i) {
      std::string r = read_text(rec);
      sessions_answered = 0;
      for (size_t at = r.find("\"answer\""); at != std::string::npos; at = r.find("\"answer\"", at + 1)) ++sessions_answered;
      if (sessions_answered >= 40) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    s.proc().signal(SIGKILL);
    s.proc().wait(30);
    const RunResult lr = l.wait(120);
    EXPECT_TRUE(lr.exited) << "the load did not stop when the server went";
  }
  ASSERT_GE(sessions_answered, 40);
  ServeProcess s({"--state-dir", state.string()});
  ASSERT_GT(s.port(), 0) << s.err();
  const RunResult v = run_program({load, "--port", std::to_string(s.port()), "--verify", rec.string(), "--json", out.string()},
                                  logs, fs::path(WM_SOURCE_DIR), 300);
  EXPECT_TRUE(v.exited && v.code == 0) << v.out << v.err;
  const json j = json::parse(read_text(out));
  EXPECT_EQ(j["wrong"], 0);
  EXPECT_EQ(j["found"], j["answered_last"]);
  EXPECT_EQ(j["continued"], j["found"]);
  EXPECT_EQ(j["in_flight_ok"], j["in_flight"]);
  EXPECT_GT(j["answered_last"].get<int>() + j["in_flight"].get<int>(), 0);
  fs::remove_all(root);
}

// Generations whose bytes are not valid UTF-8 (a byte-level token ending mid-character, sampled
// at temperature 2): streamed and whole, the server answers every one with valid JSON and stays
// up, and the sessions they went into can still be read and saved.
TEST(Serve, InvalidUtf8GenerationsNeitherCrashNorBreakSessions) {
  SKIP_WITHOUT_SERVE();
  const fs::path root = make_temp_dir("wm_serve_utf8_");
  const fs::path state = root / "state";  // made by the server
  ServeProcess s({"--state-dir", state.string()});
  ASSERT_GT(s.port(), 0) << s.err();
  auto c = s.client();
  for (int seed = 1; seed <= 60; ++seed) {
    const bool stream = seed % 2 == 1;
    const json body = {{"model", "tiny-llm"}, {"prompt", "x"},  {"temperature", 2.0},
                       {"seed", seed},        {"max_tokens", 16}, {"stream", stream}};
    auto r = c.Post("/v1/completions", {{"X-Session-Id", "u" + std::to_string(seed % 4)}}, body.dump(),
                    "application/json");
    ASSERT_TRUE(r) << "no answer for seed " << seed << ": " << s.err();
    ASSERT_EQ(r->status, 200) << r->body;
    if (stream) {
      const auto [text, last] = stream_text(r->body);
      EXPECT_TRUE(last.contains("usage")) << last.dump();
      EXPECT_EQ(json(text).dump(), json(text).dump(-1, ' ', false, json::error_handler_t::strict));
    } else {
      EXPECT_NO_THROW(json::parse(r->body)) << "seed " << seed;
    }
  }
  for (int k = 0; k < 4; ++k) {
    auto g = c.Get("/v1/sessions/u" + std::to_string(k));
    ASSERT_TRUE(g);
    EXPECT_EQ(g->status, 200) << g->body;
  }
  EXPECT_EQ(metric(s, "wm_serve_session_save_failed_total"), 0);
  s.proc().signal(SIGTERM);
  EXPECT_EQ(s.proc().wait(30).code, 0);
  fs::remove_all(root);
}

// API keys from a file (several) or the environment, never needing the command line; the bearer
// scheme in any case; each key's sessions its own: another key neither reads, continues nor
// deletes them.
TEST(Serve, KeysFromFileOrEnvironmentAndSessionsScopedToTheKey) {
  SKIP_WITHOUT_SERVE();
  const fs::path dir = make_temp_dir("wm_serve_keys_");
  const fs::path keys = dir / "keys";
  {
    std::ofstream f(keys);
    f << "# two tenants\nkey-alice\nkey-bob\n";
  }
  ServeProcess s({"--api-key-file", keys.string()});
  ASSERT_GT(s.port(), 0) << s.err();
  auto c = s.client();
  const httplib::Headers alice = {{"Authorization", "bearer key-alice"}, {"X-Session-Id", "shared-name"}};
  const httplib::Headers bob = {{"Authorization", "BEARER key-bob"}, {"X-Session-Id", "shared-name"}};
  auto a = c.Post("/v1/chat/completions", alice, chat_body({{"user", "Recall fada: 3117."}}, 4), "application/json");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 200) << a->body;
  EXPECT_EQ(c.Get("/v1/sessions/shared-name", {{"Authorization", "Bearer key-bob"}})->status, 404);
  EXPECT_EQ(c.Delete("/v1/sessions/shared-name", {{"Authorization", "Bearer key-bob"}})->status, 404);
  auto mine = c.Get("/v1/sessions/shared-name", {{"Authorization", "Bearer key-alice"}});
  ASSERT_TRUE(mine);
  EXPECT_EQ(mine->status, 200);
  EXPECT_EQ(json::parse(mine->body)["turns"], 1);
  auto b = c.Post("/v1/chat/completions", bob, chat_body({{"user", "Recall piti: 42."}}, 4), "application/json");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, 200);
  EXPECT_EQ(json::parse(c.Get("/v1/sessions/shared-name", {{"Authorization", "Bearer key-alice"}})->body)["turns"], 1)
      << "bob's request went into alice's session";
  EXPECT_EQ(c.Get("/v1/models", {{"Authorization", "Bearer key-carol"}})->status, 401);
  fs::remove_all(dir);
  ServeProcess e({}, {{"WM_SERVE_API_KEY", "from-env"}});
  ASSERT_GT(e.port(), 0) << e.err();
  auto ce = e.client();
  EXPECT_EQ(ce.Get("/v1/models")->status, 401);
  EXPECT_EQ(ce.Get("/v1/models", {{"Authorization", "Bearer from-env"}})->status, 200);
}

// SIGHUP drains as SIGTERM does; limits that contradict each other are refused at the start.
TEST(Serve, SighupDrainsAndContradictoryLimitsAreRefused) {
  SKIP_WITHOUT_SERVE();
  {
    ServeProcess s({});
    ASSERT_GT(s.port(), 0) << s.err();
    EXPECT_EQ(s.client().Post("/v1/completions", R"({"model":"tiny-llm","prompt":"rode","max_tokens":2})",
                              "application/json")->status, 200);
    s.proc().signal(SIGHUP);
    const RunResult r = s.proc().wait(30);
    EXPECT_TRUE(r.exited && r.code == 0) << "signal " << r.signal << " " << r.err;
    EXPECT_NE(r.err.find("stopping"), std::string::npos) << r.err;
  }
  const fs::path dir = make_temp_dir("wm_serve_limits_");
  const RunResult bad = run_program({program_path("wm_serve"), "--port", "0", "--default-max-tokens", "300",
                                     "--max-tokens-limit", "100"},
                                    dir, fs::path(WM_SOURCE_DIR), 60);
  EXPECT_TRUE(bad.exited && bad.code == 1) << bad.err;
  EXPECT_NE(bad.err.find("--default-max-tokens"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}

// A disk that takes no more (the file-size limit of prlimit: writes fail as on a full disk): every
// answer says its session was not saved (X-Session-Saved: false), and --max-sessions holds.
TEST(Serve, FailedSavesAreVisibleAndMemoryStaysBounded) {
  SKIP_WITHOUT_SERVE();
  if (!fs::exists("/usr/bin/prlimit")) GTEST_SKIP() << "no /usr/bin/prlimit (util-linux)";
  const fs::path root = make_temp_dir("wm_serve_full_");
  const fs::path state = root / "state";  // made by the server
  ServeProcess s({"--state-dir", state.string(), "--max-sessions", "2"}, {}, {"/usr/bin/prlimit", "--fsize=4096"});
  ASSERT_GT(s.port(), 0) << s.err();
  auto c = s.client();
  int unsaved = 0;
  for (int i = 0; i < 12; ++i) {
    auto r = c.Post("/v1/chat/completions", {{"X-Session-Id", "full" + std::to_string(i)}},
                    chat_body({{"user", repeat("Recall fada: 3117. ", 20)}}, 4), "application/json");
    ASSERT_TRUE(r) << s.err();
    EXPECT_EQ(r->status, 200) << r->body;
    unsaved += r->get_header_value("X-Session-Saved") == "false" && json::parse(r->body)["session_saved"] == false;
  }
  EXPECT_EQ(unsaved, 12);
  const std::string h = s.client().Get("/metrics")->body;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(h, m, std::regex("\nwm_serve_sessions_in_memory (\\d+)")));
  EXPECT_LE(std::stoi(m[1]), 2) << "sessions whose saves failed stayed in memory beyond --max-sessions";
  fs::remove_all(root);
}

// A retried request (same Idempotency-Key) is answered again, not fed into the session twice.
TEST(Serve, IdempotencyKeyRetryIsNotFedTwice) {
  SKIP_WITHOUT_SERVE();
  ServeProcess s({});
  ASSERT_GT(s.port(), 0) << s.err();
  auto c = s.client();
  const httplib::Headers h = {{"X-Session-Id", "retry"}, {"Idempotency-Key", "req-0001"}};
  const std::string body = chat_body({{"user", "Recall fada: 3117."}}, 6);
  auto a = c.Post("/v1/chat/completions", h, body, "application/json");
  auto b = c.Post("/v1/chat/completions", h, body, "application/json");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->status, 200);
  ASSERT_EQ(b->status, 200);
  EXPECT_EQ(b->get_header_value("Idempotency-Replayed"), "true");
  EXPECT_EQ(json::parse(a->body)["choices"], json::parse(b->body)["choices"]);
  EXPECT_NE(json::parse(a->body)["id"], json::parse(b->body)["id"]);
  EXPECT_EQ(json::parse(c.Get("/v1/sessions/retry")->body)["turns"], 1);
  auto bad = c.Post("/v1/chat/completions", {{"X-Session-Id", "retry"}, {"Idempotency-Key", std::string(300, 'k')}},
                    body, "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
}

// A crafted index.json naming a path outside the state folder: the server starts, and the file
// outside is untouched. A second server on the same folder is refused while the first runs.
TEST(Serve, StateFolderTouchesNothingOutsideAndTakesALock) {
  SKIP_WITHOUT_SERVE();
  const fs::path root = make_temp_dir("wm_serve_crafted_");
  const fs::path state = root / "a" / "b" / "state";
  fs::create_directories(state);
  const fs::path sentinel = root / "sentinel";
  {
    std::ofstream f(sentinel);
    f << "not the server's";
  }
  {
    std::ofstream f(state / "index.json");
    f << R"({"version":1,"sessions":{"x":"../../../sentinel","y":"/etc/hostname"}})";
  }
  ServeProcess s({"--state-dir", state.string()});
  ASSERT_GT(s.port(), 0) << s.err();
  EXPECT_TRUE(fs::exists(sentinel)) << "a file outside the state folder was removed";
  EXPECT_EQ(read_text(sentinel), "not the server's");
  const RunResult second = run_program({program_path("wm_serve"), "--port", "0", "--state-dir", state.string()},
                                       root, fs::path(WM_SOURCE_DIR), 60);
  EXPECT_TRUE(second.exited && second.code == 1) << second.out << second.err;
  EXPECT_NE(second.err.find(state.string()), std::string::npos) << second.err;
  s.proc().signal(SIGTERM);
  s.proc().wait(30);
  EXPECT_TRUE(fs::exists(sentinel));
  fs::remove_all(root);
}

}  // namespace
}  // namespace wm::testing

#else
TEST(Serve, NeedsCppHttplib) { GTEST_SKIP() << "built without cpp-httplib (libcpp-httplib-dev): no wm_serve"; }
#endif
