// wm_plan_bench --kv-store against a redis-server of the test's own (tests/runtime/redis_server.h),
// on the embedded model, one short episode: a second process reuses the first one's chunk cache
// entries and acts exactly as a run without the store; damaged values, another model's values and a
// store lost mid-run (or absent from the start) are misses that change no action and end no run.
// Skipped when redis-server is not installed or the program is not built.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/build_paths.h"
#include "runtime/spill_file.h"
#include "tests/cli/program_runner.h"
#include "tests/temp_dir.h"
#include "tests/runtime/redis_server.h"

namespace wm::testing {
namespace {

// `episodes` episodes of three steps at most on a one-room house; full_recompute gives the other
// policies their KL.
std::vector<std::string> bench_args(const std::string& exe, int episodes) {
  return {exe, "--layout", "short", "--driver", "oracle", "--rooms", "1", "--locks", "1", "--objects", "1",
          "--memory-tokens", "64", "--episodes", std::to_string(episodes), "--max-steps", "3",
          "--policies", "full_recompute", "prefix_cache", "keep", "--threads", "1", "--device", "cpu"};
}

struct BenchRun {
  RunResult r;
  nlohmann::json j;
};

// Waits for a started run and reads its JSON.
BenchRun finish(Started& s, const fs::path& json, double timeout_s = 120) {
  BenchRun run;
  run.r = s.wait(timeout_s);
  EXPECT_TRUE(run.r.exited && run.r.code == 0) << "exit " << run.r.code << ", signal " << run.r.signal << "\n"
                                               << run.r.err;
  if (fs::exists(json)) run.j = nlohmann::json::parse(read_text(json));
  return run;
}

// What every policy did at every step: its action and whether its first token's top choice is
// full_recompute's.
std::vector<std::string> actions(const nlohmann::json& j) {
  std::vector<std::string> out;
  if (!j.is_object() || !j.contains("steps")) return out;
  for (const auto& s : j.at("steps"))
    out.push_back(s.at("policy").get<std::string>() + " e" + s.at("episode").dump() + " s" + s.at("step").dump() +
                  ": " + s.at("action").get<std::string>() + ", top-1 " + s.at("top1_agrees_with_full").dump());
  return out;
}

// Same actions as `want`, and per step the same KL from full_recompute up to 1e-9 (the K/V a run
// brings in are bit-exact, but a prompt whose prefix is loaded computes the rest in other passes
// than one computed whole: its logits differ by rounding, ~1e-13 in KL here).
void expect_same_steps(const nlohmann::json& got, const nlohmann::json& want, const std::string& what) {
  const std::vector<std::string> a = actions(got), b = actions(want);
  EXPECT_FALSE(b.empty()) << what;
  EXPECT_EQ(a, b) << what;
  if (a != b) return;
  for (size_t i = 0; i < a.size(); ++i) {
    const nlohmann::json &x = got.at("steps")[i].at("kl_from_full"), &y = want.at("steps")[i].at("kl_from_full");
    EXPECT_EQ(x.is_null(), y.is_null()) << what << ", " << a[i];
    if (!x.is_null() && !y.is_null())
      EXPECT_NEAR(x.get<double>(), y.get<double>(), 1e-9) << what << ", " << a[i];
  }
}

int64_t count_of(const nlohmann::json& j, const std::string& a, const std::string& b) {
  if (!j.is_object() || !j.contains(a) || !j.at(a).contains(b)) {
    ADD_FAILURE() << "no " << a << "." << b << " in the JSON";
    return -1;
  }
  return j.at(a).at(b).get<int64_t>();
}
int64_t cache_count(const nlohmann::json& j, const std::string& policy, const std::string& field) {
  if (!j.is_object() || !j.contains("caches") || !j.at("caches").contains(policy)) {
    ADD_FAILURE() << "no caches." << policy << " in the JSON";
    return -1;
  }
  return j.at("caches").at(policy).at(field).get<int64_t>();
}

int occurrences(const std::string& text, const std::string& word) {
  int n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

class KvStoreCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RedisServer::binary().empty()) GTEST_SKIP() << "redis-server is not installed";
    exe_ = program_path("wm_plan_bench");
    if (exe_.empty()) GTEST_SKIP() << "wm_plan_bench is not built";
    dir_ = make_temp_dir(std::string("wm_kv_store_cli_") +
                         ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_");
    ASSERT_TRUE(server_.start()) << "redis-server did not answer in " << server_.dir();
  }
  void TearDown() override {
    if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);
  }

