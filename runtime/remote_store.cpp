#include "runtime/remote_store.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <set>
#include <string_view>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/hash.h"
#include "runtime/spill_file.h"

namespace wm {

namespace {

int parse_int(const std::string& s, const std::string& what, const std::string& url, int lo, int hi) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    throw Error(str_cat("kv store URL '", url, "': ", what, " '", s, "' is not a number"));
  const int v = std::atoi(s.c_str());
  if (v < lo || v > hi) throw Error(str_cat("kv store URL '", url, "': ", what, " ", v, " outside [", lo, ", ", hi, "]"));
  return v;
}

struct timeval to_timeval(std::chrono::steady_clock::duration d) {
  const auto us = std::max<int64_t>(1000, std::chrono::duration_cast<std::chrono::microseconds>(d).count());
  struct timeval tv;
  tv.tv_sec = static_cast<time_t>(us / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(us % 1000000);
  return tv;
}

// SIGPIPE blocked in this thread for its scope: a write to a connection the server has closed
// raises it, and its default action (or a program's cleanup handler) would end the process; the
// write fails with EPIPE instead. A SIGPIPE raised meanwhile is consumed before the old mask
// comes back (unless one was already pending).
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const struct timespec zero {0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// A reply owned for its scope.
struct Reply {
  redisReply* r = nullptr;
  ~Reply() {
    if (r != nullptr) freeReplyObject(r);
  }
};

// The next reply of a pipeline; false on an I/O error, with why set and timed_out when the
// deadline passed (or the socket timed out).
bool read_reply(redisContext* c, Reply& r, std::chrono::steady_clock::time_point deadline, bool& timed_out,
                std::string& why) {
  if (redisGetReply(c, reinterpret_cast<void**>(&r.r)) == REDIS_OK) return true;
  timed_out = std::chrono::steady_clock::now() >= deadline ||
              (c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK));
  why = c->errstr;
  return false;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Appends one command. The arguments are views, not copies (a value of half a megabyte is not
// copied before hiredis formats it into its buffer); temporaries among them live until the call
// returns.
template <class Range>
void append_range(redisContext* c, const Range& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& a : args) argv.push_back(a.data()), lens.push_back(a.size());
  redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
}
void append(redisContext* c, std::initializer_list<std::string_view> args) { append_range(c, args); }
void append(redisContext* c, const std::vector<std::string>& args) { append_range(c, args); }

}  // namespace

RemoteEndpoint parse_store_url(const std::string& url) {
  RemoteEndpoint ep;
  ep.url = url;
  const std::string redis = "redis://", unix_ = "unix://";
  if (url.compare(0, unix_.size(), unix_) == 0) {
    ep.unix_socket = true;
    std::string rest = url.substr(unix_.size());
    const size_t q = rest.find('?');
    if (q != std::string::npos) {
      const std::string query = rest.substr(q + 1);
      rest = rest.substr(0, q);
      if (query.compare(0, 3, "db=") != 0)
        throw Error(str_cat("kv store URL '", url, "': the only query a unix:// URL takes is ?db=N"));
      ep.db = parse_int(query.substr(3), "database", url, 0, 1 << 20);
    }
    if (rest.empty() || rest[0] != '/')
      throw Error(str_cat("kv store URL '", url, "': a unix:// URL names an absolute path (unix:///run/redis.sock)"));
    ep.path = rest;
    return ep;
  }
  if (url.compare(0, redis.size(), redis) != 0)
    throw Error(str_cat("kv store URL '", url, "': expected redis://HOST[:PORT][/DB] or unix:///PATH[?db=N]",
                        url.compare(0, 9, "rediss://") == 0 ? " (TLS is not supported)" : ""));
  std::string rest = url.substr(redis.size());
  if (rest.find('@') != std::string::npos)
    throw Error(str_cat("kv store URL '", url,
                        "': credentials do not go in the URL (the command line is visible to every user): set the "
                        "password in the environment variable WM_KV_STORE_PASSWORD"));
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    if (!db.empty()) ep.db = parse_int(db, "database", url, 0, 1 << 20);
    rest = rest.substr(0, slash);
  }
  if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) throw Error(str_cat("kv store URL '", url, "': unclosed '[' in the host"));
    ep.host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') throw Error(str_cat("kv store URL '", url, "': expected ':PORT' after the host"));
      ep.port = parse_int(rest.substr(1), "port", url, 1, 65535);
    }
  } else {
    const size_t colon = rest.find(':');
    ep.host = rest.substr(0, colon);
    if (colon != std::string::npos) ep.port = parse_int(rest.substr(colon + 1), "port", url, 1, 65535);
  }
  if (ep.host.empty()) throw Error(str_cat("kv store URL '", url, "': no host"));
  return ep;
}

