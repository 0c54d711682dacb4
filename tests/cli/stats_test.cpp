#include <gtest/gtest.h>

#include "tools/cli/stats.h"

namespace wm::cli {
namespace {

// Reference values of the Wilson score interval (z = 1.96): 7 of 10 gives 0.3968-0.8922, 0 of
// 40 gives 0-0.0876, 40 of 40 gives 0.9124-1; the interval holds the proportion and shrinks as
// n grows.
TEST(Stats, WilsonIntervalMatchesReferenceValues) {
  auto [lo, hi] = wilson95(7, 10);
  EXPECT_NEAR(lo, 0.39677, 1e-5);
  EXPECT_NEAR(hi, 0.89221, 1e-5);
  std::tie(lo, hi) = wilson95(0, 40);
  EXPECT_EQ(lo, 0.0);
  EXPECT_NEAR(hi, 0.08762, 1e-5);
  std::tie(lo, hi) = wilson95(40, 40);
  EXPECT_NEAR(lo, 0.91238, 1e-5);
  EXPECT_EQ(hi, 1.0);
  for (int64_t n : {10, 100, 1000}) {
    const auto [a, b] = wilson95(n / 2, n);
    EXPECT_LT(a, 0.5);
    EXPECT_GT(b, 0.5);
    EXPECT_LT(b - a, 1.0 / std::sqrt(static_cast<double>(n)) * 2.0);
  }
  EXPECT_EQ(wilson95(0, 0), std::make_pair(0.0, 0.0));
}

}  // namespace
}  // namespace wm::cli
