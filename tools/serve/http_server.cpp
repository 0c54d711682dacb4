#include "tools/serve/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace wm::serve {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSliceMs = 50;              // the longest wait before looking at stop() again
constexpr size_t kLineMax = 8192;         // httplib's CPPHTTPLIB_HEADER_MAX_LENGTH and URI limit
constexpr size_t kChunkLineMax = 1024;    // a chunk-size line with its extensions
constexpr size_t kRecvSize = 16 << 10;    // one recv
constexpr double kLingerS = 0.5;          // reading what a refused client still sends before closing
constexpr size_t kLingerBytes = 4 << 20;  // at most this much of it

// A request the transport refuses: the status and the message for the error writer.
struct Refusal {
  int status;
  std::string message;
};

// What a route wrapper or stream() on this thread may tell the connection loop.
struct ConnState {
  bool close_after = false;                  // a close-delimited response: close when it ends
  std::atomic<int64_t>* exceptions = nullptr;  // the server's exception counter
};
thread_local ConnState* t_state = nullptr;

const char* reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return status < 500 ? "Bad Request" : "Internal Server Error";
  }
}

// The message an empty error response gets.
std::string default_message(int status) {
  switch (status) {
    case 400: return "the request is malformed";
    case 404: return "no such route";
    case 405: return "method not allowed";
    case 408: return "the request did not arrive in time";
    case 413: return "the request body is too large";
    case 414: return "the request line is too long";
    case 415: return "unsupported content encoding";
    case 416: return "range not satisfiable";
    case 431: return "the request headers are too large";
    default: return status < 500 ? std::string("the request was refused") : std::string("internal server error");
  }
}