void RemoteConfig::validate() const {
  parse_store_url(url);
  WM_CHECK(!ns.empty(), "the kv store needs a namespace (the model's identity)");
  WM_CHECK(ns.find_first_of(" \t\r\n") == std::string::npos, "the kv store's namespace '", ns, "' has whitespace");
  WM_CHECK(ttl_ms >= 0, "ttl_ms must be >= 0, got ", ttl_ms);
  WM_CHECK(budget > 0, "the kv store's budget must be positive");
  WM_CHECK(deadline_ms >= 1 && deadline_ms <= 600000, "deadline_ms must be in [1, 600000], got ", deadline_ms);
  WM_CHECK(backoff_min_ms >= 1 && backoff_max_ms >= backoff_min_ms, "backoff: need 1 <= min <= max, got ",
           backoff_min_ms, " and ", backoff_max_ms);
  WM_CHECK(flush_ms >= 0, "flush_ms must be >= 0, got ", flush_ms);
}

RemoteStore::RemoteStore(RemoteConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.validate();
  ep_ = parse_store_url(cfg_.url);
  if (!cfg_.password_env.empty())
    if (const char* p = std::getenv(cfg_.password_env.c_str())) password_ = p;
  prefix_ = str_cat("wm:", cfg_.ns, ":");
  // A first connection now, so that a store that is not there is reported at start.
  const auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.deadline_ms);
  if (redisContext* c = acquire(deadline)) release(c, false, false, "");
  writer_ = std::thread([this] { writer_loop(); });
}

RemoteStore::~RemoteStore() {
  flush(cfg_.flush_ms);
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    stop_ = true;
    if (!queue_.empty()) {
      std::lock_guard<std::mutex> s(stats_mu_);
      stats_.dropped += static_cast<int64_t>(queue_.size());
    }
    queue_.clear();
  }
  q_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  for (redisContext* c : idle_) redisFree(c);
}

void RemoteStore::report_bad(bool damaged, const std::string& msg) {
  // The first few one by one, then a count at 10, 100, 1000, ...: a store full of bad values
  // must not bury everything else on stderr.
  int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    n = ++(damaged ? bad_damaged_ : bad_foreign_);
  }
  if (n <= 3) return warn(msg);
  int64_t p = 10;
  while (p < n) p *= 10;
  if (n == p)
    warn(str_cat("kv store ", ep_.url, ": ", n, damaged ? " damaged values" : " values of another model or block",
                 " met so far, none used (each deleted; only the first 3 were named)"));
}

void RemoteStore::warn(const std::string& msg) const {
  if (cfg_.log) return cfg_.log(msg);
  std::fprintf(stderr, "wm: warning: %s\n", msg.c_str());
}

std::string RemoteStore::key_for_id(const std::string& id) const {
  return str_cat(prefix_, "i:", hex64(xxh64(id.data(), id.size())));
}

std::string RemoteStore::key_for_value(const std::string& value) const {
  return str_cat(prefix_, "c:", hex64(xxh64(value.data(), value.size())));
}

std::string RemoteStore::key_for(const std::string& kind, const std::string& name) const {
  return str_cat(prefix_, kind, ":", hex64(xxh64(name.data(), name.size())));
}

bool RemoteStore::put_value(const std::string& key, const std::string& value) {
  SigpipeGuard no_sigpipe;
  const auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.deadline_ms);
  redisContext* c = acquire(deadline);
  if (c == nullptr) return false;
  redisSetTimeout(c, to_timeval(deadline - Clock::now()));
  if (cfg_.ttl_ms > 0) append(c, {"SET", key, value, "PX", std::to_string(cfg_.ttl_ms)});
  else append(c, {"SET", key, value});
  Reply r;
  std::string why;
  const bool broken = redisGetReply(c, reinterpret_cast<void**>(&r.r)) != REDIS_OK;
  if (broken) why = c->errstr;
  else if (r.r->type == REDIS_REPLY_ERROR) why = std::string(r.r->str, r.r->len);
  release(c, broken, broken && Clock::now() >= deadline, why);
  if (!broken && !why.empty()) warn(str_cat("kv store ", ep_.url, ": a write was refused: ", why));
  return why.empty();
}

