#pragma once
// The remote tier: blocks in a Redis server (through hiredis), shared by every process that
// points at it. A value is a block in the spill files' format (header, payload, XXH64 checksum,
// runtime/spill_file.h) whose header also names the store's namespace and the block's identity;
// each key has a small metadata hash beside it. Keys are content keys: "wm:<namespace>:<kind>:
// <16 hex digits>", the namespace being the model's identity (two models never share a key) and
// the digits an XXH64 (of a block identity that is itself a content hash, as the chunk cache's
// are, or of the value's own bytes).
//
// What comes back is checked: a checksum mismatch or a value of another namespace or identity is
// a miss (reported once, counted, never used, and the key deleted). The store never stalls its
// caller beyond `deadline_ms` an operation: a slow or lost server fails the operation (a miss, a
// write not made), the caller recomputes. An unreachable server degrades every operation to a
// miss at once with one warning per outage, and a connection is tried again with exponential
// backoff. Budget: the namespace's bytes are counted in the server; beyond the budget its least
// recently used keys are deleted. Thread-safe; connections come from a pool, and no lock is held
// across a network call.
//
// SIGPIPE is blocked in the calling thread during each network call (and one raised there is
// consumed): a server that closes a connection fails the call, it does not end the process.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/block.h"

struct redisContext;

namespace wm {

// Where the store is: "redis://HOST[:PORT][/DB]" (port 6379, database 0 by default) or
// "unix:///PATH[?db=N]". A password never goes in the URL (it would sit in the shell's history
// and in `ps`): it comes from an environment variable (RemoteConfig::password_env).
struct RemoteEndpoint {
  bool unix_socket = false;
  std::string host;  // TCP
  int port = 6379;
  std::string path;  // Unix socket
  int db = 0;
  std::string url;   // as given
};
// Throws wm::Error naming what is wrong (an unknown scheme, a bad port or database, a password).
RemoteEndpoint parse_store_url(const std::string& url);

struct RemoteConfig {
  std::string url;                              // parse_store_url
  std::string password_env = "WM_KV_STORE_PASSWORD";  // AUTH with its value when set and not empty
  std::string ns;                               // namespace: the model's identity; required
  int64_t ttl_ms = 0;                           // keys expire this long after their last write (0: never)
  size_t budget = std::numeric_limits<size_t>::max();  // bytes of values under this namespace
  int deadline_ms = 200;                        // an operation's limit (connect included)
  int backoff_min_ms = 100, backoff_max_ms = 5000;  // waits between connection attempts in an outage
  size_t queue_bytes = size_t{256} << 20;       // asynchronous writes waiting beyond this are dropped (counted)
  int flush_ms = 10000;                         // the destructor waits this long for queued writes
  // Where warnings go (one per outage, one per damaged value); default: stderr.
  std::function<void(const std::string&)> log;
  void validate() const;  // throws wm::Error naming the field
};

struct RemoteStats {
  int64_t gets = 0, hits = 0, misses = 0;  // values asked for, found and sound, not there
  int64_t puts = 0, put_failed = 0, dropped = 0;  // values written; writes that failed; async writes dropped
  int64_t get_bytes = 0, put_bytes = 0;
  int64_t corrupt = 0;    // values whose checksum or format failed (a miss)
  int64_t foreign = 0;    // values of another namespace or identity under the asked key (a miss)
  int64_t outages = 0;    // times the server became unreachable
  int64_t reconnects = 0; // times it came back
  int64_t deadline = 0;   // operations cut at the deadline
  int64_t unavailable = 0;  // operations answered at once as misses during an outage
  int64_t evicted = 0;    // keys deleted to keep the namespace within its budget
};

class RemoteStore {
 public:
  // Tries to connect; an unreachable server is a warning (the store starts in an outage), a bad
  // config or URL a wm::Error.
  explicit RemoteStore(RemoteConfig cfg);
  ~RemoteStore();  // waits up to flush_ms for queued writes
  RemoteStore(const RemoteStore&) = delete;
  RemoteStore& operator=(const RemoteStore&) = delete;