bool is_tchar(unsigned char c) {
  return std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

bool iequals(const std::string& a, const char* b) {
  const size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::string trim_ows(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

// Empties a response for an error answer; a releaser already set is told the content failed.
void reset_response(httplib::Response& res) {
  if (res.content_provider_resource_releaser_) {
    auto releaser = std::move(res.content_provider_resource_releaser_);
    res.content_provider_resource_releaser_ = nullptr;
    try {
      releaser(false);
    } catch (...) {
    }
  }
  res = httplib::Response();
}

int ms_until(Clock::time_point t) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// The request line and header lines of a head, as read_request uses them.
struct RequestHead {
  std::string head;                         // the request line and the headers passed on, CRLF-ended
  std::string version;                      // "HTTP/1.1" or "HTTP/1.0"
  std::vector<std::string> lengths;         // every Content-Length value
  std::vector<std::string> codings;         // every Transfer-Encoding value
  std::string connection;                   // the Connection headers' options, comma-separated
  bool expect_continue = false;             // "Expect: 100-continue"
};

// The lines [begin, end) (without CRLF) of the head in[0, head_end), which ends in a blank line.
// Throws Refusal 400 for a NUL, a bare CR or LF, or another control character.
std::vector<std::pair<size_t, size_t>> head_lines(const std::string& in, size_t head_end) {
  std::vector<std::pair<size_t, size_t>> lines;
  for (size_t b = 0; b < head_end - 2;) {
    const size_t e = in.find("\r\n", b);
    lines.emplace_back(b, e);
    b = e + 2;
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    for (size_t k = lines[i].first; k < lines[i].second; ++k) {
      const unsigned char c = static_cast<unsigned char>(in[k]);
      if ((c < 0x20 && c != '\t') || c == 0x7f)
        throw Refusal{400, i == 0 ? std::string("a control character in the request line")
                                  : "a control character (NUL, CR, LF, ...) in header line " + std::to_string(i)};
    }
  }
  return lines;
}

// Checks the request line (method, target, version); returns its version. Throws Refusal.
std::string request_version(const std::string& request_line) {
  if (request_line.size() > kLineMax) throw Refusal{414, "the request line is too long"};
  const size_t sp1 = request_line.find(' '), sp2 = request_line.rfind(' ');
  if (sp1 == std::string::npos || sp1 == sp2 || request_line.find(' ', sp1 + 1) != sp2)
    throw Refusal{400, "a malformed request line"};
  std::string version = request_line.substr(sp2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") throw Refusal{400, "unsupported HTTP version"};
  return version;
}

// Files one header line into out: the framing, Expect and Connection headers apart, the others
// appended to out.head. Throws Refusal for a malformed line.
void add_header(const std::string& l, RequestHead& out) {
  if (l.size() > kLineMax) throw Refusal{431, "a header line exceeds " + std::to_string(kLineMax) + " bytes"};
  if (l[0] == ' ' || l[0] == '\t') throw Refusal{400, "obsolete header line folding"};
  const size_t colon = l.find(':');
  if (colon == std::string::npos || colon == 0) throw Refusal{400, "a header line without a name"};
  const std::string name = l.substr(0, colon);
  for (char c : name)
    if (!is_tchar(static_cast<unsigned char>(c))) throw Refusal{400, "a malformed header name"};
  const std::string value = trim_ows(l.substr(colon + 1));
  if (iequals(name, "Content-Length"))
    out.lengths.push_back(value);
  else if (iequals(name, "Transfer-Encoding"))
    out.codings.push_back(value);
  else if (iequals(name, "Expect"))
    out.expect_continue = iequals(value, "100-continue");
  else if (iequals(name, "Connection"))
    out.connection += "," + value;
  else
    out.head += l + "\r\n";
}

// Parses the head in[0, head_end) (it ends in a blank line). Throws Refusal.
RequestHead parse_head(const std::string& in, size_t head_end, const HttpLimits& lim) {
  const std::vector<std::pair<size_t, size_t>> lines = head_lines(in, head_end);
  auto line = [&](size_t i) { return in.substr(lines[i].first, lines[i].second - lines[i].first); };
  RequestHead out;
  const std::string request_line = line(0);
  out.version = request_version(request_line);
  if (lines.size() - 1 > lim.max_header_count)
    throw Refusal{431, "more than " + std::to_string(lim.max_header_count) + " header lines"};
  out.head = request_line + "\r\n";
  for (size_t i = 1; i < lines.size(); ++i) add_header(line(i), out);
  return out;
}

// Whether the connection stays open after this request: HTTP/1.1 keeps it unless told "close";
// HTTP/1.0 closes it unless told "keep-alive". Adds the Connection header, in the words httplib
// compares (whole and case-sensitively), to h.head.
bool keep_alive_after(RequestHead& h) {
  bool has_close = false, has_keep_alive = false;
  for (size_t b = 0; b < h.connection.size();) {
    size_t e = h.connection.find(',', b);
    if (e == std::string::npos) e = h.connection.size();
    const std::string option = trim_ows(h.connection.substr(b, e - b));
    has_close = has_close || iequals(option, "close");
    has_keep_alive = has_keep_alive || iequals(option, "keep-alive");
    b = e + 1;
  }
  if (has_close)
    h.head += "Connection: close\r\n";
  else if (h.version == "HTTP/1.0" && has_keep_alive)
    h.head += "Connection: Keep-Alive\r\n";
  return !has_close && (h.version == "HTTP/1.1" || has_keep_alive);
}

// How the body is framed: chunked, or `length` bytes (0 without either header).
struct BodyFraming {
  bool chunked = false;
  uint64_t length = 0;
};

// The body's framing from the Transfer-Encoding and Content-Length headers. Throws Refusal 501
// for a transfer coding other than chunked, 400 for both headers or a malformed length, 413 for
// a length over max_body_bytes.
BodyFraming body_framing(const RequestHead& h, const HttpLimits& lim) {
  BodyFraming f;
  if (!h.codings.empty()) {
    if (h.codings.size() != 1 || !iequals(h.codings[0], "chunked"))
      throw Refusal{501, "only the chunked transfer coding is understood"};
    if (!h.lengths.empty()) throw Refusal{400, "both Content-Length and Transfer-Encoding"};
    f.chunked = true;
  } else if (!h.lengths.empty()) {
    for (const auto& v : h.lengths) {
      if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos || v != h.lengths[0])
        throw Refusal{400, "a malformed Content-Length"};
    }
    f.length = std::stoull(h.lengths[0]);
    if (f.length > lim.max_body_bytes)
      throw Refusal{413, "the request body exceeds " + std::to_string(lim.max_body_bytes) + " bytes"};
  }
  return f;
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

// The task queue: `threads` workers, and an overflow thread started for a connection that would
// otherwise wait because every worker is busy (up to overflow_threads at once). An overflow
// thread serves what is queued when its connection ends, then exits.
class HttpServer::Pool final : public httplib::TaskQueue {
 public:
  // The workers count as idle from the start (not from when each first waits), so that the
  // first connections start no overflow thread.
  explicit Pool(HttpServer& s) : s_(s), idle_(static_cast<size_t>(s.limits_.threads)) {
    for (int i = 0; i < s_.limits_.threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Pool() override {
    Pool* self = this;
    s_.pool_.compare_exchange_strong(self, nullptr);
  }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lk(mu_);
    reap();
    if (jobs_.size() >= idle_ && overflow_live_ < static_cast<size_t>(s_.limits_.overflow_threads)) {
      auto done = std::make_shared<std::atomic<bool>>(false);
      ++overflow_live_;
      ++s_.c_.overflow_threads_started_total;
      ++s_.c_.overflow_threads_now;
      overflow_.push_back({std::thread([this, done, f = std::move(fn)]() mutable { overflow(std::move(f), *done); }),
                           done});
      return;
    }
    jobs_.push_back(std::move(fn));
    waiting_ = jobs_.size() > idle_;
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    std::list<Overflow> rest;
    {
      std::lock_guard<std::mutex> lk(mu_);
      rest.swap(overflow_);
    }
    for (auto& o : rest) o.thread.join();
  }

  // Whether connections wait for a thread (an idle keep-alive connection then gives its up).
  bool has_waiting() const { return waiting_; }

 private:
  struct Overflow {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  static void run(std::function<void()>& fn) {
    try {
      fn();
    } catch (...) {
    }
  }

  void work() {
    for (bool first = true;; first = false) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (!first) ++idle_;
        waiting_ = jobs_.size() > idle_;
        cv_.wait(lk, [&] { return !jobs_.empty() || shutdown_; });
        --idle_;
        if (jobs_.empty()) return;  // shut down
        fn = std::move(jobs_.front());
        jobs_.pop_front();
        waiting_ = jobs_.size() > idle_;
      }
      run(fn);
    }
  }

  void overflow(std::function<void()> fn, std::atomic<bool>& done) {
    for (;;) {
      run(fn);
      std::lock_guard<std::mutex> lk(mu_);
      if (jobs_.empty()) {
        --overflow_live_;
        --s_.c_.overflow_threads_now;
        done = true;
        return;
      }
      fn = std::move(jobs_.front());
      jobs_.pop_front();
      waiting_ = jobs_.size() > idle_;
    }
  }

  // Joins the overflow threads that have ended (under mu_; they no longer need it).
  void reap() {
    for (auto it = overflow_.begin(); it != overflow_.end();) {
      if (*it->done) {
        it->thread.join();
        it = overflow_.erase(it);
      } else {
        ++it;
      }
    }
  }

  HttpServer& s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> workers_;
  std::list<Overflow> overflow_;
  size_t idle_, overflow_live_ = 0;  // workers waiting for a job; overflow threads running
  bool shutdown_ = false;
  std::atomic<bool> waiting_{false};
};

// One connection: the keep-alive loop and the stream httplib reads the request from and writes
// the response to. Bytes from the socket land in in_; the request at its front is read whole
// (read_request), rewritten with a Content-Length and handed to httplib from replay_; what follows
// it (a pipelined request) stays in in_ for the next turn.
class HttpServer::Connection final : public httplib::Stream {
 public:
  Connection(HttpServer& s, socket_t sock) : s_(s), sock_(sock) { state_.exceptions = &s_.c_.exceptions_total; }

  bool is_readable() const override { return replay_off_ < replay_.size(); }

  bool is_writable() const override {
    if (!peer_alive()) return false;
    return wait_writable();
  }

  // Reads from the current request only; 0 at its end.
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, replay_.size() - replay_off_);
    std::memcpy(ptr, replay_.data() + replay_off_, n);
    replay_off_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    for (;;) {
      const ssize_t n = ::send(sock_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) {
        written_ += static_cast<size_t>(n);
        return n;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (!wait_writable()) return -1;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
  socket_t socket() const override { return sock_; }

  // Serves requests until the client leaves, a request is refused, keep_alive_max is reached,
  // the idle wait ends or the server stops.
  void serve() {
    ConnState* outer = t_state;
    t_state = &state_;
    size_t served = 0;
    while (!s_.stopping()) {
      if (!wait_request(served)) break;
      bool whole = false;
      try {
        whole = read_request(Clock::now() + seconds(s_.limits_.request_deadline_s));
      } catch (const Refusal& r) {
        refuse(r);
        break;
      }
      if (!whole) break;
      ++served;
      ++s_.c_.requests_total;
      const bool close = !keep_alive_ || served >= s_.limits_.keep_alive_max || s_.stopping();
      bool closed = false, ok = false;
      state_.close_after = false;
      written_ = 0;
      try {
        ok = s_.process_request(*this, close, closed, check_header_values);
      } catch (const Refusal& r) {
        refuse(r);
        break;
      } catch (...) {
        ++s_.c_.exceptions_total;
        if (written_ == 0) send_error(500, "internal server error");
        break;
      }
      replay_.clear();
      replay_off_ = 0;
      if (!ok || closed || close || state_.close_after) break;
    }
    t_state = outer;
  }

 private:
  enum class Fill { Data, Eof, Timeout, Stop };

  // httplib's setup_request: refuses a header value that decoding (%XX) made hold a NUL, CR or LF.
  static void check_header_values(httplib::Request& req) {
    for (const auto& h : req.headers)
      if (h.second.find_first_of(std::string("\0\r\n", 3)) != std::string::npos)
        throw Refusal{400, "header '" + h.first + "' holds a NUL, CR or LF"};
  }

  void refuse(const Refusal& r) {
    switch (r.status) {
      case 408: ++s_.c_.deadline_cut_total; break;
      case 413: ++s_.c_.bodies_refused_total; break;
      case 431: ++s_.c_.headers_refused_total; break;
      default: ++s_.c_.bad_requests_total; break;
    }
    send_error(r.status, r.message);
    linger();
  }

  // Writes error_writer's response with Content-Length and Connection: close.
  void send_error(int status, const std::string& message) {
    httplib::Response res;
    try {
      s_.write_error(res, status, message);
    } catch (...) {
      ++s_.c_.exceptions_total;
      res = httplib::Response();
      res.status = status;
      res.set_content(message, "text/plain");
    }
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
    for (const auto& h : res.headers) {
      if (iequals(h.first, "Content-Length") || iequals(h.first, "Connection") ||
          iequals(h.first, "Transfer-Encoding") || iequals(h.first, "Keep-Alive"))
        continue;
      if ((h.first + h.second).find_first_of(std::string("\0\r\n", 3)) != std::string::npos) continue;
      out += h.first + ": " + h.second + "\r\n";
    }
    out += "Content-Length: " + std::to_string(res.body.size()) + "\r\nConnection: close\r\n\r\n";
    out += res.body;
    write_all(out.data(), out.size());
  }

  void write_all(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = write(p, n);
      if (w <= 0) return;
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  // Before closing on a refusal: stop sending, read (and drop) what the client still sends for a
  // moment, so that the close does not reset the connection before the client reads the answer.
  void linger() {
    ::shutdown(sock_, SHUT_WR);
    const auto until = Clock::now() + seconds(kLingerS);
    size_t dropped = 0;
    char buf[kRecvSize];
    while (dropped < kLingerBytes && !s_.stopping()) {
      pollfd p{sock_, POLLIN, 0};
      const int left = ms_until(until);
      if (left == 0) break;
      const int r = ::poll(&p, 1, std::min(left, kSliceMs));
      if (r < 0 && errno != EINTR) break;
      if (r <= 0) continue;
      const ssize_t n = ::recv(sock_, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
      if (n > 0) dropped += static_cast<size_t>(n);
    }
  }

  bool peer_alive() const {
    char c;
    const ssize_t n = ::recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return true;
    if (n == 0) return false;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }

  // Waits until the socket takes more bytes: false after write_timeout_s, on an error, or when
  // the server stops while it waits.
  bool wait_writable() const {
    const auto until = Clock::now() + seconds(s_.limits_.write_timeout_s);
    for (;;) {
      pollfd p{sock_, POLLOUT, 0};
      const int r = ::poll(&p, 1, std::min(ms_until(until), kSliceMs));
      if (r > 0) return (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
      if (r < 0 && errno != EINTR) return false;
      if (s_.stopping() || Clock::now() >= until) return false;
    }
  }

  void address(bool remote, std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    ip.clear();
    port = 0;
    const int r = remote ? ::getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &len)
                         : ::getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &len);
    if (r != 0) return;
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
      if (::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf)) ip = buf;
      port = ntohs(v4->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
      if (::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf)) ip = buf;
      port = ntohs(v6->sin6_port);
    }
  }

  // The idle wait for the next request: true when bytes are buffered or arrive; false after
  // keep_alive_s, when the server stops, or (after a first request) when other connections wait
  // for a thread.
  bool wait_request(size_t served) {
    if (!in_.empty()) return true;
    const auto until = Clock::now() + seconds(s_.limits_.keep_alive_s);
    for (;;) {
      if (s_.stopping()) return false;
      if (served > 0) {
        Pool* pool = s_.pool_.load();
        if (pool && pool->has_waiting()) {
          ++s_.c_.keep_alive_yielded_total;
          return false;
        }
      }
      const int left = ms_until(until);
      if (left == 0) return false;
      pollfd p{sock_, POLLIN, 0};
      const int r = ::poll(&p, 1, std::min(left, kSliceMs));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) return false;
    }
  }

  // Reads more bytes into in_ before the deadline.
  Fill fill(Clock::time_point deadline) {
    for (;;) {
      if (s_.stopping()) return Fill::Stop;
      const int left = ms_until(deadline);
      if (left == 0) return Fill::Timeout;
      pollfd p{sock_, POLLIN, 0};
      const int r = ::poll(&p, 1, std::min(left, kSliceMs));
      if (r < 0 && errno != EINTR) return Fill::Eof;
      if (r <= 0) continue;
      const size_t old = in_.size();
      in_.resize(old + kRecvSize);
      const ssize_t n = ::recv(sock_, &in_[old], kRecvSize, MSG_DONTWAIT);
      in_.resize(old + static_cast<size_t>(std::max<ssize_t>(n, 0)));
      if (n > 0) {
        s_.c_.bytes_received_total += n;
        return Fill::Data;
      }
      if (n == 0) return Fill::Eof;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Fill::Eof;
    }
  }

  // fill() for a request under way: throws 408 at the deadline; false when the client left or
  // the server stops.
  bool more(Clock::time_point deadline) {
    switch (fill(deadline)) {
      case Fill::Data: return true;
      case Fill::Timeout:
        throw Refusal{408, "the request did not arrive within " + std::to_string(s_.limits_.request_deadline_s) + " s"};
      default: return false;
    }
  }

  // Reads until in_ holds a whole head (up to the blank line); head_end becomes the offset past
  // it. Empty lines before the request line are dropped. False when the client left (or the
  // server stopped) first; throws Refusal 431 past max_header_bytes.
  bool read_head(Clock::time_point deadline, size_t& head_end) {
    const HttpLimits& lim = s_.limits_;
    size_t scan = 0;
    for (;;) {
      size_t skip = 0;
      while (in_.size() - skip >= 2 && in_[skip] == '\r' && in_[skip + 1] == '\n') skip += 2;
      if (skip > 0) {
        in_.erase(0, skip);
        scan = 0;
      }
      const size_t pos = in_.find("\r\n\r\n", scan);
      if (pos != std::string::npos) {
        head_end = pos + 4;
        break;
      }
      if (in_.size() > lim.max_header_bytes)
        throw Refusal{431, "the request line and headers exceed " + std::to_string(lim.max_header_bytes) + " bytes"};
      scan = in_.size() >= 3 ? in_.size() - 3 : 0;
      if (!more(deadline)) return false;
    }
    if (head_end > lim.max_header_bytes)
      throw Refusal{431, "the request line and headers exceed " + std::to_string(lim.max_header_bytes) + " bytes"};
    return true;
  }

  // Reads the body that starts at in_[head_end], framed by f, into body; `end` becomes the
  // offset past it. False when the client left (or the server stopped) first.
  bool read_body(Clock::time_point deadline, size_t head_end, const BodyFraming& f, std::string& body, size_t& end) {
    if (f.chunked) return read_chunked(deadline, head_end, body, end);
    while (in_.size() - head_end < f.length)
      if (!more(deadline)) return false;
    body.assign(in_, head_end, static_cast<size_t>(f.length));
    end = head_end + static_cast<size_t>(f.length);
    return true;
  }

  // Reads the request at the front of in_ whole into replay_, its body framed by Content-Length;
  // in_ keeps what follows it.
  // False when the client left (or the server stopped) before it was whole; throws Refusal.
  bool read_request(Clock::time_point deadline) {
    size_t head_end = 0;
    if (!read_head(deadline, head_end)) return false;
    RequestHead h = parse_head(in_, head_end, s_.limits_);
    keep_alive_ = keep_alive_after(h);
    const BodyFraming framing = body_framing(h, s_.limits_);
    if (h.expect_continue && (framing.chunked || framing.length > 0) && in_.size() == head_end) {
      static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      write_all(kContinue, sizeof kContinue - 1);
    }
    std::string body;
    size_t end = head_end;
    if (!read_body(deadline, head_end, framing, body, end)) return false;
    if (framing.chunked || !h.lengths.empty()) h.head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    h.head += "\r\n";
    replay_ = std::move(h.head);
    replay_ += body;
    replay_off_ = 0;
    // Keep what follows (a pipelined request).
    in_.erase(0, end);
    return true;
  }

  // Decodes a chunked body starting at in_[pos] into body; `end` becomes the offset past its
  // trailers. The decoded size is bounded by max_body_bytes, the framing (sizes, extensions,
  // trailers) by max_header_bytes + max_body_bytes. Consumed framing stays in in_ until the
  // request ends, bounded by that same sum.
  bool read_chunked(Clock::time_point deadline, size_t pos, std::string& body, size_t& end) {
    const HttpLimits& lim = s_.limits_;
    const size_t start = pos;
    const size_t framing_max = lim.max_header_bytes + lim.max_body_bytes;
    auto next_line = [&](size_t max, std::string& out) -> bool {
      for (;;) {
        const size_t crlf = in_.find("\r\n", pos);
        if (crlf != std::string::npos && crlf - pos <= max) {
          out.assign(in_, pos, crlf - pos);
          pos = crlf + 2;
          return true;
        }
        if (in_.size() - pos > max) throw Refusal{400, "a malformed chunked body (a line too long)"};
        if (!more(deadline)) return false;
      }
    };
    std::string l;
    for (;;) {
      if (pos - start - body.size() > framing_max) throw Refusal{413, "the chunked body's framing is too large"};
      if (!next_line(kChunkLineMax, l)) return false;
      size_t digits = 0;
      uint64_t size = 0;
      while (digits < l.size() && std::isxdigit(static_cast<unsigned char>(l[digits]))) {
        if (digits == 15) throw Refusal{413, "a chunk size beyond any limit"};
        const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(l[digits])));
        size = size * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
        ++digits;
      }
      if (digits == 0) throw Refusal{400, "a malformed chunked body (no chunk size)"};
      size_t k = digits;
      while (k < l.size() && (l[k] == ' ' || l[k] == '\t')) ++k;
      if (k < l.size() && l[k] != ';') throw Refusal{400, "a malformed chunked body (a bad chunk-size line)"};
      for (char c : l)
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
          throw Refusal{400, "a malformed chunked body (a control character)"};
      if (size == 0) break;
      if (size > lim.max_body_bytes - body.size())
        throw Refusal{413, "the request body exceeds " + std::to_string(lim.max_body_bytes) + " bytes"};
      while (in_.size() - pos < size + 2)
        if (!more(deadline)) return false;
      if (in_.compare(pos + size, 2, "\r\n") != 0) throw Refusal{400, "a malformed chunked body (no CRLF after a chunk)"};
      body.append(in_, pos, static_cast<size_t>(size));
      pos += static_cast<size_t>(size) + 2;
    }
    // Trailers, up to the blank line; dropped.
    size_t trailer_bytes = 0;
    for (;;) {
      if (!next_line(kLineMax, l)) return false;
      if (l.empty()) break;
      trailer_bytes += l.size() + 2;
      if (trailer_bytes > lim.max_header_bytes) throw Refusal{431, "the chunked body's trailers are too large"};
      for (char c : l)
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
          throw Refusal{400, "a malformed chunked body (a control character in a trailer)"};
    }
    end = pos;
    return true;
  }

  HttpServer& s_;
  socket_t sock_;
  ConnState state_;
  std::string in_;  // bytes read from the socket, not yet consumed: the request at its front
  std::string replay_;  // the current request, as httplib reads it
  size_t replay_off_ = 0;
  size_t written_ = 0;  // bytes written for the current request
  bool keep_alive_ = true;  // the current request lets the connection serve another
};

HttpServer::HttpServer(HttpLimits limits, ErrorWriter error_writer)
    : limits_(limits), error_writer_(std::move(error_writer)) {
  if (!error_writer_) throw std::invalid_argument("HttpServer: an error writer is needed");
  if (limits_.max_header_bytes < 64 || limits_.max_header_count < 1 || limits_.max_body_bytes < 1 ||
      !(limits_.request_deadline_s > 0) || !(limits_.keep_alive_s >= 0) || limits_.keep_alive_max < 1 ||
      limits_.threads < 1 || limits_.overflow_threads < 0 || !(limits_.write_timeout_s > 0))
    throw std::invalid_argument("HttpServer: limits out of range");
  // What httplib itself reads of these: the Keep-Alive response header, the socket timeouts
  // listen_internal sets, and the Content-Length bound (the loop refuses larger bodies first).
  keep_alive_max_count_ = limits_.keep_alive_max;
  keep_alive_timeout_sec_ = static_cast<time_t>(limits_.keep_alive_s);
  read_timeout_sec_ = static_cast<time_t>(std::max(1.0, limits_.request_deadline_s));
  read_timeout_usec_ = 0;
  write_timeout_sec_ = static_cast<time_t>(std::max(1.0, limits_.write_timeout_s));
  write_timeout_usec_ = 0;
  payload_max_length_ = limits_.max_body_bytes;
  new_task_queue = [this] {
    auto* pool = new Pool(*this);
    pool_ = pool;
    return pool;
  };
  set_error_handler(HandlerWithResponse([this](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_) return HandlerResponse::Unhandled;
    const int status = res.status;
    write_error(res, status, default_message(status));
    return HandlerResponse::Handled;
  }));
  set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    ++c_.exceptions_total;
    std::string what = "internal server error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reset_response(res);
    write_error(res, 500, what);
  });
}

