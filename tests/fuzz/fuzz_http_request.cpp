// libFuzzer target: wm_serve's request path, bytes as a client sends them. One HttpServer
// (tools/serve/http_server.h) listens on loopback for the whole run, with the completion routes
// parsing their bodies through tools/serve/openai_api.h as wm_serve does (headers, session id,
// bearer key, the JSON body); each input is written to a fresh connection, the write side shut,
// and the answer read to the end. A crash, a sanitizer report, an exception escaping a handler or
// a hang past libFuzzer's -timeout is a finding. No model: what is fuzzed is everything before it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "tools/serve/http_server.h"
#include "tools/serve/openai_api.h"
#include "tests/fuzz/fuzz_input.h"

namespace fuzz_http_request {

using wm::serve::ApiError;

void answer(const httplib::Request& req, httplib::Response& res, const std::string& body, bool chat) {
  try {
    const wm::serve::CompletionRequest r = wm::serve::parse_completion(body, chat, wm::serve::RequestLimits{});
    const std::string sid = wm::serve::choose_session(req.get_header_value("X-Session-Id"), r.session_id);
    const auto token = wm::serve::bearer_token(req.get_header_value("Authorization"));
    if (token) (void)wm::serve::match_key(*token, {"k1", "k2"});
    nlohmann::json out = {{"session", sid}, {"n", r.messages.size()}, {"prompt", r.prompt}, {"stop", r.stop}};
    if (r.stream) {
      const std::string text = wm::serve::sse_event(out) + wm::serve::sse_done();
      wm::serve::HttpServer::stream(
          req, res, "text/event-stream",
          [text](size_t, httplib::DataSink& sink) {
            sink.write(text.data(), text.size());
            sink.done();
            return true;
          },
          nullptr);
    } else {
      res.set_content(wm::serve::json_text(out), "application/json");
    }
  } catch (const ApiError& e) {
    res.status = e.status;
    res.set_content(wm::serve::error_body(e.status, e.what(), e.param, e.code), "application/json");
  }
}

struct Server {
  wm::serve::HttpServer svr;
  int port = 0;
  std::thread thread;
  static wm::serve::HttpLimits limits() {
    wm::serve::HttpLimits l;
    l.max_body_bytes = 1 << 16;
    l.request_deadline_s = 2;
    l.keep_alive_s = 0.2;
    l.threads = 2;
    l.overflow_threads = 4;
    return l;
  }
  Server()
      : svr(limits(), [](httplib::Response& res, int status, const std::string& message) {
          res.status = status;
          res.set_content(wm::serve::error_body(status, message), "application/json");
        }) {
    svr.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("{}", "application/json"); });
    svr.post_body("/v1/chat/completions", [](const httplib::Request& q, httplib::Response& s, const std::string& b) {
      answer(q, s, b, true);
    });
    svr.post_body("/v1/completions", [](const httplib::Request& q, httplib::Response& s, const std::string& b) {
      answer(q, s, b, false);
    });
    port = svr.bind_to_any_port("127.0.0.1");
    if (port <= 0) std::abort();
    thread = std::thread([this] { svr.listen_after_bind(); });
  }
};

Server& server() {
  static Server* s = new Server();  // lives for the run (libFuzzer exits without destructors)
  return *s;
}

WM_FUZZ_TARGET(http_request) {
  Server& s = server();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(s.port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return 0;
  }
  size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  // The answer, to the end (the server closes after an input it cannot read on, or at its idle
  // limit); bounded by the request deadline and the keep-alive wait.
  char buf[4096];
  for (int i = 0; i < 1000; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) break;
    if (::recv(fd, buf, sizeof buf, 0) <= 0) break;
  }
  ::close(fd);
  return 0;
}

}  // namespace fuzz_http_request
