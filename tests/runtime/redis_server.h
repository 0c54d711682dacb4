#pragma once
// A real redis-server (Debian's) for the tests, in a temporary folder of its own: a Unix socket
// there (and, on request, a loopback port), no persistence, stopped at the end. Tests skip with a
// message when redis-server is not installed. It can be killed, paused (SIGSTOP: a store that
// answers nothing) and started again on the same socket, for the fault tests.
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace wm::testing {

class RedisServer {
 public:
  // redis-server's path, or empty when it is not installed.
  static std::string binary() {
    for (const char* d : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
      const std::string p = std::string(d) + "/redis-server";
      if (::access(p.c_str(), X_OK) == 0) return p;
    }
    return {};
  }

  // A folder under $TMPDIR; `tcp`: also listen on a free loopback port.
  explicit RedisServer(bool tcp = false) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "wm-redis-XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
    if (tcp) port_ = free_port();
  }
  ~RedisServer() {
    stop();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts it and waits until it answers PING (up to 10 s); false if it does not.
  bool start() {
    if (dir_.empty() || binary().empty()) return false;
    const std::string port = std::to_string(port_);
    std::vector<std::string> args = {binary(), "--port", port, "--bind", "127.0.0.1", "--unixsocket", socket(),
                                     "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", dir_,
                                     "--logfile", dir_ + "/redis.log", "--daemonize", "no"};
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (pid_ < 0) return false;
    for (int i = 0; i < 1000; ++i) {
      if (ping()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  // SIGTERM, then waits.
  void stop() { end(SIGTERM); }
  // SIGKILL, then waits: the store lost mid-run.
  void kill() { end(SIGKILL); }
  // SIGSTOP / SIGCONT: a store that accepts connections and answers nothing.
  void pause() {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  void resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }
  bool running() const { return pid_ > 0; }

  std::string dir() const { return dir_; }
  std::string socket() const { return dir_ + "/redis.sock"; }
  std::string url() const { return "unix://" + socket(); }
  std::string tcp_url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

  // One command from string arguments, through a fresh connection; the reply as text (integers in
  // decimal, nil as "(nil)", errors as "ERR ..."), or "(no connection)".
  std::string command(const std::vector<std::string>& args) const {
    struct timeval tv {2, 0};
    redisContext* c = redisConnectUnixWithTimeout(socket().c_str(), tv);
    if (c == nullptr || c->err) {
      if (c) redisFree(c);
      return "(no connection)";
    }
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) argv.push_back(a.data()), lens.push_back(a.size());
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    std::string out = "(no reply)";
    if (r != nullptr) {
      if (r->type == REDIS_REPLY_INTEGER) out = std::to_string(r->integer);
      else if (r->type == REDIS_REPLY_NIL) out = "(nil)";
      else if (r->type == REDIS_REPLY_ARRAY) out = std::to_string(r->elements);
      else out = std::string(r->str, r->len);
      freeReplyObject(r);
    }
    redisFree(c);
    return out;
  }
  bool ping() const { return command({"PING"}) == "PONG"; }
  // Every key matching a pattern (KEYS: fine for a test's few hundred keys).
  std::vector<std::string> keys(const std::string& pattern) const {
    std::vector<std::string> out;
    struct timeval tv {2, 0};
    redisContext* c = redisConnectUnixWithTimeout(socket().c_str(), tv);
    if (c == nullptr || c->err) {
      if (c) redisFree(c);
      return out;
    }
    auto* r = static_cast<redisReply*>(redisCommand(c, "KEYS %s", pattern.c_str()));
    if (r != nullptr && r->type == REDIS_REPLY_ARRAY)
      for (size_t i = 0; i < r->elements; ++i) out.emplace_back(r->element[i]->str, r->element[i]->len);
    if (r) freeReplyObject(r);
    redisFree(c);
    return out;
  }

 private:
  void end(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);  // a paused server cannot act on SIGTERM
    ::kill(pid_, sig);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  static int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
    ::close(fd);
    return port;
  }

  std::string dir_;
  int port_ = 0;  // 0: no TCP listener
  pid_t pid_ = -1;
};

}  // namespace wm::testing