HttpServer::~HttpServer() = default;

void HttpServer::write_error(httplib::Response& res, int status, const std::string& message) const {
  res.status = status;
  res.body.clear();
  error_writer_(res, status, message);
  res.status = status;
}

void HttpServer::post_body(const std::string& pattern, BodyHandler handler) {
  Post(pattern, [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(req, res, req.body);
    } catch (const std::exception& e) {
      ++c_.exceptions_total;
      reset_response(res);
      write_error(res, 500, e.what());
    } catch (...) {
      ++c_.exceptions_total;
      reset_response(res);
      write_error(res, 500, "internal server error");
    }
  });
}

void HttpServer::stream(const httplib::Request& req, httplib::Response& res, const std::string& content_type,
                        httplib::ContentProviderWithoutLength provider,
                        httplib::ContentProviderResourceReleaser releaser) {
  auto count = [] {
    if (t_state && t_state->exceptions) ++*t_state->exceptions;
  };
  httplib::ContentProviderWithoutLength guarded = [provider = std::move(provider), count](size_t offset,
                                                                                          httplib::DataSink& sink) {
    try {
      return provider(offset, sink);
    } catch (...) {
      count();
      return false;  // httplib ends the response there; the loop closes the connection
    }
  };
  httplib::ContentProviderResourceReleaser guarded_releaser;
  if (releaser) {
    guarded_releaser = [releaser = std::move(releaser), count](bool success) {
      try {
        releaser(success);
      } catch (...) {
        count();
      }
    };
  }
  if (req.version == "HTTP/1.0") {
    // No chunked coding for HTTP/1.0: the body ends where the connection does. httplib writes
    // Connection: close itself when the connection was to close anyway (under HttpServer: the
    // request did not ask for Keep-Alive; on a plain server: it said close).
    const std::string connection = req.get_header_value("Connection");
    if (t_state ? connection == "Keep-Alive" : connection != "close") res.set_header("Connection", "close");
    res.set_content_provider(content_type, std::move(guarded), std::move(guarded_releaser));
    if (t_state) t_state->close_after = true;
  } else {
    res.set_chunked_content_provider(content_type, std::move(guarded), std::move(guarded_releaser));
  }
}

