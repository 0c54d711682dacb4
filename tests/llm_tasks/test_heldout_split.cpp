// The dev/test split of held-out samples and of suites: settings are tuned on dev, figures
// reported on test, and the two never share a sample.
#include <gtest/gtest.h>

#include <set>

#include "tools/llm_tasks/sample.h"
#include "tools/world/suite.h"

namespace wm::llmtasks {
namespace {

TEST(HeldoutSplit, RangesAreNamedAndDisjoint) {
  EXPECT_STREQ(heldout_split(0, 50), "dev");
  EXPECT_STREQ(heldout_split(kDevEnd - 10, 10), "dev");
  EXPECT_STREQ(heldout_split(kDevEnd - 10, 11), "neither") << "a range that leaves dev is not dev";
  EXPECT_STREQ(heldout_split(kDevEnd, 5), "neither");
  EXPECT_STREQ(heldout_split(kTestFirst, 50), "test");
  EXPECT_STREQ(heldout_split(kTestFirst - 1, 2), "neither");
  EXPECT_STREQ(heldout_split(0, kTestFirst + 1), "neither");
  // Dev and test samples are other seeds, all held out.
  std::set<uint64_t> dev, test;
  for (uint64_t s : heldout_seeds(0, 100)) dev.insert(s);
  for (uint64_t s : heldout_seeds(kTestFirst, 100)) test.insert(s);
  for (uint64_t s : test) {
    EXPECT_TRUE(is_heldout(s));
    EXPECT_EQ(dev.count(s), 0u);
  }
}

TEST(HeldoutSplit, SuitesBySeed) {
  world::Suite s;
  EXPECT_STREQ(world::suite_split(s), "neither") << "unknown generator";
  s.gen_seed = 60, s.gen_count = 60;
  EXPECT_STREQ(world::suite_split(s), "dev");
  s.gen_seed = 2000000;
  EXPECT_STREQ(world::suite_split(s), "test");
  s.gen_seed = 1500000;
  EXPECT_STREQ(world::suite_split(s), "neither");
}

}  // namespace
}  // namespace wm::llmtasks
