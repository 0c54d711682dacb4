// The remote KV tier against a real redis-server of the test's own (tests/runtime/redis_server.h):
// URLs, bit-exact round trips over the Unix socket and TCP, damaged and foreign values (misses,
// counted, deleted), the namespace budget's LRU deletion, TTL, an outage (one warning, misses,
// reconnection after the backoff), a stalled server (the deadline), asynchronous writes seen by
// another store, and the BlockStore's remote tier (demotion, loss, publish and import). Skipped
// when redis-server is not installed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/block_store.h"
#include "runtime/error.h"
#include "runtime/remote_store.h"
#include "test_util.h"
#include "tests/runtime/redis_server.h"

namespace wm {
namespace {

using testing::RedisServer;
using Clock = std::chrono::steady_clock;

// Warnings a store reports (RemoteConfig::log), from any of its threads.
struct Warnings {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(m);
    };
  }
  int count(const std::string& word) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& l : lines) n += l.find(word) != std::string::npos;
    return n;
  }
  std::string all() {
    std::lock_guard<std::mutex> lock(mu);
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
};

// Deadlines generous enough for a loaded machine, except where a test is about them.
RemoteConfig config(const std::string& url, const std::string& ns, Warnings& w) {
  RemoteConfig c;
  c.url = url;
  c.ns = ns;
  c.deadline_ms = 2000;
  c.backoff_min_ms = 20;
  c.backoff_max_ms = 80;
  c.password_env = "";  // whatever the environment holds, the test's server has no password
  c.log = w.sink();
  return c;
}

// A block of several ragged layers (K/V of `dtype`, 3 position axes, random log-weights) with
// metadata: kind, priority, created, an embedding and a payload.
Block sample_block(const std::string& id, at::ScalarType dtype) {
  Block b = test::random_block(id, 3, 2, 9, 8, dtype, 3, /*ragged=*/true, /*base=*/40);
  b.meta.kind = "turn";
  b.meta.priority = 0.8125;
  b.meta.created = 17;
  b.meta.embedding = at::randn({6});
  b.stats.attn_ema = 0.25;
  return b;
}

// Every tensor, the identity and the metadata that travel with a block.
void expect_same_block(const Block& want, const Block& got) {
  EXPECT_TRUE(test::blocks_bit_equal(want, got)) << want.id;
  EXPECT_EQ(got.meta.kind, want.meta.kind);
  EXPECT_EQ(got.meta.priority, want.meta.priority);
  EXPECT_EQ(got.meta.created, want.meta.created);
  EXPECT_EQ(got.meta.embedding.defined(), want.meta.embedding.defined());
  if (want.meta.embedding.defined()) EXPECT_TRUE(test::bit_equal(got.meta.embedding, want.meta.embedding));
  EXPECT_EQ(test::payload_values(got.meta), test::payload_values(want.meta));
  for (int l = 0; l < std::min(want.n_layers(), got.n_layers()); ++l) {
    EXPECT_EQ(got.layers[l].k.scalar_type(), want.layers[l].k.scalar_type());
    EXPECT_TRUE(got.layers[l].k.device().is_cpu());
  }
}

// A copy that shares no storage with b (what the store is given is moved away).
Block clone(const Block& b) { return b.to(at::kCPU, /*copy=*/true); }

// The value with byte `at` xor `mask` (unchanged when too short).
std::string flip(std::string v, size_t at, unsigned char mask) {
  if (at < v.size()) v[at] = static_cast<char>(static_cast<unsigned char>(v[at]) ^ mask);
  return v;
}

bool exists(const RedisServer& s, const std::string& key) { return s.command({"EXISTS", key}) == "1"; }

// Value keys of a namespace and kind ("i" or "c"), without their metadata hashes.
std::vector<std::string> value_keys(const RedisServer& s, const std::string& ns, const std::string& kind) {
  std::vector<std::string> out;
  for (const auto& k : s.keys("wm:" + ns + ":" + kind + ":*"))
    if (k.size() < 2 || k.compare(k.size() - 2, 2, ":m") != 0) out.push_back(k);
  return out;
}