std::optional<std::string> RemoteStore::get_value(const std::string& key, bool* failed) {
  SigpipeGuard no_sigpipe;
  if (failed) *failed = false;
  const auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.deadline_ms);
  redisContext* c = acquire(deadline);
  if (c == nullptr) {
    if (failed) *failed = true;
    return std::nullopt;
  }
  redisSetTimeout(c, to_timeval(deadline - Clock::now()));
  append(c, {"GET", key});
  Reply r;
  const bool broken = redisGetReply(c, reinterpret_cast<void**>(&r.r)) != REDIS_OK;
  const std::string why = broken ? c->errstr : "";
  std::optional<std::string> out;
  if (!broken && r.r->type == REDIS_REPLY_STRING) out = std::string(r.r->str, r.r->len);
  if ((broken || r.r->type == REDIS_REPLY_ERROR) && failed) *failed = true;
  release(c, broken, broken && Clock::now() >= deadline, why);
  return out;
}

std::string RemoteStore::encode(const Block& b) const {
  return encode_block(b, nlohmann::json{{"ns", cfg_.ns}, {"id", b.id}});
}

redisContext* RemoteStore::connect(Clock::time_point deadline, std::string& why) {
  SigpipeGuard no_sigpipe;
  const struct timeval tv = to_timeval(deadline - Clock::now());
  redisContext* c = ep_.unix_socket ? redisConnectUnixWithTimeout(ep_.path.c_str(), tv)
                                    : redisConnectWithTimeout(ep_.host.c_str(), ep_.port, tv);
  if (c == nullptr) {
    why = "cannot allocate a connection";
    return nullptr;
  }
  if (c->err != 0) {
    why = c->errstr;
    redisFree(c);
    return nullptr;
  }
  redisSetTimeout(c, to_timeval(deadline - Clock::now()));
  auto command = [&](std::initializer_list<std::string> args, const char* what) {
    append(c, args);
    Reply r;
    if (redisGetReply(c, reinterpret_cast<void**>(&r.r)) != REDIS_OK) {
      why = str_cat(what, ": ", c->errstr);
      return false;
    }
    if (r.r->type == REDIS_REPLY_ERROR) {
      why = str_cat(what, ": ", std::string(r.r->str, r.r->len));
      return false;
    }
    return true;
  };
  if ((!password_.empty() && !command({"AUTH", password_}, "AUTH")) ||
      (ep_.db != 0 && !command({"SELECT", std::to_string(ep_.db)}, "SELECT"))) {
    redisFree(c);
    return nullptr;
  }
  return c;
}

redisContext* RemoteStore::acquire(Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!idle_.empty()) {
      redisContext* c = idle_.back();
      idle_.pop_back();
      return c;
    }
    if (down_) {
      const auto now = Clock::now();
      if (now < retry_at_) {
        std::lock_guard<std::mutex> s(stats_mu_);
        ++stats_.unavailable;
        return nullptr;
      }
      retry_at_ = now + std::chrono::milliseconds(backoff_ms_);  // this thread tries; others wait
    }
  }
  std::string why;
  redisContext* c = connect(deadline, why);
  if (c == nullptr) {
    went_down(why);
    return nullptr;
  }
  came_up();
  return c;
}

void RemoteStore::release(redisContext* c, bool broken, bool timed_out, const std::string& why) {
  if (!broken) {
    std::lock_guard<std::mutex> lock(pool_mu_);
    timeouts_in_row_ = 0;
    idle_.push_back(c);
    return;
  }
  redisFree(c);
  if (timed_out) {
    int in_row = 0;
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      in_row = ++timeouts_in_row_;
    }
    {
      std::lock_guard<std::mutex> s(stats_mu_);
      ++stats_.deadline;
    }
    if (in_row >= 3) went_down(str_cat(in_row, " operations in a row past the ", cfg_.deadline_ms, " ms deadline"));
    return;
  }
  went_down(why);
}

