// wm_llm --chat --session NAME --kv-store URL: a conversation kept in a redis-server of the test's
// own goes on in a later process exactly as in one process that took every turn.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "program_runner.h"
#include "runtime/build_paths.h"
#include "tests/runtime/redis_server.h"

namespace wm::testing {
namespace {

class LlmSessionCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RedisServer::binary().empty()) GTEST_SKIP() << "redis-server is not installed";
    llm_ = program_path("wm_llm");
    if (llm_.empty()) GTEST_SKIP() << "wm_llm is not built";
    ASSERT_TRUE(server_.start());
    dir_ = fs::path(server_.dir()) / "runs";
    fs::create_directories(dir_);
  }
  // One turn in a process of its own, sampled (so that the generation count carried between
  // processes matters) with a fixed seed.
  RunResult turn(const std::string& text, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {llm_, "--chat", "-n", "10", "-t", "1.0", "--seed", "5", "--no-stream",
                                     "--system", "Answer briefly.", "--threads", "1", "-p", text};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_program(argv, dir_, WM_SOURCE_DIR, 120, Launch::Forked);
  }
  std::vector<std::string> session(const std::string& name) { return {"--session", name, "--kv-store", server_.url()}; }

  std::string llm_;
  RedisServer server_;
  fs::path dir_;
};

const std::vector<std::string> kTurns = {"Recall fada: 3117", "Recall piti: 42", "Recall fada:"};

TEST_F(LlmSessionCli, ThreeProcessesSayWhatOneProcessSays) {
  // The reference: one process, every turn a line of standard input.
  const std::string cmd = "printf 'Recall fada: 3117\\nRecall piti: 42\\nRecall fada:\\n' | '" + llm_ +
                          "' --chat -n 10 -t 1.0 --seed 5 --no-stream --system 'Answer briefly.' --threads 1";
  const RunResult whole = run_program({"/bin/sh", "-c", cmd}, dir_, WM_SOURCE_DIR, 120);
  ASSERT_TRUE(whole.exited && whole.code == 0) << whole.err;
  std::string parts;
  for (size_t i = 0; i < kTurns.size(); ++i) {
    const RunResult r = turn(kTurns[i], session("conv"));
    ASSERT_TRUE(r.exited && r.code == 0) << r.err;
    EXPECT_NE(r.err.find(i == 0 ? "session 'conv' is new" : "session 'conv' resumed"), std::string::npos) << r.err;
    parts += r.out;
  }
  EXPECT_EQ(parts, whole.out);
  EXPECT_NE(whole.out.find_first_not_of("\n"), std::string::npos) << "the answers hold more than newlines";
  // Another name is another conversation; --session-reset starts one afresh.
  const RunResult fresh = turn(kTurns[0], session("other"));
  const RunResult reset = turn(kTurns[0], [&] {
    auto v = session("conv");
    v.push_back("--session-reset");
    return v;
  }());
  ASSERT_TRUE(fresh.exited && fresh.code == 0 && reset.exited && reset.code == 0) << fresh.err << reset.err;
  EXPECT_EQ(fresh.out, reset.out);
  EXPECT_NE(reset.err.find("starts afresh"), std::string::npos) << reset.err;
}

TEST_F(LlmSessionCli, RefusesWhatWouldLoseTheConversation) {
  // Options that do not go together.
  RunResult r = turn(kTurns[0], {"--session", "x"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--kv-store"), std::string::npos) << r.err;
  r = turn(kTurns[0], {"--kv-store", server_.url()});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--session"), std::string::npos) << r.err;
  r = run_program({llm_, "-p", "hi", "--session", "x", "--kv-store", server_.url()}, dir_, WM_SOURCE_DIR, 60);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--chat"), std::string::npos) << r.err;
  r = turn(kTurns[0], {"--session", "x", "--kv-store", "redis://user:pw@localhost"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("WM_KV_STORE_PASSWORD"), std::string::npos) << r.err;
  // A saved conversation, then the store gone: the next turn fails, it does not start afresh.
  ASSERT_EQ(turn(kTurns[0], session("kept")).code, 0);
  server_.kill();
  r = turn(kTurns[1], session("kept"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("neither loaded nor started afresh"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "") << "no answer without the conversation";
}

// wm_llm_bench --bank-tier redis: evoke's banked blocks beyond a small host budget live in the
// store and come back bit for bit: the same answers, evictions and recoveries as all in memory.
TEST_F(LlmSessionCli, EvokeBankInRedisAnswersAsInMemory) {
  const std::string bench = program_path("wm_llm_bench");
  if (bench.empty()) GTEST_SKIP() << "wm_llm_bench is not built";
  const std::vector<std::string> base = {bench,     "--tasks", "multifact", "--contexts", "512", "--policies", "evoke",
                                         "--budgets", "25%",     "--samples", "3",          "--threads", "1"};
  auto run = [&](const std::vector<std::string>& extra, const std::string& json) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("--json");
    argv.push_back((dir_ / json).string());
    const RunResult r = run_program(argv, dir_, WM_SOURCE_DIR, 300);
    EXPECT_TRUE(r.exited && r.code == 0) << r.err;
    return nlohmann::json::parse(read_text(dir_ / json)).at("results").at(0);
  };
  const nlohmann::json mem = run({}, "mem.json");
  const nlohmann::json red =
      run({"--bank-host-mib", "0.05", "--bank-tier", "redis", "--kv-store", server_.url()}, "redis.json");
  for (const char* k : {"answers", "accuracy", "evictions_per_sample", "recoveries_per_sample", "samples_all_right"})
    EXPECT_EQ(mem.at(k), red.at(k)) << k;
  EXPECT_GT(red.at("recoveries_per_sample").get<double>(), 0) << "the test needs blocks brought back";
  EXPECT_GT(red.at("bank_bytes").at("remote").get<size_t>(), 0u) << "blocks beyond 0.05 MiB went to the store";
  EXPECT_EQ(mem.at("bank_bytes").at("remote").get<size_t>(), 0u);
  // Refused by name: a redis tier without a store, a store with the disk tier.
  RunResult r = run_program({bench, "--bank-host-mib", "1", "--bank-tier", "redis"}, dir_, WM_SOURCE_DIR, 60);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--kv-store"), std::string::npos) << r.err;
  r = run_program({bench, "--kv-store", server_.url()}, dir_, WM_SOURCE_DIR, 60);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--bank-tier redis"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace wm::testing
