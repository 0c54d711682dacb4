// wm_bench_kv_store against a redis-server of the test's own (tests/runtime/redis_server.h), with
// tiny settings (a second or two): it ends well, its JSON has a positive rate for put and get in
// every configuration (and redis-benchmark's beside them when that is installed), it leaves no key
// behind, and a bad or unreachable --kv-store ends it with a message naming the option. Skipped
// when redis-server is not installed or the program is not built.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/build_paths.h"
#include "tests/cli/program_runner.h"
#include "tests/temp_dir.h"
#include "tests/runtime/redis_server.h"

namespace wm::testing {
namespace {

class KvStoreBenchCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RedisServer::binary().empty()) GTEST_SKIP() << "redis-server is not installed";
    exe_ = program_path("wm_bench_kv_store");
    if (exe_.empty()) GTEST_SKIP() << "wm_bench_kv_store is not built";
    dir_ = make_temp_dir(std::string("wm_kv_store_bench_cli_") +
                         ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_");
  }
  void TearDown() override {
    if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);
  }

  RunResult run(const std::vector<std::string>& args, double timeout_s = 60) {
    std::vector<std::string> argv = {exe_};
    argv.insert(argv.end(), args.begin(), args.end());
    Started s(argv, dir_, WM_SOURCE_DIR, {{"WM_KV_STORE_PASSWORD", ""}});
    return s.wait(timeout_s);
  }

  std::string exe_;
  fs::path dir_;
};

TEST_F(KvStoreBenchCli, MeasuresPutAndGetAndLeavesNoKeys) {
  RedisServer server;
  ASSERT_TRUE(server.start()) << "redis-server did not answer in " << server.dir();
  const bool with_rb = ::access("/usr/bin/redis-benchmark", X_OK) == 0;
  const fs::path json = dir_ / "bench.json";
  std::vector<std::string> args = {"--kv-store", server.url(), "--shapes", "tiny", "qwen2-0.5b", "--tokens", "64",
                                   "--threads", "1", "2", "--batch", "4", "--rounds", "1", "--blocks", "8",
                                   "--json", json.string()};
  if (with_rb) args.insert(args.end(), {"--baseline-s", "0.1", "--redis-benchmark", "/usr/bin/redis-benchmark"});
  else args.insert(args.end(), {"--baseline-s", "0"});  // without redis-benchmark: our figures alone
  const RunResult r = run(args);
  ASSERT_TRUE(r.exited && r.code == 0) << "exit " << r.code << ", signal " << r.signal << "\n" << r.err;
  ASSERT_TRUE(fs::exists(json)) << r.err;
  const auto j = nlohmann::json::parse(read_text(json));
  ASSERT_EQ(j.at("configs").size(), 4u) << j.dump(2);  // 2 shapes x 2 thread counts x 1 batch
  for (const auto& c : j.at("configs")) {
    const std::string what = c.at("shape").get<std::string>() + " " + c.at("threads").dump();
    EXPECT_GT(c.at("put").at("blocks_per_s").get<double>(), 0) << what;
    EXPECT_GT(c.at("get").at("blocks_per_s").get<double>(), 0) << what;
    EXPECT_GT(c.at("put").at("mib_per_s").get<double>(), 0) << what;
    if (with_rb) {
      EXPECT_GT(c.at("redis_benchmark").at("set").at("requests_per_s").get<double>(), 0) << what;
      EXPECT_GT(c.at("redis_benchmark").at("get").at("requests_per_s").get<double>(), 0) << what;
      EXPECT_GT(c.at("ratio").at("put_over_set").get<double>(), 0) << what;
    }
    EXPECT_EQ(c.at("blocks_per_round").get<int>(), 8 * c.at("threads").get<int>()) << what;
    // A layer's K and V of 64 tokens in float32: 2 x kv_heads x 64 x head_dim x 4 bytes, and the
    // positions (int64) and log-weights (float32) of 64 tokens.
    const int64_t kv = 2LL * c.at("kv_heads").get<int>() * 64 * c.at("head_dim").get<int>() * 4;
    EXPECT_EQ(c.at("block_bytes").get<int64_t>(), kv + 64 * 8 + 64 * 4) << what;
    EXPECT_GT(c.at("value_bytes").get<int64_t>(), c.at("block_bytes").get<int64_t>()) << what;  // + header, checksum
  }
  // The tiny shape is the embedded LLM's (assets/models/tiny-llm/config.json: 2 KV heads of 32).
  EXPECT_EQ(j.at("configs")[0].at("kv_heads").get<int>(), 2);
  EXPECT_EQ(j.at("configs")[0].at("head_dim").get<int>(), 32);
  EXPECT_EQ(j.at("configs")[2].at("head_dim").get<int>(), 64);
  EXPECT_EQ(j.at("store_stats").at("put_failed").get<int64_t>(), 0);
  EXPECT_EQ(j.at("store_stats").at("misses").get<int64_t>(), 0);
  // Its own namespace's keys and redis-benchmark's key are gone.
  EXPECT_EQ(server.keys("*"), std::vector<std::string>());
  EXPECT_NE(r.out.find("ratio"), std::string::npos) << r.out;
}

TEST_F(KvStoreBenchCli, BadStoreNamesTheOption) {
  for (const std::string& url : {std::string("http://localhost:6379"), std::string("unix:///nonexistent/wm.sock")}) {
    const RunResult r = run({"--kv-store", url, "--rounds", "1", "--blocks", "1"});
    EXPECT_TRUE(r.exited) << url;
    EXPECT_NE(r.code, 0) << url;
    EXPECT_NE(r.err.find("--kv-store"), std::string::npos) << url << ": " << r.err;
  }
  const RunResult r = run({"--rounds", "1"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--kv-store"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace wm::testing