void RemoteStore::went_down(const std::string& why) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    for (redisContext* c : idle_) redisFree(c);
    idle_.clear();
    const auto now = Clock::now();
    if (!down_) {
      first = true;
      down_ = true;
      down_since_ = now;
      backoff_ms_ = cfg_.backoff_min_ms;
    } else {
      backoff_ms_ = std::min(cfg_.backoff_max_ms, backoff_ms_ * 2);
    }
    retry_at_ = now + std::chrono::milliseconds(backoff_ms_);
  }
  if (first) {
    {
      std::lock_guard<std::mutex> s(stats_mu_);
      ++stats_.outages;
    }
    warn(str_cat("kv store ", ep_.url, ": unreachable (", why,
                 "); going on with the local tiers and recompute, retrying with backoff"));
  }
}

void RemoteStore::came_up() {
  double secs = 0;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!down_) return;
    down_ = false;
    timeouts_in_row_ = 0;
    secs = std::chrono::duration<double>(Clock::now() - down_since_).count();
  }
  {
    std::lock_guard<std::mutex> s(stats_mu_);
    ++stats_.reconnects;
  }
  warn(str_cat("kv store ", ep_.url, ": reachable again after ", static_cast<int64_t>(secs * 1000), " ms"));
}

bool RemoteStore::put_many(std::vector<Put> puts) {
  if (puts.empty()) return true;
  SigpipeGuard no_sigpipe;
  const auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.deadline_ms);
  redisContext* c = acquire(deadline);
  if (c == nullptr) {
    std::lock_guard<std::mutex> s(stats_mu_);
    stats_.put_failed += static_cast<int64_t>(puts.size());
    return false;
  }
  redisSetTimeout(c, to_timeval(deadline - Clock::now()));
  const std::string sizes = prefix_ + "sizes", lru = prefix_ + "lru", total_key = prefix_ + "bytes";
  const std::string t = std::to_string(now_ms());
  const std::string ttl = std::to_string(cfg_.ttl_ms);
  int per = 0;  // replies per put
  for (const auto& p : puts) {
    const std::string meta = p.key + ":m";
    append(c, {"HGET", sizes, p.key});
    if (cfg_.ttl_ms > 0) append(c, {"SET", p.key, p.value, "PX", ttl});
    else append(c, {"SET", p.key, p.value});
    append(c, {"HSET", meta, "id", p.id, "kind", p.kind, "tokens", std::to_string(p.tokens), "bytes",
               std::to_string(p.value.size()), "written_ms", t});
    append(c, {"HSET", sizes, p.key, std::to_string(p.value.size())});
    append(c, {"ZADD", lru, t, p.key});
    per = 5;
    if (cfg_.ttl_ms > 0) append(c, {"PEXPIRE", meta, ttl}), ++per;
  }
  long long delta = 0;
  bool broken = false, timed_out = false;
  std::string why;
  for (size_t i = 0; i < puts.size() && !broken; ++i) {
    for (int j = 0; j < per; ++j) {
      Reply r;
      if (!read_reply(c, r, deadline, timed_out, why)) {
        broken = true;
        break;
      }
      if (r.r->type == REDIS_REPLY_ERROR) {
        why = std::string(r.r->str, r.r->len);  // e.g. the server is out of memory
      } else if (j == 0) {
        if (r.r->type == REDIS_REPLY_STRING) delta -= std::atoll(r.r->str);
      } else if (j == 1) {
        delta += static_cast<long long>(puts[i].value.size());
      }
    }
  }
  long long total = 0;
  if (!broken) {
    append(c, {"INCRBY", total_key, std::to_string(delta)});
    if (cfg_.ttl_ms > 0)
      for (const auto& k : {sizes, lru, total_key}) append(c, {"PEXPIRE", k, ttl});
    const int n = cfg_.ttl_ms > 0 ? 4 : 1;
    for (int j = 0; j < n; ++j) {
      Reply r;
      if (redisGetReply(c, reinterpret_cast<void**>(&r.r)) != REDIS_OK) {
        broken = true;
        timed_out = Clock::now() >= deadline;
        why = c->errstr;
        break;
      }
      if (j == 0 && r.r->type == REDIS_REPLY_INTEGER) total = r.r->integer;
    }
  }
  if (!broken && static_cast<unsigned long long>(std::max(0LL, total)) > cfg_.budget) {
    std::set<std::string> fresh;
    for (const auto& p : puts) fresh.insert(p.key);
    evict_over_budget(c, total, deadline, fresh);
  }
  if (!broken && c->err != 0) broken = true, why = c->errstr, timed_out = Clock::now() >= deadline;
  size_t bytes = 0;
  for (const auto& p : puts) bytes += p.value.size();
  {
    std::lock_guard<std::mutex> s(stats_mu_);
    if (broken || !why.empty()) {
      stats_.put_failed += static_cast<int64_t>(puts.size());
    } else {
      stats_.puts += static_cast<int64_t>(puts.size());
      stats_.put_bytes += static_cast<int64_t>(bytes);
    }
  }
  if (!broken && !why.empty()) warn(str_cat("kv store ", ep_.url, ": a write was refused: ", why));
  release(c, broken, timed_out, why);
  return !broken && why.empty();
}