// A started server of the test's own.
class RemoteStoreServer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RedisServer::binary().empty()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_TRUE(server.start()) << "redis-server did not answer in " << server.dir();
  }
  RedisServer server;
  Warnings warnings;
};

// --- URLs ---------------------------------------------------------------------------------------

TEST(RemoteStoreUrl, GoodUrls) {
  RemoteEndpoint e = parse_store_url("redis://h");
  EXPECT_FALSE(e.unix_socket);
  EXPECT_EQ(e.host, "h");
  EXPECT_EQ(e.port, 6379);
  EXPECT_EQ(e.db, 0);
  EXPECT_EQ(e.url, "redis://h");

  e = parse_store_url("redis://h:1234/3");
  EXPECT_EQ(e.host, "h");
  EXPECT_EQ(e.port, 1234);
  EXPECT_EQ(e.db, 3);

  e = parse_store_url("redis://[::1]:7000");
  EXPECT_FALSE(e.unix_socket);
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 7000);
  EXPECT_EQ(e.db, 0);

  e = parse_store_url("unix:///a/b?db=2");
  EXPECT_TRUE(e.unix_socket);
  EXPECT_EQ(e.path, "/a/b");
  EXPECT_EQ(e.db, 2);

  e = parse_store_url("unix:///run/redis.sock");
  EXPECT_TRUE(e.unix_socket);
  EXPECT_EQ(e.path, "/run/redis.sock");
  EXPECT_EQ(e.db, 0);
}

TEST(RemoteStoreUrl, BadUrlsAreNamedErrors) {
  for (const std::string url :
       {"redis://:pw@h", "redis://user:pw@h:6379", "rediss://h", "unix://rel", "unix://rel/sock", "unix://",
        "redis://h:0", "redis://h:65536", "redis://h:port", "redis://h:", "redis://h:-1", "redis://h/x",
        "redis://h/-1", "redis://h/1.5", "unix:///a?db=x", "unix:///a?timeout=3", "http://h", "h:6379", "",
        "redis://", "redis://:6379", "redis://[::1"}) {
    try {
      parse_store_url(url);
      ADD_FAILURE() << "'" << url << "' was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(url.empty() ? "''" : url), std::string::npos)
          << "the message should name the URL: " << e.what();
    }
  }
  // The password's message points to the environment variable.
  try {
    parse_store_url("redis://:pw@h");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("WM_KV_STORE_PASSWORD"), std::string::npos) << e.what();
  }
  // A config with a bad URL or no namespace is refused before anything connects.
  Warnings w;
  EXPECT_THROW({ RemoteStore s(config("http://h", "m", w)); }, Error);
  EXPECT_THROW({ RemoteStore s(config("unix:///nowhere/sock", "", w)); }, Error);
  EXPECT_THROW({ RemoteStore s(config("unix:///nowhere/sock", "two words", w)); }, Error);
  EXPECT_EQ(w.count(""), 0) << w.all();  // refused before trying to connect
}

// --- Values -------------------------------------------------------------------------------------

