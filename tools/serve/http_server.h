#pragma once
// HttpServer: cpp-httplib's Server with the transport hardened for a server on an open port.
// The connection loop is its own (process_and_close_socket): it reads each request whole, the
// request line, headers and body, bounded in bytes and within one deadline, before httplib parses
// it from memory; bytes past the request (a pipelined next one) wait in the connection's buffer.
//   - every body is bounded, Content-Length or chunked (413 and the connection closed);
//   - the whole request must arrive within request_deadline_s (408 and closed), so a client that
//     sends a header line every few seconds holds a thread for that long at most;
//   - when every connection thread is busy a new one starts (up to overflow_threads), so short
//     requests (/health) are answered while slow clients are read; an idle keep-alive connection
//     gives its thread back when connections wait for one;
//   - TCP_NODELAY on every accepted socket (httplib 0.11.4 sets it on the listening socket only,
//     and only when asked): a keep-alive response is not held back by Nagle + delayed ACK;
//   - headers bounded in bytes and count (431); a NUL, CR or LF in a header value, raw or
//     percent-encoded (httplib decodes %XX in header values), is refused with 400;
//   - error responses with an empty body get one from the ErrorWriter (404, 413, 400, ...);
//   - stream(): chunked for HTTP/1.1, close-delimited for HTTP/1.0; a provider that throws ends
//     the stream (the connection closed) and nothing escapes to the thread.
// stop() (httplib's) returns within about 50 ms of the handlers under way finishing, whatever the
// clients connected are doing.
#include <httplib.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace wm::serve {

struct HttpLimits {
  size_t max_header_bytes = 64 << 10;  // request line + headers of one request (431 beyond)
  size_t max_header_count = 100;       // header lines of one request (431 beyond)
  size_t max_body_bytes = 1 << 20;     // a body, Content-Length or chunked (413 beyond)
  double request_deadline_s = 10;      // the whole request (line, headers, body) must arrive within this
  double keep_alive_s = 5;             // idle wait for the next request on a connection
  size_t keep_alive_max = 1000;        // requests per connection
  int threads = 32;                    // connection threads
  int overflow_threads = 64;           // more threads started when all are busy (so /health is answered)
  double write_timeout_s = 30;         // a write that cannot proceed for this long ends the connection
};

// What the server has seen since it started; for /metrics.
struct HttpCounters {
  int64_t connections_total = 0;     // connections accepted
  int64_t connections_now = 0;       // connections open now
  int64_t requests_total = 0;        // requests read whole and handed to httplib
  int64_t deadline_cut_total = 0;    // requests not whole within request_deadline_s (408, closed)
  int64_t bodies_refused_total = 0;  // bodies beyond max_body_bytes (413, closed)
  int64_t headers_refused_total = 0; // header sections beyond max_header_bytes / max_header_count (431)
  int64_t bad_requests_total = 0;    // malformed requests refused by the transport (400, 501)
  int64_t exceptions_total = 0;      // exceptions caught from handlers and content providers
  int64_t overflow_threads_started_total = 0;  // threads started beyond HttpLimits::threads
  int64_t overflow_threads_now = 0;            // of those, running now
  int64_t keep_alive_yielded_total = 0;  // idle keep-alive connections closed for waiting ones
  int64_t bytes_received_total = 0;      // bytes read from clients
};

class HttpServer : public httplib::Server {
 public:
  // Fills an error response: status, body and Content-Type (e.g. OpenAI's {"error": {...}}).
  using ErrorWriter = std::function<void(httplib::Response&, int status, const std::string& message)>;
  using BodyHandler = std::function<void(const httplib::Request&, httplib::Response&, const std::string& body)>;

  // Throws std::invalid_argument for limits out of range (a zero size, threads < 1, deadlines <= 0)
  // or an empty error_writer. Installs an error handler (fills empty error bodies through
  // error_writer) and an exception handler (500 through error_writer); set_error_handler /
  // set_exception_handler replace them.
  HttpServer(HttpLimits limits, ErrorWriter error_writer);
  ~HttpServer() override;

  // POST route whose body was read by the connection loop, bounded and within the deadline: the
  // handler gets it whole. Too large: 413, deadline passed: 408, malformed chunked body: 400, each
  // through error_writer with Connection: close, before the handler runs. An exception from the
  // handler becomes error_writer(500, what).
  void post_body(const std::string& pattern, BodyHandler handler);

  // A streamed response (server-sent events): chunked for HTTP/1.1, close-delimited (no
  // Transfer-Encoding, Connection: close) for HTTP/1.0. An exception from provider or releaser is
  // caught: the stream ends where it is and the connection is closed. Works on a plain
  // httplib::Server too (without the close after an HTTP/1.0 keep-alive request).
  static void stream(const httplib::Request& req, httplib::Response& res, const std::string& content_type,
                     httplib::ContentProviderWithoutLength provider, httplib::ContentProviderResourceReleaser releaser);

  const HttpLimits& limits() const { return limits_; }
  HttpCounters counters() const;
  // The counters in Prometheus' text format, each named prefix + "_" + field.
  std::string metrics_text(const std::string& prefix = "wm_serve_http") const;

  // Fills res through the error writer (used for the transport's own errors).
  void write_error(httplib::Response& res, int status, const std::string& message) const;

 private:
  class Connection;
  class Pool;
  friend class Connection;
  friend class Pool;

  bool process_and_close_socket(socket_t sock) override;
  bool stopping() const { return svr_sock_ == INVALID_SOCKET; }

  HttpLimits limits_;
  ErrorWriter error_writer_;
  std::atomic<Pool*> pool_{nullptr};  // the task queue of the listen under way

  struct AtomicCounters {
    std::atomic<int64_t> connections_total{0}, connections_now{0}, requests_total{0}, deadline_cut_total{0},
        bodies_refused_total{0}, headers_refused_total{0}, bad_requests_total{0}, exceptions_total{0},
        overflow_threads_started_total{0}, overflow_threads_now{0}, keep_alive_yielded_total{0},
        bytes_received_total{0};
  };
  mutable AtomicCounters c_;
};

}  // namespace wm::serve