void RemoteStore::evict_over_budget(redisContext* c, long long total, Clock::time_point deadline,
                                    const std::set<std::string>& fresh) {
  const std::string sizes = prefix_ + "sizes", lru = prefix_ + "lru", total_key = prefix_ + "bytes";
  const long long budget = static_cast<long long>(std::min<size_t>(cfg_.budget, static_cast<size_t>(LLONG_MAX)));
  int64_t evicted = 0;
  // The least recently used keys, 32 at a time, deleted until the namespace is within its budget:
  // the fewest that do it, the keys just written last of all (only when they alone exceed it).
  for (int pass = 0; pass < 2 && total > budget && Clock::now() < deadline; ++pass) {
    for (long long start = 0; total > budget && Clock::now() < deadline;) {
      append(c, {"ZRANGE", lru, std::to_string(start), std::to_string(start + 31)});
      std::vector<std::string> keys;
      {
        Reply r;
        if (redisGetReply(c, reinterpret_cast<void**>(&r.r)) != REDIS_OK || r.r->type != REDIS_REPLY_ARRAY) return;
        for (size_t i = 0; i < r.r->elements; ++i) keys.emplace_back(r.r->element[i]->str, r.r->element[i]->len);
      }
      if (keys.empty()) break;
      std::vector<std::string> hmget = {"HMGET", sizes};
      hmget.insert(hmget.end(), keys.begin(), keys.end());
      append(c, hmget);
      std::vector<long long> size(keys.size(), 0);
      {
        Reply r;
        if (redisGetReply(c, reinterpret_cast<void**>(&r.r)) != REDIS_OK || r.r->type != REDIS_REPLY_ARRAY) return;
        for (size_t i = 0; i < r.r->elements && i < keys.size(); ++i)
          if (r.r->element[i]->type == REDIS_REPLY_STRING) size[i] = std::atoll(r.r->element[i]->str);
      }
      std::vector<std::string> victims;
      long long over = total - budget;
      long long kept = 0;  // keys of this range left in place (the next range starts after them)
      for (size_t i = 0; i < keys.size() && over > 0; ++i) {
        if (pass == 0 && fresh.count(keys[i])) {
          ++kept;
          continue;
        }
        victims.push_back(keys[i]);
        over -= size[i];
      }
      if (victims.empty()) {
        start += static_cast<long long>(keys.size());
        continue;
      }
      std::string why;
      const long long now = drop_keys(c, victims, why);
      if (now < 0) return;
      total = now;
      evicted += static_cast<int64_t>(victims.size());
      start += kept;
    }
  }
  if (total > budget) {  // nothing listed is left to delete: the counter had drifted (keys that expired)
    append(c, {"ZCARD", lru});
    Reply r;
    if (redisGetReply(c, reinterpret_cast<void**>(&r.r)) == REDIS_OK && r.r->type == REDIS_REPLY_INTEGER &&
        r.r->integer == 0) {
      append(c, {"SET", total_key, "0"});
      Reply z;
      redisGetReply(c, reinterpret_cast<void**>(&z.r));
    }
  }
  std::lock_guard<std::mutex> s(stats_mu_);
  stats_.evicted += evicted;
}