TEST(RemoteStoreRoundTrip, BitExactOverUnixSocketAndTcp) {
  if (RedisServer::binary().empty()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer server(/*tcp=*/true);
  ASSERT_GT(server.port(), 0);
  ASSERT_TRUE(server.start()) << "redis-server did not answer in " << server.dir();
  for (const std::string& url : {server.url(), server.tcp_url()}) {
    Warnings w;
    RemoteStore store(config(url, "model-a", w));
    ASSERT_TRUE(store.available()) << url << ": " << w.all();
    int n = 0;
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      const Block b = sample_block("kv:" + url + ":" + std::to_string(n++), dtype);
      const std::string key = store.key_for_id(b.id);
      EXPECT_EQ(key.rfind("wm:model-a:i:", 0), 0u) << key;
      ASSERT_TRUE(store.put(key, clone(b))) << url << ": " << w.all();
      std::optional<Block> got = store.get(key, b.id);
      ASSERT_TRUE(got.has_value()) << url << ": " << w.all();
      expect_same_block(b, *got);
      // The metadata hash beside the value.
      EXPECT_EQ(server.command({"HGET", key + ":m", "id"}), b.id);
      EXPECT_EQ(server.command({"HGET", key + ":m", "tokens"}), "9");
    }
    // Absent keys are misses, and a batch answers per key.
    const Block last = sample_block("kv:" + url + ":" + std::to_string(n - 1), at::kBFloat16);
    auto got = store.get_many({store.key_for_id("kv:absent"), store.key_for_id(last.id)}, {"kv:absent", last.id});
    ASSERT_EQ(got.size(), 2u);
    EXPECT_FALSE(got[0].has_value());
    EXPECT_TRUE(got[1].has_value());
    const RemoteStats s = store.stats();
    EXPECT_EQ(s.puts, 2);
    EXPECT_EQ(s.gets, 4);
    EXPECT_EQ(s.hits, 3);
    EXPECT_EQ(s.misses, 1);
    EXPECT_EQ(s.corrupt + s.foreign + s.outages + s.deadline + s.put_failed, 0);
    EXPECT_GT(s.put_bytes, 0);
    EXPECT_EQ(w.count("unreachable"), 0) << w.all();
  }
  // The same server through either way: what TCP wrote, the Unix socket reads.
  Warnings w1, w2;
  RemoteStore tcp(config(server.tcp_url(), "model-a", w1)), unix_(config(server.url(), "model-a", w2));
  const Block b = sample_block("kv:both", at::kFloat);
  ASSERT_TRUE(tcp.put(tcp.key_for_id(b.id), clone(b)));
  std::optional<Block> got = unix_.get(unix_.key_for_id(b.id), b.id);
  ASSERT_TRUE(got.has_value());
  expect_same_block(b, *got);
}

TEST_F(RemoteStoreServer, DamagedValuesAreMissesCountedAndDeleted) {
  RemoteStore store(config(server.url(), "model-a", warnings));
  const Block b = sample_block("kv:damaged", at::kFloat);
  const std::string key = store.key_for_id(b.id);
  std::mt19937 rng(5);
  int64_t corrupt = 0;
  // Each way of damaging the value: one byte flipped (header, payload, checksum), garbage, a
  // truncation, an empty value.
  const std::vector<std::function<std::string(std::string)>> damages = {
      [](const std::string& v) { return flip(v, v.size() / 2, 0x01); },
      [](const std::string& v) { return flip(v, 20, 0x40); },
      [](const std::string& v) { return flip(v, v.size() - 1, 0xff); },
      [&](std::string v) {
        std::string g(v.size(), '\0');
        for (auto& c : g) c = static_cast<char>(rng() & 0xff);
        return g;
      },
      [](std::string v) { return v.substr(0, v.size() / 2); },
      [](std::string) { return std::string(); },
  };
  for (size_t i = 0; i < damages.size(); ++i) {
    ASSERT_TRUE(store.put(key, clone(b)));
    const std::string value = server.command({"GET", key});
    ASSERT_EQ(value, store.encode(b));  // the value is the block in the spill format, as encode() gives it
    const std::string bad = damages[i](value);
    ASSERT_NE(bad, value);
    ASSERT_EQ(server.command({"SET", key, bad}), "OK");
    EXPECT_FALSE(store.get(key, b.id).has_value()) << "damage " << i;
    EXPECT_EQ(store.stats().corrupt, ++corrupt) << "damage " << i;
    EXPECT_FALSE(exists(server, key)) << "damage " << i << ": a damaged value should be deleted";
    EXPECT_FALSE(exists(server, key + ":m")) << "damage " << i;
  }
  EXPECT_EQ(store.stats().foreign, 0);
  EXPECT_EQ(store.stats().hits, 0);
  // The first three by name; the others counted (a line at 10, 100, ... of them).
  ASSERT_GT(damages.size(), 3u);
  EXPECT_EQ(warnings.count("not used"), 3) << warnings.all();
  // Written again (the caller recomputed it), the value is used.
  ASSERT_TRUE(store.put(key, clone(b)));
  std::optional<Block> got = store.get(key, b.id);
  ASSERT_TRUE(got.has_value());
  expect_same_block(b, *got);
}

