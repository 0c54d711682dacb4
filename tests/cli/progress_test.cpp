#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tools/cli/progress.h"

namespace wm::cli {
namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s.push_back(static_cast<char>(c));
  return s;
}

// Into a file (not a terminal): whole lines, no carriage return or escape; within the interval
// only the first update and the last are written.
TEST(ProgressLine, LogGetsWholeLinesAtMostOnePerInterval) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressLine p(3600, f);
    EXPECT_FALSE(p.tty());
    p.show(false, "step %d/%d", 1, 4);
    p.show(false, "step %d/%d", 2, 4);
    p.show(false, "step %d/%d", 3, 4);
    p.show(true, "step %d/%d", 4, 4);
  }
  EXPECT_EQ(contents(f), "step 1/4\nstep 4/4\n");
  std::fclose(f);

  // With no interval every update is a line, and finish() adds nothing after whole lines.
  f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressLine q(0, f);
    q.show(false, "a");
    q.show(false, "b");
    q.finish();
  }
  EXPECT_EQ(contents(f), "a\nb\n");
  std::fclose(f);
}

}  // namespace
}  // namespace wm::cli