RemoteStore::Put RemoteStore::put_of(const Block& b, std::string key) const {
  Put p;
  p.value = encode(b);
  p.key = key.empty() ? key_for_value(p.value) : std::move(key);
  p.id = b.id;
  p.kind = b.meta.kind;
  p.tokens = b.layers.empty() ? 0 : b.layers[0].n_tokens();
  return p;
}

bool RemoteStore::put(const std::string& key, const Block& b) {
  std::vector<Put> v;
  v.push_back(put_of(b, key));
  return put_many(std::move(v));
}

void RemoteStore::put_async(std::string key, Block b) {
  const size_t n = b.nbytes();
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    if (!down_ && queued_bytes_ + n <= cfg_.queue_bytes) {
      queued_bytes_ += n;
      queue_.emplace_back(std::move(key), std::move(b));
      q_cv_.notify_one();
      return;
    }
  }
  std::lock_guard<std::mutex> s(stats_mu_);
  ++stats_.dropped;
}

void RemoteStore::writer_loop() {
  std::unique_lock<std::mutex> lock(q_mu_);
  for (;;) {
    q_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    std::vector<std::pair<std::string, Block>> batch;
    size_t bytes = 0;
    while (!queue_.empty() && batch.size() < 64 && bytes < (size_t{32} << 20)) {
      bytes += queue_.front().second.nbytes();
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    writing_ = true;
    lock.unlock();
    std::vector<Put> puts;
    for (auto& [key, b] : batch) {
      try {
        puts.push_back(put_of(b, key));
      } catch (const std::exception& e) {
        warn(str_cat("kv store: block '", b.id, "' could not be encoded: ", e.what()));
      }
    }
    put_many(std::move(puts));
    batch.clear();  // the tensors go before the lock is taken again
    lock.lock();
    queued_bytes_ -= std::min(queued_bytes_, bytes);
    writing_ = false;
    q_done_cv_.notify_all();
  }
}

bool RemoteStore::flush(int ms) {
  std::unique_lock<std::mutex> lock(q_mu_);
  return q_done_cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return queue_.empty() && !writing_; });
}

std::vector<std::optional<Block>> RemoteStore::get_many(const std::vector<std::string>& keys,
                                                        const std::vector<std::string>& ids) {
  WM_CHECK(keys.size() == ids.size(), "get_many: ", keys.size(), " keys and ", ids.size(), " identities");
  std::vector<std::optional<Block>> out(keys.size());
  if (keys.empty()) return out;
  SigpipeGuard no_sigpipe;
  const auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.deadline_ms);
  redisContext* c = acquire(deadline);
  {
    std::lock_guard<std::mutex> s(stats_mu_);
    stats_.gets += static_cast<int64_t>(keys.size());
    if (c == nullptr) stats_.misses += static_cast<int64_t>(keys.size());
  }
  if (c == nullptr) return out;
  redisSetTimeout(c, to_timeval(deadline - Clock::now()));
  const std::string lru = prefix_ + "lru", t = std::to_string(now_ms());
  for (const auto& k : keys) {
    append(c, {"GET", k});
    append(c, {"ZADD", lru, "XX", t, k});
  }
  bool broken = false, timed_out = false;
  std::string why;
  int64_t hits = 0, corrupt = 0, foreign = 0, bytes = 0;
  std::vector<std::string> bad;
  for (size_t i = 0; i < keys.size() && !broken; ++i) {
    for (int j = 0; j < 2; ++j) {
      Reply r;
      if (!read_reply(c, r, deadline, timed_out, why)) {
        broken = true;
        break;
      }
      if (j != 0 || r.r->type != REDIS_REPLY_STRING) continue;
      if (Clock::now() >= deadline) {  // the value came, but too late to be of use
        broken = timed_out = true;
        break;
      }
      const std::string where = str_cat("kv store value ", keys[i]);
      try {
        nlohmann::json extra;
        Block b = decode_block(r.r->str, r.r->len, where, &extra);
        const bool ours = extra.is_object() && extra.value("ns", std::string()) == cfg_.ns &&
                          extra.value("id", std::string()) == ids[i] && b.id == ids[i];
        if (!ours) {
          ++foreign;
          bad.push_back(keys[i]);
          report_bad(false, str_cat(where, ": holds another model's or block's value (namespace ",
                                    extra.is_object() ? extra.value("ns", std::string("?")) : std::string("none"),
                                    ", block '", b.id, "', expected '", ids[i], "'); not used, deleted"));
          continue;
        }
        bytes += static_cast<int64_t>(r.r->len);
        out[i] = std::move(b);
        ++hits;
      } catch (const std::exception& e) {
        ++corrupt;
        bad.push_back(keys[i]);
        report_bad(true, str_cat(e.what(), "; not used, deleted"));
      }
    }
  }
  if (!broken && !bad.empty())  // damaged or foreign values go, so that a recompute replaces them
    broken = drop_keys(c, bad, why) < 0;
  if (broken) {
    for (auto& o : out) o.reset();  // all or nothing is simpler for callers: a partial read is a miss
    hits = 0;
  }
  {
    std::lock_guard<std::mutex> s(stats_mu_);
    stats_.hits += hits;
    stats_.misses += static_cast<int64_t>(keys.size()) - hits;
    stats_.corrupt += corrupt;
    stats_.foreign += foreign;
    if (!broken) stats_.get_bytes += bytes;
  }
  release(c, broken, timed_out, why);
  return out;
}