TEST_F(RemoteStoreServer, ForeignValuesAreNeverReturned) {
  Warnings wb;
  RemoteStore a(config(server.url(), "model-a", warnings)), other(config(server.url(), "model-b", wb));
  const Block x = sample_block("kv:x", at::kFloat), y = sample_block("kv:y", at::kFloat);
  const std::string key_a = a.key_for_id(x.id), key_b = other.key_for_id(x.id);
  ASSERT_NE(key_a, key_b);  // the namespace is part of the key
  // Another model's value of the same identity, copied under this namespace's key.
  ASSERT_TRUE(other.put(key_b, clone(x)));
  EXPECT_FALSE(a.get(key_a, x.id).has_value());  // not there yet
  ASSERT_EQ(server.command({"SET", key_a, server.command({"GET", key_b})}), "OK");
  EXPECT_FALSE(a.get(key_a, x.id).has_value());
  EXPECT_EQ(a.stats().foreign, 1);
  EXPECT_FALSE(exists(server, key_a));
  // This namespace's value of another block under x's key.
  ASSERT_TRUE(a.put(a.key_for_id(y.id), clone(y)));
  ASSERT_EQ(server.command({"SET", key_a, server.command({"GET", a.key_for_id(y.id)})}), "OK");
  EXPECT_FALSE(a.get(key_a, x.id).has_value());
  EXPECT_EQ(a.stats().foreign, 2);
  EXPECT_EQ(a.stats().corrupt, 0);
  EXPECT_EQ(a.stats().hits, 0);
  EXPECT_EQ(warnings.count("another model's or block's value"), 2) << warnings.all();
  // Both owners still read their own values.
  std::optional<Block> got = other.get(key_b, x.id);
  ASSERT_TRUE(got.has_value());
  expect_same_block(x, *got);
  got = a.get(a.key_for_id(y.id), y.id);
  ASSERT_TRUE(got.has_value());
  expect_same_block(y, *got);
}

// Ten values of one size written 2 ms apart (the LRU order is by write or read time in ms) under
// a namespace budget of three and a half.
struct BudgetCase {
  std::vector<Block> blocks;
  size_t v = 0;  // bytes of one value
  RemoteConfig cfg;
};
BudgetCase budget_case(const std::string& url, Warnings& w) {
  BudgetCase c;
  for (int i = 0; i < 10; ++i) c.blocks.push_back(sample_block("kv:budget:" + std::to_string(i), at::kFloat));
  Warnings w0;
  RemoteConfig probe_cfg = config(url, "model-a", w0);
  probe_cfg.url = "unix:///nowhere/sock";  // encode() needs no server
  RemoteStore probe(probe_cfg);
  c.v = probe.encode(c.blocks[0]).size();
  for (const auto& b : c.blocks) EXPECT_EQ(probe.encode(b).size(), c.v);  // same shapes, same sizes
  c.cfg = config(url, "model-a", w);
  c.cfg.budget = 3 * c.v + c.v / 2;
  return c;
}
uint64_t counter_of(const RedisServer& s) { return std::strtoull(s.command({"GET", "wm:model-a:bytes"}).c_str(), nullptr, 10); }

// The byte counter stays within the budget (plus the value being written), agrees with the values
// there, and the oldest values go first.
TEST_F(RemoteStoreServer, BudgetKeepsTheNamespaceWithinIt) {
  const BudgetCase c = budget_case(server.url(), warnings);
  RemoteStore store(c.cfg);
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(store.put(store.key_for_id(c.blocks[i].id), clone(c.blocks[i]))) << warnings.all();
    EXPECT_LE(counter_of(server), c.cfg.budget + c.v) << "write " << i;
    EXPECT_EQ(counter_of(server), c.v * value_keys(server, "model-a", "i").size()) << "write " << i;
  }
  EXPECT_GE(store.stats().evicted, 7);
  for (int i = 0; i < 7; ++i) {
    EXPECT_FALSE(exists(server, store.key_for_id(c.blocks[i].id))) << "block " << i;
    EXPECT_FALSE(exists(server, store.key_for_id(c.blocks[i].id) + ":m")) << "block " << i;
  }
  // The newest, and whatever else is there, read back whole.
  EXPECT_TRUE(exists(server, store.key_for_id(c.blocks[9].id)));
  for (int i = 0; i < 10; ++i)
    if (exists(server, store.key_for_id(c.blocks[i].id))) {
      std::optional<Block> got = store.get(store.key_for_id(c.blocks[i].id), c.blocks[i].id);
      ASSERT_TRUE(got.has_value()) << "block " << i;
      expect_same_block(c.blocks[i], *got);
    }
  // erase() gives the bytes back.
  ASSERT_TRUE(store.erase({store.key_for_id(c.blocks[9].id)}));
  EXPECT_EQ(counter_of(server), c.v * value_keys(server, "model-a", "i").size());
}

