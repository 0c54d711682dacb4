#pragma once
// Real English prose for the long-context tasks over real text (the prose_* tasks, ruler.cpp):
// the paragraphs of the Debian Administrator's Handbook as Debian's package `debian-handbook`
// installs it (HTML, one file per chapter or section, /usr/share/doc/debian-handbook/html/en-US;
// tools/setup.sh installs the package). Nothing of it is shipped with the project: the text is
// found at run time.
//
// Splits: the files in name order alternate between dev (even index) and test (odd index), and a
// paragraph whose text occurs more than once anywhere in the corpus is dropped, so the two
// splits share no paragraph and no paragraph repeats within one. Held-out test seeds
// (heldout_seed(i), i >= kTestFirst) draw their haystacks from the test files; every other seed
// (dev, training) from the dev files.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace wm::llmtasks {

enum class ProseSplit { Dev, Test };

// The split a seed's haystack comes from: Test for held-out seeds with index >= kTestFirst.
ProseSplit prose_split_of(uint64_t seed);
const char* prose_split_name(ProseSplit split);  // "dev", "test"

class ProseCorpus {
 public:
  struct Document {
    std::string name;                     // a file name
    std::vector<std::string> paragraphs;  // one line each, whitespace collapsed
  };

  // Documents in the order given: even index dev, odd index test; paragraphs occurring more than
  // once (in any documents) dropped. Throws wm::Error when a split is left without paragraphs.
  ProseCorpus(std::vector<Document> documents, std::string source);

  // Every *.html file of `dir` in name order, its paragraphs the flat <div class="para"> elements
  // (DocBook/publican HTML: tags stripped, entities decoded, whitespace collapsed; paragraphs
  // holding a nested <div> or <pre> and those under 8 words skipped). Throws wm::Error naming
  // the folder when it has no such file.
  static ProseCorpus load_html_dir(const std::string& dir);

  // The paragraphs of a split, documents in order; and which document each one came from.
  const std::vector<std::string>& paragraphs(ProseSplit split) const;
  const std::vector<std::string>& documents(ProseSplit split) const;  // names
  const std::string& source() const { return source_; }

 private:
  std::vector<std::string> paragraphs_[2], documents_[2];
  std::string source_;
};

// The text of a <div class="para"> element's inside: tags removed, the HTML entities of DocBook's
// output decoded (named ones for quotes, dashes, spaces and markup characters; numeric ones as
// UTF-8), whitespace runs collapsed to one space, trimmed.
std::string html_to_text(const std::string& html);

// The prose tasks' answers are scored on free greedy generation, RULER-style: an answer counts
// when its normalized form occurs in the normalized reply as whole words. Normalized: ASCII
// letters lowercased, every run of characters other than ASCII letters and digits one space,
// trimmed ("VAR QXKRE" -> "var qxkre", "- 4829173." -> "4829173").
std::string normalize_answer(const std::string& text);
// True when normalize_answer(answer) is non-empty and occurs in normalize_answer(reply) bounded
// by spaces or the ends.
bool answer_in_reply(const std::string& reply, const std::string& answer);

// Where the handbook is looked for: $WM_PROSE_DIR when set, else
// /usr/share/doc/debian-handbook/html/en-US.
std::string default_prose_dir();

// The corpus of default_prose_dir(), loaded once per process (thread-safe). Throws wm::Error
// naming the folder and the package to install when it is missing.
std::shared_ptr<const ProseCorpus> default_prose_corpus();

}  // namespace wm::llmtasks
