// umT5's prompt cleaning and tokenizer against the upstream code: fixtures made by
// tools/lingbot_fixtures/make_t5_fixtures.py. 51 strings through upstream's own
// HuggingfaceTokenizer(clean='whitespace') (ftfy, html.unescape, whitespace; transformers' T5
// tokenizer over a tiny SentencePiece unigram model trained for the test, T5's special ids) and
// through Python SentencePiece + EOS; Python's html.unescape on 42 edge cases. Ids must be equal.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dit/umt5_text.h"
#include "dit/umt5_tokenizer.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"

namespace wm::dit {
namespace umt5_tokenizer_test {

std::string fixture(const std::string& name) { return std::string(WM_SOURCE_DIR) + "/tests/dit/fixtures/lingbot/" + name; }

nlohmann::json cases() {
  std::ifstream f(fixture("umt5_tokenizer.json"));
  return nlohmann::json::parse(f);
}

// Printable form of a string for failure messages.
std::string show(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      o += buf;
    } else {
      o.push_back(static_cast<char>(c));
    }
  }
  return o;
}

TEST(Umt5Text, HtmlUnescapeEqualsPythons) {
  const auto j = cases();
  ASSERT_GE(j["html_unescape"].size(), 40u);
  for (const auto& c : j["html_unescape"]) {
    const std::string in = c[0], want = c[1];
    EXPECT_EQ(python_html_unescape(in), want) << "html.unescape(" << show(in) << ")";
  }
}

TEST(Umt5Text, WhitespaceCleaningEqualsUpstreams) {
  const auto j = cases();
  int compared = 0;
  for (const auto& c : j["cases"]) {
    // NFC composition is left to SentencePiece's normaliser (the tokens are compared below).
    if (c["ours_differs_before_spm"].get<bool>()) continue;
    const std::string text = c["text"], want = c["cleaned"];
    EXPECT_EQ(umt5_clean_whitespace(text), want) << "text: " << show(text);
    ++compared;
  }
  EXPECT_GE(compared, 50);
  EXPECT_THROW(umt5_clean_whitespace(std::string("bad \xC3\x28 utf-8")), Error);
  EXPECT_THROW(umt5_clean_whitespace(std::string("cut \xE2\x82")), Error);
  EXPECT_THROW(umt5_clean_whitespace(std::string("surrogate \xED\xA0\x80")), Error);
}

TEST(Umt5Tokenizer, IdsEqualTransformersAndSentencePiece) {
  if (!umt5_tokenizer_available()) GTEST_SKIP() << "built without libsentencepiece-dev (tools/setup.sh installs it)";
  const auto j = cases();
  const Umt5Tokenizer tok(fixture("umt5_spiece.model"));
  EXPECT_EQ(tok.pad_id(), j["pad_id"].get<int64_t>());
  EXPECT_EQ(tok.eos_id(), j["eos_id"].get<int64_t>());
  std::vector<std::string> texts;
  int spm_compared = 0;
  for (const auto& c : j["cases"]) {
    const std::string text = c["text"];
    texts.push_back(text);
    const std::vector<int64_t> ids = tok.encode(text);
    EXPECT_EQ(ids, c["hf_ids_full"].get<std::vector<int64_t>>()) << "transformers, text: " << show(text);
    if (!c["has_special_string"].get<bool>()) {
      EXPECT_EQ(ids, c["spm_ids"].get<std::vector<int64_t>>()) << "SentencePiece, text: " << show(text);
      ++spm_compared;
    }
  }
  EXPECT_GE(spm_compared, 50);
  // Upstream's call: padded to text_len, truncated keeping the EOS, with the mask.
  const int64_t text_len = j["text_len"];
  const Umt5Tokenizer::Batch b = tok(texts, text_len);
  ASSERT_EQ(b.ids.sizes(), at::IntArrayRef({static_cast<int64_t>(texts.size()), text_len}));
  int truncated = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto& c = j["cases"][i];
    const auto want_ids = c["hf_ids"].get<std::vector<int64_t>>();
    const auto want_mask = c["hf_mask"].get<std::vector<int64_t>>();
    const at::Tensor row = b.ids[static_cast<int64_t>(i)].contiguous();
    const at::Tensor mrow = b.mask[static_cast<int64_t>(i)].contiguous();
    EXPECT_EQ(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + text_len), want_ids)
        << "padded ids, text: " << show(texts[i]);
    EXPECT_EQ(std::vector<int64_t>(mrow.data_ptr<int64_t>(), mrow.data_ptr<int64_t>() + text_len), want_mask)
        << "mask, text: " << show(texts[i]);
    truncated += c["hf_ids_full"].size() > static_cast<size_t>(text_len);
  }
  EXPECT_GE(truncated, 3);
}

TEST(Umt5Tokenizer, BadModelFileNamesIt) {
  if (!umt5_tokenizer_available()) GTEST_SKIP() << "built without libsentencepiece-dev (tools/setup.sh installs it)";
  try {
    Umt5Tokenizer tok("/nonexistent/spiece.model");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/spiece.model"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Umt5Tokenizer(fixture("umt5_tokenizer.json")), Error);
}

}  // namespace umt5_tokenizer_test
}  // namespace wm::dit
