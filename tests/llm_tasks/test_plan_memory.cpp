// Tests of the plan house's memory of real prose (tools/llm_tasks/plan_memory.h): notes from the
// split of the episode's seed, deterministic per seed, near their budget, spread between the
// house's lines without touching them. The handbook itself is needed by one test, skipped with a
// message when the Debian package is not installed.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "tools/llm_tasks/plan_memory.h"
#include "tools/llm_tasks/plan_world.h"
#include "tools/llm_tasks/prose.h"
#include "tools/llm_tasks/sample.h"

namespace wm::llmtasks {
namespace plan_memory_test {

// Made-up paragraphs, distinct everywhere and of different lengths: document d's paragraph p.
std::shared_ptr<const ProseCorpus> made_up_corpus() {
  std::vector<ProseCorpus::Document> docs;
  for (int d = 0; d < 6; ++d) {
    ProseCorpus::Document doc{"doc" + std::to_string(d) + ".html", {}};
    for (int p = 0; p < 40; ++p)
      doc.paragraphs.push_back("Document " + std::to_string(d) + " paragraph " + std::to_string(p) +
                               " says how a mirror is chosen" + std::string(static_cast<size_t>(p % 7) * 9, '.'));
    docs.push_back(std::move(doc));
  }
  return std::make_shared<const ProseCorpus>(std::move(docs), "made-up");
}

std::set<std::string> as_set(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

// Checks notes of `seed` against the corpus: from the seed's split only, consecutive there from
// `first`, the total within one paragraph of the budget, the same on a second draw.
void expect_notes_of_split(const ProseCorpus& corpus, uint64_t seed, int64_t budget, ProseSplit want) {
  const TokenCounter count = bytes_counter(4.0);
  const ProseNotes a = make_prose_notes(seed, budget, count, corpus);
  ASSERT_EQ(a.split, want) << seed;
  ASSERT_FALSE(a.paragraphs.empty());
  const std::vector<std::string>& mine = corpus.paragraphs(want);
  const std::set<std::string> other = as_set(corpus.paragraphs(want == ProseSplit::Dev ? ProseSplit::Test : ProseSplit::Dev));
  int64_t tokens = 0, longest = 0;
  for (size_t k = 0; k < a.paragraphs.size(); ++k) {
    EXPECT_EQ(a.paragraphs[k], mine[(a.first + k) % mine.size()]) << "note " << k;
    EXPECT_EQ(other.count(a.paragraphs[k]), 0u) << "note " << k << " is in the other split";
    tokens += count(a.paragraphs[k] + "\n");
    longest = std::max(longest, count(a.paragraphs[k] + "\n"));
  }
  EXPECT_EQ(a.tokens, tokens);
  EXPECT_LE(a.tokens, budget + longest);
  const ProseNotes b = make_prose_notes(seed, budget, count, corpus);
  EXPECT_EQ(b.first, a.first);
  EXPECT_EQ(b.paragraphs, a.paragraphs);
}

TEST(PlanMemory, NotesComeFromTheSeedsSplitDeterministically) {
  const auto corpus = made_up_corpus();
  for (uint64_t i : {0ull, 7ull, 999ull})
    expect_notes_of_split(*corpus, heldout_seed(i), 400, ProseSplit::Dev);
  for (uint64_t i : {kTestFirst, kTestFirst + 7})
    expect_notes_of_split(*corpus, heldout_seed(i), 400, ProseSplit::Test);
  expect_notes_of_split(*corpus, training_seed(3), 400, ProseSplit::Dev);
  // Different episodes start at different paragraphs (two of three seeds at least).
  const TokenCounter count = bytes_counter(4.0);
  const std::set<size_t> firsts = {make_prose_notes(heldout_seed(1), 400, count, *corpus).first,
                                   make_prose_notes(heldout_seed(2), 400, count, *corpus).first,
                                   make_prose_notes(heldout_seed(3), 400, count, *corpus).first};
  EXPECT_GE(firsts.size(), 2u);
  EXPECT_TRUE(make_prose_notes(heldout_seed(1), 0, count, *corpus).paragraphs.empty());
}

TEST(PlanMemory, NotesSitBetweenTheHousesLinesInAFixedLayout) {
  const auto corpus = made_up_corpus();
  Goal goal;
  World w = World::generate(heldout_seed(5), WorldSpec{}, &goal);
  const ProseNotes notes = make_prose_notes(heldout_seed(5), 300, bytes_counter(4.0), *corpus);
  const size_t n = notes.paragraphs.size();
  ASSERT_GE(n, 2u);
  auto check = [&](const World& world) {
    const std::vector<Segment> house = world.memory_lines();
    const std::vector<Segment> mem = memory_with_notes(house, notes);
    ASSERT_EQ(mem.size(), house.size() + n);
    EXPECT_EQ(mem[0].id, "mem:agent");
    std::vector<Segment> lines;
    size_t k = 0;
    for (const Segment& s : mem) {
      if (s.kind != "note") {
        lines.push_back(s);
        continue;
      }
      ASSERT_LT(k, n);
      EXPECT_EQ(s.id, "note:" + std::to_string(k));
      EXPECT_EQ(s.text, notes.paragraphs[k] + "\n");
      EXPECT_EQ(lines.size(), k * house.size() / n + 1) << "house lines before note " << k;
      ++k;
    }
    EXPECT_EQ(k, n);
    ASSERT_EQ(lines.size(), house.size());
    for (size_t i = 0; i < house.size(); ++i) EXPECT_EQ(lines[i].text, house[i].text);
  };
  check(w);
  // After an action the lines change, not the layout.
  ASSERT_TRUE(w.execute(w.oracle_next_action(goal)));
  check(w);
  EXPECT_EQ(memory_with_notes(w.memory_lines(), ProseNotes{}).size(), w.memory_lines().size());
}

// The handbook: dev episodes' notes from its dev files, test episodes' from its test files.
TEST(PlanMemory, HandbookNotesFromTheEpisodesSplit) {
  if (!std::filesystem::is_directory(default_prose_dir()))
    GTEST_SKIP() << "the Debian Administrator's Handbook is not installed at " << default_prose_dir()
                 << " (apt-get install debian-handbook; tools/setup.sh does)";
  const std::shared_ptr<const ProseCorpus> corpus = default_prose_corpus();
  for (uint64_t i : {0ull, 1ull, 12345ull}) expect_notes_of_split(*corpus, heldout_seed(i), 1200, ProseSplit::Dev);
  for (uint64_t i : {kTestFirst, kTestFirst + 1, kTestFirst + 777})
    expect_notes_of_split(*corpus, heldout_seed(i), 1200, ProseSplit::Test);
}

}  // namespace plan_memory_test
}  // namespace wm::llmtasks
