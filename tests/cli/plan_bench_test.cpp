// wm_plan_bench end to end on the embedded model, a few short episodes: the two prompt layouts
// (the short one has no worked example, so its prompts are shorter by at least the example's
// tokens), and the pairing with full_recompute (prefix_cache is exact, so it loses and wins no
// step against it; McNemar's p is then 1); --memory-text prose, its notes from the episodes' split
// of the handbook. Skipped when the program (or the handbook, for prose) is not there.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/build_paths.h"
#include "tests/cli/program_runner.h"
#include "tests/temp_dir.h"
#include "tools/llm_tasks/prose.h"

namespace wm::testing {
namespace {

nlohmann::json run_bench(const std::string& exe, const fs::path& dir, const std::string& layout) {
  const std::string json = (dir / (layout + ".json")).string();
  const RunResult r = run_program({exe, "--layout", layout, "--driver", "oracle", "--rooms", "1", "--locks", "1",
                                   "--objects", "1", "--memory-tokens", "64", "--episodes", "2", "--max-steps", "3",
                                   "--policies", "full_recompute", "prefix_cache", "full_reuse", "--threads", "1",
                                   "--device", "cpu", "--json", json},
                                  dir, WM_SOURCE_DIR, 300);
  EXPECT_TRUE(r.exited && r.code == 0) << r.err;
  return nlohmann::json::parse(read_text(json));
}

TEST(PlanBenchRun, LayoutsAndPairingWithFullRecompute) {
  const std::string exe = program_path("wm_plan_bench");
  if (exe.empty()) GTEST_SKIP() << "wm_plan_bench is not built";
  const fs::path dir = make_temp_dir("wm_plan_bench_run_");
  const nlohmann::json shrt = run_bench(exe, dir, "short"), lng = run_bench(exe, dir, "long");
  ASSERT_EQ(shrt.at("config").at("layout"), "short");
  ASSERT_EQ(lng.at("config").at("layout"), "long");
  auto row = [](const nlohmann::json& j, const std::string& policy) {
    for (const auto& s : j.at("summary"))
      if (s.at("policy") == policy) return s;
    ADD_FAILURE() << "no row for " << policy;
    return nlohmann::json();
  };
  // Same episodes, same oracle course: the prompts differ only by the static texts. The long
  // rules and the example together are well over 150 tokens of the embedded tokenizer.
  const double short_tokens = row(shrt, "full_recompute").at("prompt_tokens").get<double>();
  const double long_tokens = row(lng, "full_recompute").at("prompt_tokens").get<double>();
  EXPECT_GT(long_tokens - short_tokens, 150.0) << short_tokens << " against " << long_tokens;
  for (const nlohmann::json* j : {&shrt, &lng}) {
    const nlohmann::json p = row(*j, "prefix_cache").at("vs_full_recompute");
    EXPECT_EQ(p.at("lost").get<int>(), 0);
    EXPECT_EQ(p.at("won").get<int>(), 0);
    EXPECT_DOUBLE_EQ(p.at("mcnemar_p").get<double>(), 1.0);
    // Steps agree with the oracle as often under full_recompute as under prefix_cache.
    EXPECT_EQ(row(*j, "full_recompute").at("oracle_agreement"), row(*j, "prefix_cache").at("oracle_agreement"));
  }
  fs::remove_all(dir);
}

// --memory-text prose: a dev and a test episode, their notes from the handbook's split of that
// name, the memory filled near --memory-tokens; the actions of prefix_cache (exact) equal
// full_recompute's.
TEST(PlanBenchRun, ProseMemoryFromTheEpisodesSplit) {
  const std::string exe = program_path("wm_plan_bench");
  if (exe.empty()) GTEST_SKIP() << "wm_plan_bench is not built";
  if (!fs::is_directory(wm::llmtasks::default_prose_dir()))
    GTEST_SKIP() << "the Debian Administrator's Handbook is not installed at " << wm::llmtasks::default_prose_dir();
  const fs::path dir = make_temp_dir("wm_plan_bench_prose_");
  for (const std::string split : {"dev", "test"}) {
    const std::string json = (dir / (split + ".json")).string();
    const RunResult r = run_program({exe, "--memory-text", "prose", "--first-episode", split == "dev" ? "3" : "2000003",
                                     "--driver", "oracle", "--layout", "short", "--rooms", "1", "--locks", "1",
                                     "--objects", "1", "--memory-tokens", "400", "--episodes", "1", "--max-steps", "2",
                                     "--policies", "full_recompute", "prefix_cache", "--threads", "1", "--device",
                                     "cpu", "--json", json},
                                    dir, WM_SOURCE_DIR, 300);
    ASSERT_TRUE(r.exited && r.code == 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(read_text(json));
    EXPECT_EQ(j.at("config").at("memory_text"), "prose");
    const nlohmann::json& ep = j.at("episodes").at(0);
    EXPECT_EQ(ep.at("notes").at("split"), split);
    EXPECT_GE(ep.at("notes").at("paragraphs").get<int>(), 1);
    EXPECT_GT(ep.at("memory_tokens").get<int>(), 200) << ep.dump();
    for (const auto& s : j.at("summary"))
      if (s.at("policy") == "prefix_cache") EXPECT_EQ(s.at("action_agreement_with_full").get<double>(), 1.0);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace wm::testing