// Only what the budget needs goes, least recently used first: the value just written stays, a read
// keeps a value, and of ten values three (what fits) remain.
TEST_F(RemoteStoreServer, BudgetDeletesOnlyTheLeastRecentlyUsed) {
  const BudgetCase c = budget_case(server.url(), warnings);
  RemoteStore store(c.cfg);
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(store.put(store.key_for_id(c.blocks[i].id), clone(c.blocks[i]))) << warnings.all();
    EXPECT_TRUE(exists(server, store.key_for_id(c.blocks[i].id))) << "write " << i;
    if (i == 2) {  // a read makes block 0 the most recently used: block 1 goes first
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      EXPECT_TRUE(store.get(store.key_for_id(c.blocks[0].id), c.blocks[0].id).has_value());
    }
    if (i == 3) {
      EXPECT_TRUE(exists(server, store.key_for_id(c.blocks[0].id)));
      EXPECT_FALSE(exists(server, store.key_for_id(c.blocks[1].id)));
    }
  }
  EXPECT_EQ(store.stats().evicted, 7);
  for (int i = 0; i < 10; ++i) {
    const std::string key = store.key_for_id(c.blocks[i].id);
    EXPECT_EQ(exists(server, key), i >= 7) << "block " << i;
    EXPECT_EQ(exists(server, key + ":m"), i >= 7) << "block " << i;
  }
  EXPECT_EQ(counter_of(server), 3 * c.v);
}