  // Starts wm_plan_bench: `episodes` episodes, --kv-store `store` (none when empty), extra args,
  // the JSON into dir_/name.json.
  std::unique_ptr<Started> start(const std::string& name, const std::string& store, int episodes = 1,
                                 const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = bench_args(exe_, episodes);
    if (!store.empty())  // a deadline no loaded machine reaches: these runs are not about it
      for (const std::string a : {"--kv-store", store.c_str(), "--kv-store-deadline-ms", "5000"}) argv.push_back(a);
    for (const auto& a : extra) argv.push_back(a);
    argv.push_back("--json");
    argv.push_back(json_path(name).string());
    fs::remove(json_path(name));
    return std::make_unique<Started>(argv, dir_, WM_SOURCE_DIR,
                                     std::vector<std::pair<std::string, std::string>>{{"WM_KV_STORE_PASSWORD", ""}},
                                     Launch::Forked);
  }
  BenchRun run(const std::string& name, const std::string& store, int episodes = 1,
               const std::vector<std::string>& extra = {}) {
    auto s = start(name, store, episodes, extra);
    return finish(*s, json_path(name));
  }
  fs::path json_path(const std::string& name) const { return dir_ / (name + ".json"); }

  // The value keys of the store (without their metadata hashes) under a namespace (any: "*").
  std::vector<std::string> value_keys(const std::string& ns = "*") const {
    std::vector<std::string> out;
    for (const auto& k : server_.keys("wm:" + ns + ":i:*"))
      if (k.size() < 2 || k.compare(k.size() - 2, 2, ":m") != 0) out.push_back(k);
    return out;
  }

  // The run without a store that every run with one must act as (computed once for the suite:
  // it is the same deterministic run in every test, 0.6 s of CPU each).
  const BenchRun& baseline() {
    if (!baseline_) baseline_ = std::make_unique<BenchRun>(run("baseline", ""));
    return *baseline_;
  }
  static void TearDownTestSuite() { baseline_.reset(); }

  RedisServer server_;
  std::string exe_;
  fs::path dir_;
  static std::unique_ptr<BenchRun> baseline_;
};

std::unique_ptr<BenchRun> KvStoreCli::baseline_;