  // The key of a block identity that is a content hash (the chunk cache's "kv:<key>:<layer>").
  std::string key_for_id(const std::string& id) const;
  // The key of an encoded value's own bytes.
  std::string key_for_value(const std::string& value) const;
  // The key of a named object of some kind ("session", ...): "wm:<ns>:<kind>:<XXH64 of name>".
  std::string key_for(const std::string& kind, const std::string& name) const;
  // The block encoded as a value of this store (its namespace and identity in the header).
  std::string encode(const Block& b) const;

  // Raw values (a session's manifest, say): written as they are, with the TTL and outside the
  // budget's accounting; read as they are (the caller checks them). put_value: false on failure.
  // get_value: the value, or nullopt when absent or when the store failed (then *failed is set).
  bool put_value(const std::string& key, const std::string& value);
  std::optional<std::string> get_value(const std::string& key, bool* failed = nullptr);

  // Writes values (keys paired with encoded blocks and their identities), pipelined; false if
  // any failed (an outage, the deadline). A key written again is replaced.
  struct Put {
    std::string key, id, kind;
    std::string value;
    int64_t tokens = 0;
  };
  bool put_many(std::vector<Put> puts);
  // A block encoded as a Put under `key`, or, when key is empty, under the key of its value's
  // bytes (key_for_value). Throws what encode() throws.
  Put put_of(const Block& b, std::string key = {}) const;
  bool put(const std::string& key, const Block& b);
  // Queues the block for the writer thread (encoded there); returns at once. Dropped (counted)
  // when queue_bytes are already waiting.
  void put_async(std::string key, Block b);
  // Waits until every queued write is done or `ms` passed; false on timeout.
  bool flush(int ms);

  // Reads values, pipelined, and decodes them onto the CPU: a block per key found whole and sound
  // under the expected identity (ids[i]), nullopt otherwise (absent, damaged, foreign, outage,
  // deadline).
  std::vector<std::optional<Block>> get_many(const std::vector<std::string>& keys, const std::vector<std::string>& ids);
  std::optional<Block> get(const std::string& key, const std::string& id);
  // Deletes keys (best effort: false on an outage).
  bool erase(const std::vector<std::string>& keys);

  bool available() const { return !down_.load(); }
  RemoteStats stats() const;
  nlohmann::json stats_json() const;
  const RemoteConfig& config() const { return cfg_; }
  const RemoteEndpoint& endpoint() const { return ep_; }

 private:
  using Clock = std::chrono::steady_clock;
  // A connection from the pool or a new one; nullptr during an outage's backoff or when connecting
  // fails (which starts or continues the outage).
  redisContext* acquire(Clock::time_point deadline);
  // Back to the pool, or closed: `broken` after an I/O error (an outage when `timed_out` is false
  // or timeouts keep coming).
  void release(redisContext* c, bool broken, bool timed_out, const std::string& why);
  redisContext* connect(Clock::time_point deadline, std::string& why);
  void went_down(const std::string& why);
  void came_up();
  void warn(const std::string& msg) const;
  // Warns of a damaged (or foreign) value: the first 3 by name, then counts at powers of 10.
  void report_bad(bool damaged, const std::string& msg);
  void writer_loop();
  // Deletes the least recently used keys until the namespace is within its budget, the keys just
  // written (`fresh`) only when the others are not enough.
  void evict_over_budget(redisContext* c, long long total, Clock::time_point deadline,
                         const std::set<std::string>& fresh);
  // Deletes keys with their metadata and bookkeeping; the namespace's byte count after, or -1 on
  // an I/O error (why set).
  long long drop_keys(redisContext* c, const std::vector<std::string>& keys, std::string& why);

  RemoteConfig cfg_;
  RemoteEndpoint ep_;
  std::string password_;
  std::string prefix_;  // "wm:<ns>:"

  std::mutex pool_mu_;
  std::vector<redisContext*> idle_;
  std::atomic<bool> down_{false};
  Clock::time_point down_since_{};
  Clock::time_point retry_at_{};
  int backoff_ms_ = 0;
  int timeouts_in_row_ = 0;

  mutable std::mutex stats_mu_;
  RemoteStats stats_;
  int64_t bad_damaged_ = 0, bad_foreign_ = 0;  // reports so far (report_bad)

  // The asynchronous writer.
  std::mutex q_mu_;
  std::condition_variable q_cv_, q_done_cv_;
  std::deque<std::pair<std::string, Block>> queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false, stop_ = false;
  std::thread writer_;
};

}  // namespace wm
