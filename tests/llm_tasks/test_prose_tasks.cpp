// Tests of the long-context tasks over real prose (tools/llm_tasks/prose.h, ruler.cpp): the
// corpus reader, determinism per seed, the dev/test split on disjoint text, each answer stated
// once in the context where its depth puts it, lengths, the chat format, and answer scoring.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "llmkv/tokenizer.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tests/temp_dir.h"
#include "tools/llm_tasks/prose.h"
#include "tools/llm_tasks/sample.h"
#include "tools/llm_train/data.h"

namespace wm::llmtasks {
namespace prose_task_test {

// A corpus of made-up paragraphs, distinct everywhere: what the generators need, without the
// Debian package (tests that need the handbook itself use real_corpus()).
std::shared_ptr<const ProseCorpus> made_up_corpus() {
  std::vector<ProseCorpus::Document> docs;
  for (int d = 0; d < 8; ++d) {
    ProseCorpus::Document doc{"doc" + std::to_string(d) + ".html", {}};
    for (int p = 0; p < 60; ++p)
      doc.paragraphs.push_back("Document " + std::to_string(d) + " paragraph " + std::to_string(p) +
                               " explains how a package manager resolves dependencies, keeps a cache of archives and "
                               "lets an administrator pin versions from several sources.");
    docs.push_back(std::move(doc));
  }
  return std::make_shared<const ProseCorpus>(std::move(docs), "made-up");
}

// The handbook when installed (tools/setup.sh installs debian-handbook), else null.
std::shared_ptr<const ProseCorpus> real_corpus() {
  if (!std::filesystem::is_directory(default_prose_dir())) return nullptr;
  return default_prose_corpus();
}

GenOptions opts(int64_t tokens, std::shared_ptr<const ProseCorpus> corpus) {
  GenOptions o;
  o.target_tokens = tokens;
  o.count = bytes_counter(4.0);
  o.prose = std::move(corpus);
  return o;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The text before the question: instruction, haystack and needles.
std::string context_of(const Sample& s) { return s.text_before(s.find("question")); }

std::vector<std::string> answers_of(const Sample& s) { return s.meta.at("answers").get<std::vector<std::string>>(); }

}  // namespace prose_task_test

using namespace prose_task_test;

TEST(ProseTasks, HtmlParagraphsToText) {
  EXPECT_EQ(html_to_text("\n\t\t<acronym class=\"a\">APT</acronym> is a &ldquo;vast&rdquo; project &amp; more&#8212;"
                         "<code>apt-get</code>&nbsp;x &#x41;.\n  "),
            "APT is a \u201Cvast\u201D project & more\u2014apt-get x A.");
  EXPECT_EQ(html_to_text("a &unknown; b"), "a &unknown; b");
  // A surrogate or out-of-range code point is no character: kept as the text it was, never as
  // invalid UTF-8.
  EXPECT_EQ(html_to_text("x &#xD800; &#55296; &#x110000; y"), "x &#xD800; &#55296; &#x110000; y");
  const std::filesystem::path scratch = wm::testing::make_temp_dir("wm_prose_html_");
  const std::string dir = (scratch / "prose_html").string();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/a.html") << "<div class=\"para\">One two three four five six seven eight.</div>"
                                    "<div class=\"para\">Too short here.</div>"
                                    "<div class=\"para\">Nested <div>one two three four five six seven eight</div>";
  std::ofstream(dir + "/b.html") << "<div class=\"para\">\n Nine ten eleven twelve thirteen fourteen fifteen sixteen.\n</div>";
  const ProseCorpus c = ProseCorpus::load_html_dir(dir);
  EXPECT_EQ(c.paragraphs(ProseSplit::Dev), std::vector<std::string>{"One two three four five six seven eight."});
  EXPECT_EQ(c.paragraphs(ProseSplit::Test),
            std::vector<std::string>{"Nine ten eleven twelve thirteen fourteen fifteen sixteen."});
  EXPECT_THROW(ProseCorpus::load_html_dir(dir + "/missing"), Error);
  std::filesystem::remove_all(scratch);
}

TEST(ProseTasks, RepeatedParagraphsLeaveBothSplits) {
  const std::string shared = "This paragraph is in both files and must not be in either split.";
  const ProseCorpus c({{"a", {"only dev", shared}}, {"b", {shared, "only test"}}}, "t");
  EXPECT_EQ(c.paragraphs(ProseSplit::Dev), std::vector<std::string>{"only dev"});
  EXPECT_EQ(c.paragraphs(ProseSplit::Test), std::vector<std::string>{"only test"});
  EXPECT_THROW(ProseCorpus({{"a", {shared}}, {"b", {shared}}}, "t"), Error);
}

TEST(ProseTasks, SeedsPickTheirSplit) {
  EXPECT_EQ(prose_split_of(heldout_seed(0)), ProseSplit::Dev);
  EXPECT_EQ(prose_split_of(heldout_seed(kDevEnd - 1)), ProseSplit::Dev);
  EXPECT_EQ(prose_split_of(heldout_seed(kTestFirst)), ProseSplit::Test);
  EXPECT_EQ(prose_split_of(training_seed(kTestFirst)), ProseSplit::Dev);
}

TEST(ProseTasks, SameSeedSameSampleDifferentSeedDifferent) {
  const auto corpus = made_up_corpus();
  for (const std::string& t : prose_task_names()) {
    const Sample a = make_sample(t, heldout_seed(3), opts(1024, corpus));
    const Sample b = make_sample(t, heldout_seed(3), opts(1024, corpus));
    const Sample c = make_sample(t, heldout_seed(4), opts(1024, corpus));
    EXPECT_EQ(a.to_json(), b.to_json()) << t;
    EXPECT_NE(a.text(), c.text()) << t;
    EXPECT_EQ(a.task, t);
  }
}

TEST(ProseTasks, EachAnswerStatedOnceInTheContextInsideANeedle) {
  const auto corpus = made_up_corpus();
  for (const std::string& t : prose_task_names()) {
    for (uint64_t i = 0; i < 6; ++i) {
      const Sample s = make_sample(t, heldout_seed(i), opts(2048, corpus));
      const std::string ctx = context_of(s);
      const auto answers = answers_of(s);
      ASSERT_FALSE(answers.empty()) << t;
      ASSERT_EQ(s.targets().size(), answers.size()) << t;
      for (size_t k = 0; k < answers.size(); ++k) {
        // Variable names are stated twice (assigned, then assigned from); the others once.
        EXPECT_EQ(count_of(ctx, answers[k]), t == "prose_vartrack" && k + 1 < answers.size() ? 2u : 1u)
            << t << " seed " << i << " answer " << answers[k];
        EXPECT_EQ(s.segments[s.targets()[k]].text, " " + answers[k]) << t;
        bool in_needle = false;
        for (const Segment& g : s.segments) in_needle = in_needle || (g.kind == "needle" && count_of(g.text, answers[k]));
        EXPECT_TRUE(in_needle) << t;
      }
      if (t == "prose_vartrack") EXPECT_EQ(count_of(ctx, s.meta.at("value").get<std::string>()), 1u);
      for (const Segment& g : s.segments)
        if (g.kind == "filler") EXPECT_EQ(count_of(g.text, answers[0]), 0u) << t;
    }
  }
}

TEST(ProseTasks, NeedleSitsAtItsDepth) {
  const auto corpus = made_up_corpus();
  const TokenCounter count = bytes_counter(4.0);
  for (const std::string& t : {"prose_niah", "prose_qa"}) {
    for (double depth : {0.0, 0.3, 0.5, 0.9, 1.0}) {
      GenOptions o = opts(4096, corpus);
      o.niah_depths = {depth};
      const Sample s = make_sample(t, heldout_seed(7), o);
      int64_t before = 0, haystack = 0, paragraph = 0;
      bool seen = false;
      for (const Segment& g : s.segments) {
        if (g.kind == "needle") seen = true;
        if (g.kind != "filler") continue;
        const int64_t n = count(g.text);
        haystack += n, paragraph = std::max(paragraph, n);
        if (!seen) before += n;
      }
      ASSERT_TRUE(seen) << t;
      EXPECT_NEAR(static_cast<double>(before), depth * haystack, paragraph) << t << " at depth " << depth;
    }
  }
  // Without depths given, consecutive held-out samples spread over the haystack.
  std::set<double> depths;
  for (uint64_t i = 0; i < 11; ++i)
    depths.insert(make_sample("prose_niah", heldout_seed(i), opts(1024, corpus)).meta["needles"][0]["depth"].get<double>());
  EXPECT_EQ(depths.size(), 11u);
}

TEST(ProseTasks, LengthsNearTarget) {
  const auto corpus = made_up_corpus();
  const TokenCounter count = bytes_counter(4.0);
  for (const std::string& t : prose_task_names()) {
    for (int64_t target : {1024, 2048, 4096, 8192}) {
      const Sample s = make_sample(t, heldout_seed(1), opts(target, corpus));
      int64_t sum = 0, paragraph = 0;
      for (const Segment& g : s.segments) {
        sum += count(g.text);
        if (g.kind == "filler") paragraph = std::max(paragraph, count(g.text));
      }
      EXPECT_EQ(s.meta["tokens"].get<int64_t>(), sum) << t;
      EXPECT_LE(std::abs(sum - target), paragraph / 2 + 1) << t << " at " << target;
    }
  }
}

TEST(ProseTasks, ChatFormatWrapsTheMessage) {
  GenOptions o = opts(1024, made_up_corpus());
  o.chat.before_user = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n";
  o.chat.after_user = "<|im_end|>\n<|im_start|>assistant\n";
  for (const std::string& t : prose_task_names()) {
    const Sample s = make_sample(t, heldout_seed(2), o);
    EXPECT_EQ(s.segments.front().text.rfind(o.chat.before_user, 0), 0u) << t;
    EXPECT_EQ(s.segments.front().kind, "system");
    const Segment& q = s.segments.at(s.find("question"));
    EXPECT_EQ(q.kind, "query");
    EXPECT_EQ(count_of(q.text, o.chat.after_user), 1u) << t;
    EXPECT_EQ(count_of(s.text(), "<|im_start|>"), 3u) << t;
  }
}

// Segment-wise ids equal the whole text's (a segment boundary leaves no mark in the ids).
TEST(ProseTasks, SegmentWiseIdsEqualWholeTextIds) {
  const auto tok =
      llm::Tokenizer::load(std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/cpp_trained.tokenizer.json");
  for (const std::string& t : prose_task_names()) {
    GenOptions o = opts(1024, made_up_corpus());
    o.count = llmdata::token_counter(tok);
    const Sample s = make_sample(t, heldout_seed(5), o);
    EXPECT_EQ(llmdata::tokenize(s, tok).ids, tok.encode(s.text(), true)) << t;
  }
}

TEST(ProseTasks, DevAndTestHaystacksComeFromDisjointText) {
  const auto corpus = real_corpus();
  if (!corpus) GTEST_SKIP() << "the Debian Administrator's Handbook is not at " << default_prose_dir()
                            << " (tools/setup.sh installs debian-handbook)";
  const auto& dev = corpus->paragraphs(ProseSplit::Dev);
  const auto& test = corpus->paragraphs(ProseSplit::Test);
  const std::set<std::string> dev_set(dev.begin(), dev.end()), test_set(test.begin(), test.end());
  EXPECT_EQ(dev_set.size(), dev.size());
  for (const auto& p : test) EXPECT_EQ(dev_set.count(p), 0u);
  // Enough text for an 8k-token haystack (bytes/4) in each split, from more than one file.
  for (ProseSplit split : {ProseSplit::Dev, ProseSplit::Test}) {
    size_t bytes = 0;
    for (const auto& p : corpus->paragraphs(split)) bytes += p.size();
    EXPECT_GT(bytes, 4u * 8192 * 4) << prose_split_name(split);
    EXPECT_GT(corpus->documents(split).size(), 20u);
  }
  for (const std::string& t : prose_task_names()) {
    for (uint64_t i = 0; i < 3; ++i) {
      const Sample d = make_sample(t, heldout_seed(i), opts(4096, corpus));
      const Sample s = make_sample(t, heldout_seed(kTestFirst + i), opts(4096, corpus));
      EXPECT_EQ(d.meta["split"], "dev");
      EXPECT_EQ(s.meta["split"], "test");
      for (const Segment& g : d.segments)
        if (g.kind == "filler") EXPECT_EQ(dev_set.count(g.text.substr(0, g.text.size() - 2)), 1u) << t;
      for (const Segment& g : s.segments)
        if (g.kind == "filler") EXPECT_EQ(test_set.count(g.text.substr(0, g.text.size() - 2)), 1u) << t;
    }
  }
}

TEST(ProseTasks, AnswersMatchNormalizedWholeWords) {
  EXPECT_EQ(normalize_answer("\n- VAR QXKRE, 4829173.\n"), "var qxkre 4829173");
  EXPECT_TRUE(answer_in_reply(" 4829173.", "4829173"));
  EXPECT_TRUE(answer_in_reply("\n- 1111111\n- 4829173\n", "4829173"));
  EXPECT_TRUE(answer_in_reply("VAR QXKRE", "QXKRE"));
  EXPECT_TRUE(answer_in_reply("The cat is called \"Biscuit\".", "biscuit"));
  EXPECT_FALSE(answer_in_reply(" 48291730.", "4829173"));
  EXPECT_FALSE(answer_in_reply(" 482917", "4829173"));
  EXPECT_FALSE(answer_in_reply("biscuits", "biscuit"));
  EXPECT_FALSE(answer_in_reply("anything", ""));
}

}  // namespace wm::llmtasks