TEST_F(KvStoreCli, SecondProcessReusesTheFirstOnesEntries) {
  const BenchRun& base = baseline();
  ASSERT_FALSE(actions(base.j).empty());
  const BenchRun fill = run("fill", server_.url());
  const BenchRun reuse = run("reuse", server_.url());
  expect_same_steps(fill.j, base.j, "fill");
  expect_same_steps(reuse.j, base.j, "reuse");
  ASSERT_TRUE(fill.j.contains("kv_store")) << "a run with --kv-store reports its counters";
  EXPECT_FALSE(base.j.contains("kv_store"));
  EXPECT_EQ(fill.j.at("kv_store").at("namespace"), reuse.j.at("kv_store").at("namespace"));
  // The first run publishes what it computes, the second brings it in instead of computing it.
  EXPECT_GT(count_of(fill.j, "kv_store", "puts"), 0);
  EXPECT_EQ(count_of(fill.j, "kv_store", "put_failed") + count_of(fill.j, "kv_store", "dropped"), 0);
  EXPECT_GT(value_keys().size(), 0u);
  EXPECT_LE(static_cast<int64_t>(value_keys().size()), count_of(fill.j, "kv_store", "puts"));
  EXPECT_EQ(cache_count(fill.j, "keep", "remote_hits"), 0);
  EXPECT_GT(cache_count(fill.j, "keep", "prefilled_tokens"), 0);
  EXPECT_EQ(cache_count(fill.j, "keep", "prefilled_tokens"), cache_count(base.j, "keep", "prefilled_tokens"));
  for (const std::string policy : {"keep", "prefix_cache"}) {
    EXPECT_GT(cache_count(reuse.j, policy, "remote_hits"), 0) << policy;
    EXPECT_EQ(cache_count(reuse.j, policy, "remote_misses"), 0) << policy;
    EXPECT_EQ(cache_count(reuse.j, policy, "stored"), 0) << policy << ": nothing left to compute";
  }
  EXPECT_EQ(cache_count(reuse.j, "keep", "prefilled_tokens"), 0);
  EXPECT_GT(count_of(reuse.j, "kv_store", "hits"), 0);
  EXPECT_EQ(count_of(reuse.j, "kv_store", "misses"), 0);
  for (const char* bad : {"corrupt", "foreign", "outages", "deadline"}) {
    EXPECT_EQ(count_of(fill.j, "kv_store", bad), 0) << bad;
    EXPECT_EQ(count_of(reuse.j, "kv_store", bad), 0) << bad;
  }
  EXPECT_EQ(occurrences(fill.r.err + reuse.r.err, "warning"), 0) << fill.r.err << reuse.r.err;
}

TEST_F(KvStoreCli, DamagedValuesAreDetectedAndRecomputed) {
  const BenchRun& base = baseline();
  const BenchRun fill = run("fill", server_.url());
  const std::vector<std::string> keys = value_keys();
  ASSERT_FALSE(keys.empty());
  std::mt19937 rng(11);
  for (const auto& k : keys) {
    std::string garbage(64 + rng() % 4096, '\0');
    for (auto& c : garbage) c = static_cast<char>(rng() & 0xff);
    ASSERT_EQ(server_.command({"SET", k, garbage}), "OK");
  }
  const BenchRun again = run("again", server_.url());
  expect_same_steps(again.j, base.j, "again");
  EXPECT_GT(count_of(again.j, "kv_store", "corrupt"), 0);
  EXPECT_EQ(count_of(again.j, "kv_store", "hits"), 0);
  for (const std::string policy : {"keep", "prefix_cache"}) {
    EXPECT_EQ(cache_count(again.j, policy, "remote_hits"), 0) << policy;
    EXPECT_GT(cache_count(again.j, policy, "remote_misses"), 0) << policy;
    EXPECT_EQ(cache_count(again.j, policy, "prefilled_tokens"), cache_count(base.j, policy, "prefilled_tokens"))
        << policy << ": everything recomputed";
  }
  EXPECT_GT(occurrences(again.r.err, "not used"), 0) << again.r.err;
  // The recomputed entries replaced the garbage: every value is whole again.
  for (const auto& k : value_keys()) {
    const std::string v = server_.command({"GET", k});
    EXPECT_NO_THROW(decode_block(v.data(), v.size(), k)) << k;
  }
}