HttpCounters HttpServer::counters() const {
  HttpCounters c;
  c.connections_total = c_.connections_total;
  c.connections_now = c_.connections_now;
  c.requests_total = c_.requests_total;
  c.deadline_cut_total = c_.deadline_cut_total;
  c.bodies_refused_total = c_.bodies_refused_total;
  c.headers_refused_total = c_.headers_refused_total;
  c.bad_requests_total = c_.bad_requests_total;
  c.exceptions_total = c_.exceptions_total;
  c.overflow_threads_started_total = c_.overflow_threads_started_total;
  c.overflow_threads_now = c_.overflow_threads_now;
  c.keep_alive_yielded_total = c_.keep_alive_yielded_total;
  c.bytes_received_total = c_.bytes_received_total;
  return c;
}

std::string HttpServer::metrics_text(const std::string& prefix) const {
  const HttpCounters c = counters();
  std::string m;
  auto add = [&](const char* name, const char* type, const char* help, int64_t v) {
    const std::string full = prefix + "_" + name;
    m += "# HELP " + full + " " + help + "\n# TYPE " + full + " " + type + "\n" + full + " " + std::to_string(v) + "\n";
  };
  add("connections_total", "counter", "Connections accepted.", c.connections_total);
  add("connections", "gauge", "Connections open now.", c.connections_now);
  add("requests_total", "counter", "Requests read whole.", c.requests_total);
  add("deadline_cut_total", "counter", "Requests not whole within the request deadline (408).", c.deadline_cut_total);
  add("bodies_refused_total", "counter", "Request bodies beyond the limit (413).", c.bodies_refused_total);
  add("headers_refused_total", "counter", "Header sections beyond the limits (431).", c.headers_refused_total);
  add("bad_requests_total", "counter", "Malformed requests refused by the transport (400, 501).", c.bad_requests_total);
  add("exceptions_total", "counter", "Exceptions caught from handlers and content providers.", c.exceptions_total);
  add("overflow_threads_started_total", "counter", "Connection threads started beyond the pool (all were busy).",
      c.overflow_threads_started_total);
  add("overflow_threads", "gauge", "Overflow connection threads running now.", c.overflow_threads_now);
  add("keep_alive_yielded_total", "counter", "Idle keep-alive connections closed for connections waiting.",
      c.keep_alive_yielded_total);
  add("received_bytes_total", "counter", "Bytes read from clients.", c.bytes_received_total);
  return m;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  // httplib 0.11.4 sets TCP_NODELAY on the listening socket only (when asked): a response's
  // headers and body, written apart, would wait for the client's delayed ACK on a kept connection.
  int one = 1;
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ++c_.connections_total;
  ++c_.connections_now;
  try {
    Connection conn(*this, sock);
    conn.serve();
  } catch (...) {
    ++c_.exceptions_total;
  }
  --c_.connections_now;
  ::close(sock);
  return true;
}

}  // namespace wm::serve