TEST_F(RemoteStoreServer, ValuesExpireAfterTheirTtl) {
  RemoteConfig cfg = config(server.url(), "model-a", warnings);
  cfg.ttl_ms = 300;
  RemoteStore store(cfg);
  const Block b = sample_block("kv:ttl", at::kFloat);
  const std::string key = store.key_for_id(b.id);
  ASSERT_TRUE(store.put(key, clone(b)));
  // The value and its metadata carry the TTL (PTTL: ms left, -1 for none, -2 for gone).
  for (const std::string& k : {key, key + ":m"}) {
    const long long left = std::atoll(server.command({"PTTL", k}).c_str());
    EXPECT_GT(left, 0) << k;
    EXPECT_LE(left, 300) << k;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_FALSE(store.get(key, b.id).has_value());
  EXPECT_FALSE(exists(server, key));
  EXPECT_FALSE(exists(server, key + ":m"));
  EXPECT_EQ(store.stats().corrupt + store.stats().foreign, 0);
}

// --- Faults -------------------------------------------------------------------------------------

TEST_F(RemoteStoreServer, OutageIsMissesWithOneWarningThenReconnects) {
  RemoteStore store(config(server.url(), "model-a", warnings));
  const Block a = sample_block("kv:before", at::kFloat), b = sample_block("kv:during", at::kBFloat16);
  ASSERT_TRUE(store.put(store.key_for_id(a.id), clone(a)));
  ASSERT_TRUE(store.get(store.key_for_id(a.id), a.id).has_value());
  server.kill();
  // Many operations, some after the backoff (connection attempts that fail again): each a miss or
  // a write not made, none throwing; one outage, one warning.
  for (int i = 0; i < 40; ++i) {
    EXPECT_NO_THROW({
      EXPECT_FALSE(store.get(store.key_for_id(a.id), a.id).has_value()) << i;
      EXPECT_FALSE(store.put(store.key_for_id(b.id), clone(b))) << i;
      EXPECT_FALSE(store.erase({store.key_for_id(a.id)})) << i;
      store.put_async(store.key_for_id(b.id), clone(b));
      EXPECT_TRUE(store.flush(5000));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(store.available());
  RemoteStats s = store.stats();
  EXPECT_EQ(s.outages, 1);
  EXPECT_EQ(s.reconnects, 0);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 40);
  EXPECT_EQ(s.put_failed, 40);
  EXPECT_GT(s.unavailable, 0);  // answered at once during the backoff
  EXPECT_EQ(warnings.count("unreachable"), 1) << warnings.all();

  // Back on the same socket (empty: the server keeps nothing): after the backoff, writes and
  // reads work again.
  ASSERT_TRUE(server.start());
  bool written = false;
  for (const auto t0 = Clock::now(); !written && Clock::now() - t0 < std::chrono::seconds(10);) {
    written = store.put(store.key_for_id(b.id), clone(b));
    if (!written) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(written) << warnings.all();
  std::optional<Block> got = store.get(store.key_for_id(b.id), b.id);
  ASSERT_TRUE(got.has_value());
  expect_same_block(b, *got);
  EXPECT_FALSE(store.get(store.key_for_id(a.id), a.id).has_value());  // lost with the old server
  EXPECT_TRUE(store.available());
  s = store.stats();
  EXPECT_GE(s.reconnects, 1);
  EXPECT_EQ(s.outages, 1);
  EXPECT_EQ(warnings.count("unreachable"), 1) << warnings.all();
  EXPECT_EQ(warnings.count("reachable again"), 1) << warnings.all();
}

TEST(RemoteStoreFault, UnreachableAtStartIsNotAnError) {
  RedisServer none;  // its folder, no server in it
  Warnings w;
  std::unique_ptr<RemoteStore> store;
  ASSERT_NO_THROW(store = std::make_unique<RemoteStore>(config(none.url(), "model-a", w)));
  EXPECT_FALSE(store->available());
  EXPECT_EQ(w.count("unreachable"), 1) << w.all();
  const Block b = sample_block("kv:nowhere", at::kFloat);
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(store->get(store->key_for_id(b.id), b.id).has_value());
    EXPECT_FALSE(store->put(store->key_for_id(b.id), clone(b)));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(store->stats().misses, 5);
  EXPECT_EQ(store->stats().outages, 1);
  EXPECT_EQ(w.count("unreachable"), 1) << w.all();
}

TEST_F(RemoteStoreServer, DeadlineCutsAStalledServer) {
  Warnings ww;
  RemoteStore writer(config(server.url(), "model-a", ww));
  RemoteConfig cfg = config(server.url(), "model-a", warnings);
  cfg.deadline_ms = 100;
  RemoteStore store(cfg);
  const Block b = sample_block("kv:stalled", at::kFloat);
  const std::string key = store.key_for_id(b.id);
  ASSERT_TRUE(writer.put(key, clone(b))) << ww.all();
  server.pause();
  const auto t0 = Clock::now();
  const bool got = store.get(key, b.id).has_value();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  server.resume();
  EXPECT_FALSE(got);
  EXPECT_LT(s, 2.0) << "a get against a stalled server should end near the 100 ms deadline";
  EXPECT_EQ(store.stats().deadline, 1);
  EXPECT_EQ(store.stats().outages, 0);  // one late answer is not an outage
  // Resumed, the next operations work (a connection that timed out is not reused).
  std::optional<Block> again;
  for (const auto t1 = Clock::now(); !again && Clock::now() - t1 < std::chrono::seconds(10);) {
    again = store.get(key, b.id);
    if (!again) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(again.has_value()) << warnings.all();
  expect_same_block(b, *again);
}

TEST_F(RemoteStoreServer, AsyncWritesAreSeenByAnotherStoreOfTheNamespace) {
  Warnings w2, w3;
  std::vector<Block> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(sample_block("kv:async:" + std::to_string(i), at::kBFloat16));
  {
    RemoteStore writer(config(server.url(), "model-a", warnings));
    for (const auto& b : blocks) writer.put_async(writer.key_for_id(b.id), clone(b));
    ASSERT_TRUE(writer.flush(10000));
    EXPECT_EQ(writer.stats().puts, 5);
    EXPECT_EQ(writer.stats().dropped, 0);
  }
  RemoteStore reader(config(server.url(), "model-a", w2)), other(config(server.url(), "model-b", w3));
  std::vector<std::string> keys, ids;
  for (const auto& b : blocks) keys.push_back(reader.key_for_id(b.id)), ids.push_back(b.id);
  std::vector<std::optional<Block>> got = reader.get_many(keys, ids);
  ASSERT_EQ(got.size(), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    expect_same_block(blocks[i], *got[i]);
  }
  // Another namespace asks under its own keys: nothing there, nothing foreign read.
  for (const auto& b : blocks) EXPECT_FALSE(other.get(other.key_for_id(b.id), b.id).has_value());
  EXPECT_EQ(other.stats().misses, 5);
  EXPECT_EQ(other.stats().foreign, 0);
  EXPECT_TRUE(value_keys(server, "model-b", "i").empty());
  EXPECT_EQ(value_keys(server, "model-a", "i").size(), 5u);
}

// --- The BlockStore's remote tier ---------------------------------------------------------------

class BlockStoreRemote : public RemoteStoreServer {};

// A host budget of two and a half blocks of `block_bytes`, no device and no disk tier (a zero
// budget is skipped): what the host cannot hold goes to the remote tier.
StoreConfig two_in_host(const std::shared_ptr<RemoteStore>& remote, size_t block_bytes) {
  StoreConfig sc;
  sc.device = at::kCPU;
  sc.device_budget = 0;
  sc.host_budget = 2 * block_bytes + block_bytes / 2;
  sc.disk_budget = 0;
  sc.remote = remote;
  return sc;
}

TEST_F(BlockStoreRemote, DemotesToTheRemoteTierBitExact) {
  auto remote = std::make_shared<RemoteStore>(config(server.url(), "model-a", warnings));
  std::vector<Block> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(sample_block("blk:" + std::to_string(i), i % 2 ? at::kBFloat16 : at::kFloat));
  for (auto& b : blocks) b.layers.resize(2);
  // float32 blocks of 2652 bytes, bfloat16 ones of 1564; the host holds 6630: blocks 3 and 4 stay.
  const size_t nb = std::max(blocks[0].nbytes(), blocks[1].nbytes());
  ASSERT_EQ(nb, 2652u);
  ASSERT_EQ(blocks[1].nbytes(), 1564u);
  BlockStore store(two_in_host(remote, nb));
  for (const auto& b : blocks) store.put(clone(b), Tier::Host);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(store.tier_of(blocks[i].id), i < 3 ? Tier::Remote : Tier::Host) << i;
  EXPECT_EQ(store.count(Tier::Remote), 3u);
  EXPECT_EQ(store.count(Tier::Disk), 0u);
  // Content keys: the hash of each value's bytes, under the namespace.
  const std::vector<std::string> keys = value_keys(server, "model-a", "c");
  ASSERT_EQ(keys.size(), 3u);
  std::vector<std::string> expected;
  for (int i = 0; i < 3; ++i) expected.push_back(remote->key_for_value(remote->encode(blocks[i])));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(exists(server, expected[i])) << expected[i];
  // Read back bit-exact, staying in the remote tier.
  for (int i = 0; i < 5; ++i) {
    const Block got = store.get(blocks[i].id);
    expect_same_block(blocks[i], got);
    EXPECT_EQ(store.tier_of(blocks[i].id), i < 3 ? Tier::Remote : Tier::Host) << i;
  }
  const Block host = store.get_host(blocks[1].id);
  expect_same_block(blocks[1], host);
  // erase() deletes the remote value.
  EXPECT_TRUE(store.erase(blocks[0].id));
  EXPECT_FALSE(exists(server, expected[0]));
  EXPECT_FALSE(exists(server, expected[0] + ":m"));
  EXPECT_EQ(value_keys(server, "model-a", "c").size(), 2u);
  // A value deleted behind the store's back: a named loss, not garbage.
  ASSERT_EQ(server.command({"DEL", expected[1]}), "1");
  try {
    store.get(blocks[1].id);
    ADD_FAILURE() << "get() of a block the remote lost should throw";
  } catch (const LostData& e) {
    EXPECT_NE(std::string(e.what()).find(blocks[1].id), std::string::npos) << e.what();
  }
  EXPECT_THROW(store.peek(blocks[1].id), LostData);
  // take() moves a remote block out, bit-exact, and deletes its value.
  const Block taken = store.take(blocks[2].id);
  expect_same_block(blocks[2], taken);
  EXPECT_FALSE(store.contains(blocks[2].id));
  EXPECT_FALSE(exists(server, expected[2]));
  EXPECT_EQ(warnings.count("unreachable"), 0) << warnings.all();
}

TEST_F(BlockStoreRemote, UnreachableRemoteKeepsBlocksInHostMemory) {
  auto remote = std::make_shared<RemoteStore>(config(server.url(), "model-a", warnings));
  server.kill();
  std::vector<Block> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(sample_block("blk:" + std::to_string(i), at::kFloat));
  const size_t nb = blocks[0].nbytes();
  BlockStore store(two_in_host(remote, nb));
  for (const auto& b : blocks) EXPECT_NO_THROW(store.put(clone(b), Tier::Host));
  // Nothing lost: every block in host memory, over its budget.
  EXPECT_EQ(store.size(), 5u);
  EXPECT_EQ(store.count(Tier::Remote), 0u);
  EXPECT_EQ(store.count(Tier::Host), 5u);
  EXPECT_GT(store.bytes(Tier::Host), store.budget(Tier::Host));
  for (const auto& b : blocks) {
    EXPECT_EQ(store.tier_of(b.id), Tier::Host);
    expect_same_block(b, store.get(b.id));
  }
  EXPECT_EQ(remote->stats().outages, 1);
  EXPECT_EQ(warnings.count("unreachable"), 1) << warnings.all();
}

TEST_F(BlockStoreRemote, PublishedBlocksAreImportedByAnotherStore) {
  Warnings wb, wc;
  std::vector<Block> blocks;
  for (int l = 0; l < 3; ++l) blocks.push_back(sample_block("kv:0123456789abcdef:" + std::to_string(l), at::kFloat));
  std::vector<std::string> ids;
  for (const auto& b : blocks) ids.push_back(b.id);
  {
    StoreConfig sa;
    sa.remote = std::make_shared<RemoteStore>(config(server.url(), "model-a", warnings));
    sa.remote_publish = true;
    BlockStore a(sa);
    for (const auto& b : blocks) a.put(clone(b), Tier::Host);
    ASSERT_TRUE(a.remote()->flush(10000));
    EXPECT_EQ(a.remote()->stats().puts, 3);
  }  // "process" A ends; what it published stays
  EXPECT_EQ(value_keys(server, "model-a", "i").size(), 3u);

  StoreConfig sb;
  sb.remote = std::make_shared<RemoteStore>(config(server.url(), "model-a", wb));
  BlockStore b(sb);
  // All or none: with one identity nobody published, nothing comes in.
  std::vector<std::string> with_absent = ids;
  with_absent.push_back("kv:0123456789abcdef:9");
  EXPECT_FALSE(b.import_remote(with_absent));
  EXPECT_EQ(b.size(), 0u);
  ASSERT_TRUE(b.import_remote(ids, Tier::Host));
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(b.tier_of(ids[i]), Tier::Host);
    expect_same_block(blocks[i], b.get(ids[i]));
  }
  EXPECT_TRUE(b.import_remote(ids));  // already here: found without a read
  EXPECT_EQ(sb.remote->stats().gets, 7);
  EXPECT_EQ(sb.remote->stats().hits, 6);
  // A store of another model imports nothing.
  StoreConfig sc;
  sc.remote = std::make_shared<RemoteStore>(config(server.url(), "model-b", wc));
  BlockStore c(sc);
  EXPECT_FALSE(c.import_remote(ids));
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(sc.remote->stats().foreign, 0);
  // Without a remote store there is nothing to import from.
  BlockStore d(StoreConfig{});
  EXPECT_FALSE(d.import_remote(ids));
}

}  // namespace
}  // namespace wm