std::optional<Block> RemoteStore::get(const std::string& key, const std::string& id) {
  return std::move(get_many({key}, {id})[0]);
}

long long RemoteStore::drop_keys(redisContext* c, const std::vector<std::string>& keys, std::string& why) {
  const std::string sizes = prefix_ + "sizes";
  std::vector<std::string> hmget = {"HMGET", sizes}, del = {"DEL"}, hdel = {"HDEL", sizes}, zrem = {"ZREM", prefix_ + "lru"};
  for (const auto& k : keys)
    hmget.push_back(k), del.push_back(k), del.push_back(k + ":m"), hdel.push_back(k), zrem.push_back(k);
  append(c, hmget);
  append(c, del);
  append(c, hdel);
  append(c, zrem);
  long long freed = 0;
  for (int j = 0; j < 4; ++j) {
    Reply r;
    if (redisGetReply(c, reinterpret_cast<void**>(&r.r)) != REDIS_OK) {
      why = c->errstr;
      return -1;
    }
    if (j == 0 && r.r->type == REDIS_REPLY_ARRAY)
      for (size_t i = 0; i < r.r->elements; ++i)
        if (r.r->element[i]->type == REDIS_REPLY_STRING) freed += std::atoll(r.r->element[i]->str);
  }
  append(c, {"DECRBY", prefix_ + "bytes", std::to_string(freed)});
  Reply r;
  if (redisGetReply(c, reinterpret_cast<void**>(&r.r)) != REDIS_OK) {
    why = c->errstr;
    return -1;
  }
  return r.r->type == REDIS_REPLY_INTEGER ? r.r->integer : 0;
}

bool RemoteStore::erase(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  SigpipeGuard no_sigpipe;
  const auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.deadline_ms);
  redisContext* c = acquire(deadline);
  if (c == nullptr) return false;
  redisSetTimeout(c, to_timeval(deadline - Clock::now()));
  std::string why;
  const bool broken = drop_keys(c, keys, why) < 0;
  release(c, broken, broken && Clock::now() >= deadline, why);
  return !broken;
}

RemoteStats RemoteStore::stats() const {
  std::lock_guard<std::mutex> s(stats_mu_);
  return stats_;
}

nlohmann::json RemoteStore::stats_json() const {
  const RemoteStats s = stats();
  return {{"url", ep_.url},           {"namespace", cfg_.ns},     {"gets", s.gets},
          {"hits", s.hits},           {"misses", s.misses},       {"puts", s.puts},
          {"put_failed", s.put_failed}, {"dropped", s.dropped},   {"get_bytes", s.get_bytes},
          {"put_bytes", s.put_bytes}, {"corrupt", s.corrupt},     {"foreign", s.foreign},
          {"outages", s.outages},     {"reconnects", s.reconnects}, {"deadline", s.deadline},
          {"unavailable", s.unavailable}, {"evicted", s.evicted}, {"available", available()}};
}

}  // namespace wm