TEST_F(KvStoreCli, AnotherModelsValuesAreNeverUsed) {
  const BenchRun& base = baseline();
  // Random weights at the embedded model's shape: another model, another namespace.
  const BenchRun other = run("other", server_.url(), 1, {"--model", "assets/models/tiny-llm/config.json", "--seed", "3"});
  ASSERT_TRUE(other.j.contains("kv_store"));
  const std::string other_ns = other.j.at("kv_store").at("namespace");
  const std::vector<std::string> other_keys = value_keys(other_ns);
  ASSERT_FALSE(other_keys.empty());
  const BenchRun mine = run("mine", server_.url());
  const std::string ns = mine.j.at("kv_store").at("namespace");
  EXPECT_NE(ns, other_ns);
  expect_same_steps(mine.j, base.j, "mine");
  EXPECT_EQ(cache_count(mine.j, "keep", "remote_hits"), 0);
  EXPECT_EQ(cache_count(mine.j, "prefix_cache", "remote_hits"), 0);
  EXPECT_EQ(count_of(mine.j, "kv_store", "hits"), 0);
  EXPECT_EQ(count_of(mine.j, "kv_store", "foreign"), 0);  // other keys: never even read
  // The other model's values copied under every key of this model's: read, refused, recomputed.
  const std::vector<std::string> mine_keys = value_keys(ns);
  ASSERT_FALSE(mine_keys.empty());
  for (size_t i = 0; i < mine_keys.size(); ++i)
    ASSERT_EQ(server_.command({"SET", mine_keys[i], server_.command({"GET", other_keys[i % other_keys.size()]})}),
              "OK");
  const BenchRun forged = run("forged", server_.url());
  expect_same_steps(forged.j, base.j, "forged");
  EXPECT_GT(count_of(forged.j, "kv_store", "foreign"), 0);
  EXPECT_EQ(count_of(forged.j, "kv_store", "hits"), 0);
  EXPECT_EQ(count_of(forged.j, "kv_store", "corrupt"), 0);
  EXPECT_EQ(cache_count(forged.j, "keep", "remote_hits"), 0);
  EXPECT_EQ(cache_count(forged.j, "prefix_cache", "remote_hits"), 0);
  EXPECT_EQ(cache_count(forged.j, "keep", "prefilled_tokens"), cache_count(base.j, "keep", "prefilled_tokens"));
}

TEST_F(KvStoreCli, StoreLostMidRunOrAbsentEndsNoRun) {
  // Absent from the start: one warning, every operation a miss, the run as without a store.
  {
    RedisServer none;  // a folder with no server in it
    const BenchRun absent = run("absent", none.url());
    expect_same_steps(absent.j, baseline().j, "absent");
    EXPECT_EQ(occurrences(absent.r.err, "unreachable"), 1) << absent.r.err;
    EXPECT_EQ(count_of(absent.j, "kv_store", "outages"), 1);
    EXPECT_EQ(count_of(absent.j, "kv_store", "hits"), 0);
    EXPECT_FALSE(absent.j.at("kv_store").at("available").get<bool>());
  }
  // Lost mid-run: killed once the run has written values; enough episodes that it goes on for a
  // while after that (about 1 s without a store on a 2-core machine).
  const int episodes = 20;
  const BenchRun base = run("long_baseline", "", episodes);
  auto s = start("killed", server_.url(), episodes);
  bool wrote = false;
  for (const auto t0 = std::chrono::steady_clock::now();
       !wrote && s->running() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60);) {
    wrote = !value_keys().empty();
    if (!wrote) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const bool running = s->running();
  server_.kill();
  const BenchRun killed = finish(*s, json_path("killed"));
  ASSERT_TRUE(wrote);
  ASSERT_TRUE(running) << "the run ended before the store was lost: give it more episodes";
  expect_same_steps(killed.j, base.j, "killed");
  EXPECT_GE(count_of(killed.j, "kv_store", "outages"), 1);
  EXPECT_EQ(occurrences(killed.r.err, "unreachable"), 1) << killed.r.err;
  EXPECT_FALSE(killed.j.at("kv_store").at("available").get<bool>());
  // Back (empty): a filling run, then one that brings its entries in.
  ASSERT_TRUE(server_.start());
  const BenchRun fill = run("refill", server_.url());
  const BenchRun reuse = run("reuse", server_.url());
  expect_same_steps(reuse.j, baseline().j, "reuse");
  EXPECT_EQ(count_of(fill.j, "kv_store", "outages"), 0);
  EXPECT_GT(cache_count(reuse.j, "keep", "remote_hits"), 0);
  EXPECT_GT(cache_count(reuse.j, "prefix_cache", "remote_hits"), 0);
  EXPECT_EQ(cache_count(reuse.j, "keep", "prefilled_tokens"), 0);
}

}  // namespace
}  // namespace wm::testing
