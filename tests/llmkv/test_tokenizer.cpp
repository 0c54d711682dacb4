// The byte-level BPE tokenizer against reference ids made by Hugging Face's tokenizers
// (tools/llm_fixtures/make_tokenizer_fixtures.py), its round trip on arbitrary bytes, the stream
// decoder, the BPE trainer, errors on malformed files, and the ChatML template.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "llmkv/bpe_trainer.h"
#include "llmkv/byte_level.h"
#include "llmkv/chat_template.h"
#include "llmkv/split_regex.h"
#include "llmkv/tokenizer.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "tests/temp_dir.h"

namespace wm::llm {
namespace tokenizer_test {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixtures = std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/";
const char* const kStyles[] = {"qwen2_style", "gpt2_style", "llama3_style"};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const json& cases() {
  static const json j = json::parse(read_file(kFixtures + "cases.json"));
  return j;
}

Tokenizer fixture(const std::string& name) { return Tokenizer::load(kFixtures + name + ".tokenizer.json"); }

std::vector<int64_t> ids_of(const json& a) { return a.get<std::vector<int64_t>>(); }

std::string hex(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    std::snprintf(buf, sizeof(buf), "%02x", c);
    out += buf;
  }
  return out;
}

bool is_valid_utf8(const std::string& s) {
  for (size_t i = 0, len = 0; i < s.size(); i += len)
    if (!utf8_decode_at(s, i, len)) return false;
  return true;
}

// A scratch folder removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() : path(wm::testing::make_temp_dir("wm_tok_")) {}
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& text) const {
    const std::string p = (path / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
};

std::vector<std::string> random_byte_strings(uint32_t seed, int n, int max_len) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  const std::string pieces[] = {"\xF0\x9F\x98\x80", "\xE4\xBD\xA0", "\xC3\xA9", " ", "  ", "\n", "\t", "'s", "12",
                                "<|im_end|>", "\xF0\x9F", "\xE4", "\x80", "\xFF", "\xC0\xAF", "\xED\xA0\x80"};
  for (int i = 0; i < n; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % (max_len + 1));
    while (static_cast<int>(s.size()) < len) {
      if (rng() % 3 == 0)
        s += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
      else
        s += static_cast<char>(rng() % 256);
    }
    out.push_back(s);
  }
  return out;
}

// ---- the byte-level alphabet ----

TEST(TokenizerByteLevel, TableIsGpt2s) {
  EXPECT_EQ(byte_to_unicode('!'), U'!');
  EXPECT_EQ(byte_to_unicode('~'), U'~');
  EXPECT_EQ(byte_to_unicode(0x00), 0x100u);
  EXPECT_EQ(byte_to_unicode(' '), 0x120u);  // 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_unicode(0x7F), 0x121u);
  EXPECT_EQ(byte_to_unicode(0xA0), 0x142u);
  EXPECT_EQ(byte_to_unicode(0xAD), 0x143u);
  EXPECT_EQ(byte_to_unicode(0xA1), 0xA1u);
  EXPECT_EQ(byte_to_unicode(0xFF), 0xFFu);
  std::vector<bool> seen(0x200, false);
  for (int b = 0; b < 256; ++b) {
    const char32_t c = byte_to_unicode(static_cast<uint8_t>(b));
    ASSERT_LT(c, 0x200u);
    EXPECT_FALSE(seen[c]) << b;
    seen[c] = true;
    EXPECT_EQ(unicode_to_byte(c), std::optional<uint8_t>(static_cast<uint8_t>(b)));
  }
  EXPECT_FALSE(unicode_to_byte(U' ').has_value());
  EXPECT_FALSE(unicode_to_byte(0x4F60).has_value());
  EXPECT_EQ(bytes_to_byte_level("a b\n"), "a\xC4\xA0" "b\xC4\x8A");
  EXPECT_EQ(byte_level_to_bytes("a\xC4\xA0" "b\xC4\x8A"), std::optional<std::string>("a b\n"));
  EXPECT_FALSE(byte_level_to_bytes("a b").has_value());
}

TEST(TokenizerByteLevel, Utf8CompletePrefix) {
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x98"), 1u);      // 3 of 4 bytes of an emoji
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x98\x80"), 5u);  // complete
  EXPECT_EQ(utf8_complete_prefix("a\xE4"), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\xE4\xBD"), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\x80\x80\x80"), 4u);  // stray continuation bytes
  EXPECT_EQ(utf8_complete_prefix("a\xFF"), 2u);          // can never start a character
  EXPECT_EQ(utf8_complete_prefix("a\xC0"), 2u);          // overlong lead
  EXPECT_EQ(utf8_complete_prefix("a\xE0\x80"), 3u);      // E0 needs A0..BF next
  EXPECT_EQ(utf8_complete_prefix("a\xED\xA0"), 3u);      // a surrogate
}

TEST(TokenizerByteLevel, Utf8ValidReplacesEachIllFormedSequence) {
  const std::string r = "\xEF\xBF\xBD";  // U+FFFD
  EXPECT_EQ(utf8_valid(""), "");
  EXPECT_EQ(utf8_valid("abc \xE4\xBD\xA0 \xF0\x9F\x98\x80"), "abc \xE4\xBD\xA0 \xF0\x9F\x98\x80");  // valid: as is
  EXPECT_EQ(utf8_valid("a\xE4\xBD"), "a" + r);            // a character cut short: one replacement
  EXPECT_EQ(utf8_valid("a\xF0\x9F\x98"), "a" + r);
  EXPECT_EQ(utf8_valid("a\x80\x80" "b"), "a" + r + r + "b");  // each stray continuation byte
  EXPECT_EQ(utf8_valid("\xFF\xC0\xAF"), r + r + r);      // never a lead; an overlong lead and its byte
  EXPECT_EQ(utf8_valid("\xED\xA0\x80x"), r + r + r + "x");  // a surrogate: E0..EF's second byte out of range
  EXPECT_EQ(utf8_valid("\xE4\xBDx\xE4\xBD\xA0"), r + "x\xE4\xBD\xA0");
}

TEST(TokenizerRegex, SplitsAsGpt2AndQwen2) {
  std::vector<std::string_view> out;
  split_pieces(SplitRegex(kGpt2SplitPattern), SplitBehavior::Isolated, false, "I'm  here 123abc!!", out);
  EXPECT_EQ(out, (std::vector<std::string_view>{"I", "'m", " ", " here", " 123", "abc", "!!"}));
  out.clear();
  split_pieces(SplitRegex(kQwen2SplitPattern), SplitBehavior::Isolated, false, "I'M 123", out);
  EXPECT_EQ(out, (std::vector<std::string_view>{"I", "'M", " ", "1", "2", "3"}));
  out.clear();
  split_pieces(SplitRegex(kLlama3SplitPattern), SplitBehavior::Isolated, false, "1234567", out);
  EXPECT_EQ(out, (std::vector<std::string_view>{"123", "456", "7"}));
  // Invalid UTF-8 falls between matches and is kept.
  out.clear();
  const std::string bad = "ab\xFF\xC3 cd";
  split_pieces(SplitRegex(kQwen2SplitPattern), SplitBehavior::Isolated, false, bad, out);
  std::string joined;
  for (auto p : out) joined += p;
  EXPECT_EQ(joined, bad);
  EXPECT_GE(out.size(), 3u);
  EXPECT_THROW(SplitRegex("(unclosed"), Error);
}

TEST(TokenizerRegex, Behaviours) {
  const SplitRegex dash("-", true);
  auto run = [&](SplitBehavior b, bool invert) {
    std::vector<std::string_view> out;
    split_pieces(dash, b, invert, "a-b--c-", out);
    return std::vector<std::string>(out.begin(), out.end());
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(run(SplitBehavior::Isolated, false), (V{"a", "-", "b", "-", "-", "c", "-"}));
  EXPECT_EQ(run(SplitBehavior::Removed, false), (V{"a", "b", "c"}));
  EXPECT_EQ(run(SplitBehavior::MergedWithPrevious, false), (V{"a-", "b-", "-", "c-"}));
  EXPECT_EQ(run(SplitBehavior::MergedWithNext, false), (V{"a", "-b", "-", "-c", "-"}));
  EXPECT_EQ(run(SplitBehavior::Contiguous, false), (V{"a", "-", "b", "--", "c", "-"}));
  EXPECT_EQ(run(SplitBehavior::Removed, true), (V{"-", "-", "-", "-"}));  // each "-" is a match of its own
  EXPECT_EQ(run(SplitBehavior::Contiguous, true), (V{"a", "-", "b", "--", "c", "-"}));
}

// ---- reference ids ----

void check_against_reference(const Tokenizer& tok, const std::string& name) {
  const json& texts = cases()["texts"];
  ASSERT_TRUE(cases()["results"].contains(name)) << name << " has no reference ids in cases.json";
  const json& rows = cases()["results"][name];
  ASSERT_EQ(rows.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const json& r = rows[i];
    SCOPED_TRACE(name + " case " + std::to_string(i) + ": " + json(text).dump());
    EXPECT_EQ(tok.encode(text), ids_of(r["ids"]));
    EXPECT_EQ(tok.encode(text, /*allow_special=*/false), ids_of(r["plain"]));
    EXPECT_EQ(tok.encode(text, true, /*add_special=*/true), r.contains("bos") ? ids_of(r["bos"]) : ids_of(r["ids"]));
    EXPECT_EQ(tok.decode(ids_of(r["ids"])), r.value("decoded", text));
    EXPECT_EQ(tok.decode(ids_of(r["plain"])), text);
  }
}

TEST(TokenizerFixture, IdsMatchReference) {
  for (const char* name : kStyles) check_against_reference(fixture(name), name);
}

TEST(TokenizerFixture, CppTrainedFileMatchesReference) {
  check_against_reference(Tokenizer::load(kFixtures + "cpp_trained.tokenizer.json"), "cpp_trained");
}

TEST(TokenizerFixture, ReferenceExercisesTheFeatures) {
  // The fixtures hold what the reference tests above rely on, so that they cannot pass vacuously.
  const Tokenizer q = fixture("qwen2_style"), g = fixture("gpt2_style"), l = fixture("llama3_style");
  EXPECT_TRUE(q.normalizer_is_nfc());
  EXPECT_FALSE(g.normalizer_is_nfc());
  EXPECT_GE(q.vocab_size(), 900);
  EXPECT_GT(q.n_merges(), 500);
  EXPECT_EQ(l.template_prefix(), std::vector<int64_t>{*l.token_to_id("<|begin_of_text|>")});
  EXPECT_TRUE(l.template_suffix().empty());
  EXPECT_TRUE(q.template_prefix().empty());
  // ignore_merges: "Ġzebra" is in the vocab though no merge makes it.
  EXPECT_EQ(l.encode(" zebra"), std::vector<int64_t>{*l.token_to_id("\xC4\xA0zebra")});
  // lstrip swallows the spaces before <mask>; rstrip those after [SEP]; single_word.
  const int64_t mask = *g.token_to_id("<mask>"), sep = *g.token_to_id("[SEP]"), zz = *g.token_to_id("zz_word");
  const auto fill = g.encode("fill   <mask>");
  EXPECT_EQ(fill.back(), mask);
  EXPECT_EQ(g.decode(fill), "fill<mask>");
  const auto sep_ids = g.encode("a [SEP]   b");
  EXPECT_EQ(g.decode(sep_ids), "a [SEP]b");
  EXPECT_EQ(std::count(sep_ids.begin(), sep_ids.end(), sep), 1);
  const auto words = g.encode("zz_word xzz_word");
  EXPECT_EQ(std::count(words.begin(), words.end(), zz), 1);
  EXPECT_FALSE(g.is_special(zz));
  // Qwen2's pattern takes digits one at a time.
  const auto digits = q.encode("12345");
  EXPECT_EQ(digits.size(), 5u);
}

TEST(TokenizerFixture, SpecialTokensMatchedBeforeBpe) {
  const Tokenizer q = fixture("qwen2_style");
  const int64_t start = *q.token_to_id("<|im_start|>"), end = *q.token_to_id("<|im_end|>");
  const int64_t eot = *q.token_to_id("<|endoftext|>");
  EXPECT_TRUE(q.is_special(start));
  EXPECT_TRUE(q.is_special(end));
  EXPECT_FALSE(q.is_special(*q.token_to_id("a")));
  EXPECT_FALSE(q.is_special(-1));
  EXPECT_FALSE(q.is_special(q.vocab_size()));

  const auto ids = q.encode("hi<|im_end|>there");
  ASSERT_EQ(std::count(ids.begin(), ids.end(), end), 1);
  const size_t at = std::find(ids.begin(), ids.end(), end) - ids.begin();
  EXPECT_EQ(q.decode({ids.begin(), ids.begin() + at}), "hi");
  EXPECT_EQ(q.decode({ids.begin() + at + 1, ids.end()}), "there");
  // The text on each side is encoded on its own: the same ids as encoding it alone.
  EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.begin() + at), q.encode("hi"));

  // allow_special = false: the same text is plain text, no special id anywhere.
  const auto plain = q.encode("<|im_start|>user\nx<|im_end|><|endoftext|>", false);
  for (int64_t id : plain) EXPECT_FALSE(q.is_special(id)) << id;
  EXPECT_EQ(q.decode(plain), "<|im_start|>user\nx<|im_end|><|endoftext|>");
  // The non-special added token <tool_call> is still matched.
  const int64_t call = *q.token_to_id("<tool_call>");
  const auto with_call = q.encode("<tool_call>x", false);
  EXPECT_EQ(with_call.front(), call);

  // skip_special leaves out special tokens only.
  EXPECT_EQ(q.decode({start, eot, call}, true), "<tool_call>");
  EXPECT_EQ(q.decode({start, eot}), "<|im_start|><|endoftext|>");
  EXPECT_EQ(q.token_bytes(end), "<|im_end|>");
}

// ---- round trips ----

TEST(TokenizerRoundTrip, RandomBytesIncludingInvalidUtf8) {
  const auto strings = random_byte_strings(7, 400, 48);
  for (const char* name : kStyles) {
    const Tokenizer tok = fixture(name);
    for (const std::string& s : strings) {
      const auto ids = tok.encode(s, false);
      ASSERT_EQ(tok.decode(ids), s) << name << " " << hex(s);
      for (int64_t id : ids) ASSERT_FALSE(tok.is_special(id));
    }
  }
}

TEST(TokenizerRoundTrip, TrickyStringsWithSpecialTokens) {
  const Tokenizer q = fixture("qwen2_style");  // no lstrip / rstrip tokens: the text comes back whole
  for (const auto& t : cases()["texts"]) {
    const std::string s = t.get<std::string>();
    EXPECT_EQ(q.decode(q.encode(s)), s) << json(s).dump();
  }
  const std::string all_bytes = [] {
    std::string s;
    for (int b = 0; b < 256; ++b) s += static_cast<char>(b);
    return s + s;
  }();
  for (const char* name : kStyles) {
    const Tokenizer tok = fixture(name);
    EXPECT_EQ(tok.decode(tok.encode(all_bytes)), all_bytes) << name;
    EXPECT_TRUE(tok.encode("").empty());
  }
}

TEST(TokenizerRoundTrip, SaveAndLoadGiveTheSameTokenizer) {
  TempDir dir;
  for (const char* name : kStyles) {
    const Tokenizer a = fixture(name);
    const std::string path = (dir.path / (std::string(name) + ".json")).string();
    a.save(path);
    EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));
    const Tokenizer b = Tokenizer::load(path);
    ASSERT_EQ(a.vocab_size(), b.vocab_size());
    EXPECT_EQ(a.n_merges(), b.n_merges());
    for (int64_t id = 0; id < a.vocab_size(); ++id) {
      EXPECT_EQ(a.id_to_token(id), b.id_to_token(id));
      EXPECT_EQ(a.is_special(id), b.is_special(id));
    }
    EXPECT_EQ(a.template_prefix(), b.template_prefix());
    EXPECT_EQ(a.normalizer_is_nfc(), b.normalizer_is_nfc());
    for (const auto& t : cases()["texts"]) {
      const std::string s = t.get<std::string>();
      EXPECT_EQ(a.encode(s), b.encode(s)) << name << " " << json(s).dump();
    }
    // The vocab is written in id order, merges as pairs.
    const json j = json::parse(read_file(path));
    EXPECT_EQ(j["model"]["type"], "BPE");
    EXPECT_TRUE(j["model"]["merges"].empty() || j["model"]["merges"][0].is_array());
  }
}

TEST(TokenizerRoundTrip, ConcurrentEncodesAgree) {
  const Tokenizer q = fixture("qwen2_style");
  const auto strings = random_byte_strings(11, 200, 64);
  std::vector<std::vector<int64_t>> expect;
  for (const auto& s : strings) expect.push_back(q.encode(s));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < strings.size(); ++i) {
        const size_t k = (i * 7 + t * 13) % strings.size();
        if (q.encode(strings[k]) != expect[k]) ++mismatches;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// ---- streaming ----

TEST(TokenizerStream, HoldsBackASplitCharacter) {
  const Tokenizer q = fixture("qwen2_style");
  // The emoji U+1F600 as four byte tokens: nothing comes out until the fourth.
  const std::string emoji = "\xF0\x9F\x98\x80";
  StreamDecoder sd(q);
  EXPECT_EQ(sd.push(*q.token_to_id("a")), "a");
  for (int i = 0; i < 3; ++i) {
    const std::string sym = bytes_to_byte_level(emoji.substr(i, 1));
    EXPECT_EQ(sd.push(*q.token_to_id(sym)), "") << i;
    EXPECT_EQ(sd.pending(), static_cast<size_t>(i + 1));
  }
  EXPECT_EQ(sd.push(*q.token_to_id(bytes_to_byte_level(emoji.substr(3, 1)))), emoji);
  EXPECT_EQ(sd.pending(), 0u);
  // A character left unfinished comes out at flush.
  EXPECT_EQ(sd.push(*q.token_to_id(bytes_to_byte_level("\xE4"))), "");
  EXPECT_EQ(sd.flush(), "\xE4");
  EXPECT_EQ(sd.pending(), 0u);
  EXPECT_THROW(sd.push(q.vocab_size()), Error);
}

TEST(TokenizerStream, ValidUtf8ModeReplacesWhatCanNeverBeACharacter) {
  const Tokenizer q = fixture("qwen2_style");
  auto id = [&](const char* bytes) { return *q.token_to_id(bytes_to_byte_level(bytes)); };
  StreamDecoder sd(q, false, /*valid_utf8=*/true);
  EXPECT_EQ(sd.push(id("\xE4")), "");  // held back: more bytes may complete it
  EXPECT_EQ(sd.push(id("\xBD")), "");
  EXPECT_EQ(sd.push(id("\xA0")), "\xE4\xBD\xA0");
  EXPECT_EQ(sd.push(id("\xFF")), "\xEF\xBF\xBD");  // can never start a character
  EXPECT_EQ(sd.push(id("\xF0")), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");  // cut short by the end of the generation
  StreamDecoder raw(q);
  EXPECT_EQ(raw.push(id("\xFF")), "\xFF");  // the raw mode keeps decode()'s bytes
}

TEST(TokenizerStream, ConcatenationEqualsDecode) {
  for (const char* name : kStyles) {
    const Tokenizer tok = fixture(name);
    std::vector<std::string> texts;
    for (const auto& t : cases()["texts"]) texts.push_back(t.get<std::string>());
    for (const auto& s : random_byte_strings(5, 50, 40)) texts.push_back(s);
    for (const std::string& s : texts) {
      const auto ids = tok.encode(s, false);
      StreamDecoder sd(tok);
      std::string out;
      const bool valid = is_valid_utf8(s);
      for (int64_t id : ids) {
        const std::string piece = sd.push(id);
        if (valid) {
          EXPECT_TRUE(is_valid_utf8(piece)) << hex(piece);  // whole characters only
        }
        EXPECT_LE(sd.pending(), 3u);
        out += piece;
      }
      out += sd.flush();
      EXPECT_EQ(out, s) << name << " " << hex(s);
    }
  }
}

// ---- training ----

std::vector<std::string> corpus_lines() {
  std::vector<std::string> lines;
  std::istringstream in(read_file(kFixtures + "corpus.txt"));
  std::string line;
  while (std::getline(in, line)) lines.push_back(line + "\n");
  return lines;
}

BpeTrainerOptions fixture_trainer_options() {
  BpeTrainerOptions o;
  o.vocab_size = 500;
  o.style = SplitStyle::Qwen2;
  o.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  return o;
}

TEST(BpeTrainer, SmallCorpusRoundTripsAndCompresses) {
  const auto lines = corpus_lines();
  ASSERT_GT(lines.size(), 100u);
  for (SplitStyle style : {SplitStyle::Qwen2, SplitStyle::Gpt2}) {
    BpeTrainerOptions o = fixture_trainer_options();
    o.style = style;
    o.vocab_size = 700;
    const Tokenizer tok = BpeTrainer::train(lines, o);
    EXPECT_EQ(tok.vocab_size(), 700);
    EXPECT_EQ(*tok.token_to_id("<|endoftext|>"), 0);
    EXPECT_EQ(*tok.token_to_id("<|im_end|>"), 2);
    EXPECT_TRUE(tok.is_special(1));
    EXPECT_EQ(*tok.token_to_id(bytes_to_byte_level("a")), 3 + 'a');
    size_t n_bytes = 0, n_ids = 0;
    for (const auto& s : lines) {
      const auto ids = tok.encode(s);
      EXPECT_EQ(tok.decode(ids), s);
      n_bytes += s.size();
      n_ids += ids.size();
    }
    EXPECT_LT(n_ids * 2, n_bytes) << "fewer than 2 bytes per token";
    for (const auto& s : random_byte_strings(3, 100, 40)) EXPECT_EQ(tok.decode(tok.encode(s, false)), s) << hex(s);
    // Special tokens in the text come out as their ids.
    const auto ids = tok.encode("<|im_start|>user\nhello<|im_end|>\n");
    EXPECT_EQ(ids.front(), 1);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);
  }
}

TEST(BpeTrainer, MergesTheMostFrequentPairFirst) {
  BpeTrainerOptions o;
  o.vocab_size = 256 + 3;
  o.min_frequency = 1;
  // "ab" occurs 6 times, "cd" 4 times: merges are (a,b), then (c,d), then (ab,ab) or (cd,cd).
  const Tokenizer tok = BpeTrainer::train({"abab abab abab cdcd cdcd"}, o);
  EXPECT_EQ(tok.n_merges(), 3);
  EXPECT_EQ(*tok.id_to_token(256), "ab");
  EXPECT_EQ(*tok.id_to_token(257), "cd");
  EXPECT_EQ(*tok.id_to_token(258), "abab");  // (ab, ab) occurs 3 times, (cd, cd) 2 times
  EXPECT_EQ(tok.encode("abab"), std::vector<int64_t>{258});
  // min_frequency stops training early: every pair here occurs once.
  o.min_frequency = 2;
  o.vocab_size = 1000;
  EXPECT_EQ(BpeTrainer::train({"xyz"}, o).n_merges(), 0);
  // Bad options.
  o.vocab_size = 100;
  EXPECT_THROW(BpeTrainer{o}, Error);
  o.vocab_size = 1000;
  o.special_tokens = {"<a>", "<a>"};
  EXPECT_THROW(BpeTrainer{o}, Error);
}

TEST(BpeTrainer, CallbackFeedEqualsListFeed) {
  const auto lines = corpus_lines();
  size_t i = 0;
  const Tokenizer a = BpeTrainer::train(
      [&](std::string& s) {
        if (i >= lines.size()) return false;
        s = lines[i++];
        return true;
      },
      fixture_trainer_options());
  const Tokenizer b = BpeTrainer::train(lines, fixture_trainer_options());
  ASSERT_EQ(a.vocab_size(), b.vocab_size());
  for (int64_t id = 0; id < a.vocab_size(); ++id) EXPECT_EQ(a.id_to_token(id), b.id_to_token(id));
}

// The committed cpp_trained.tokenizer.json is what BpeTrainer makes from corpus.txt (training is
// deterministic); the Python script encodes the cases with it (TokenizerFixture above). Set
// WM_UPDATE_TOKENIZER_FIXTURES=1 to rewrite it after a deliberate change of the trainer.
TEST(BpeTrainer, MatchesCommittedFixture) {
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = BpeTrainer::train(corpus_lines(), fixture_trainer_options());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("train_seconds", std::to_string(seconds));
  const std::string committed = kFixtures + "cpp_trained.tokenizer.json";
  if (std::getenv("WM_UPDATE_TOKENIZER_FIXTURES")) {
    tok.save(committed);
    GTEST_SKIP() << "wrote " << committed;
  }
  TempDir dir;
  const std::string path = (dir.path / "trained.json").string();
  tok.save(path);
  EXPECT_EQ(read_file(path), read_file(committed)) << "the trainer no longer makes the committed file";
}

// ---- errors ----

json minimal_json() {
  return json::parse(R"({
    "added_tokens": [{"id": 5, "content": "<|end|>", "special": true, "normalized": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4}, "merges": ["a b", ["ab", "c"]]}
  })");
}

// Writes `j` to a file and expects load to throw E with a message naming the file and `what`.
template <class E>
void expect_load_error(const TempDir& dir, const std::string& name, const std::string& text, const std::string& what) {
  const std::string path = dir.file(name, text);
  try {
    Tokenizer::load(path);
    ADD_FAILURE() << name << ": no error";
  } catch (const E& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << name << ": wrong exception type: " << e.what();
  }
}

// add_prefix_space (the reference's default when the field is absent) puts a space before a
// piece that lacks one, and decode gives it back: the round trip then holds up to those spaces
// (found by fuzz_tokenizer_json, whose round-trip check now asks adds_prefix_space()).
TEST(Tokenizer, PrefixSpaceIsAddedAndDecoded) {
  TempDir dir;
  json j = minimal_json();
  j["model"]["vocab"]["\u0120"] = 6;  // the byte-level symbol of ' '
  EXPECT_FALSE(Tokenizer::load(dir.file("off.json", j.dump())).adds_prefix_space());
  j["pre_tokenizer"].erase("add_prefix_space");
  const Tokenizer on = Tokenizer::load(dir.file("on.json", j.dump()));
  EXPECT_TRUE(on.adds_prefix_space());
  EXPECT_EQ(on.encode("abc"), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(on.decode(on.encode("abc")), " abc");
  EXPECT_EQ(on.decode(on.encode(" abc")), " abc");
}

TEST(TokenizerErrors, MalformedFilesNameTheFile) {
  TempDir dir;
  // The minimal file itself loads (without all bytes: encoding a byte it lacks is an error).
  const Tokenizer ok = Tokenizer::load(dir.file("ok.json", minimal_json().dump()));
  EXPECT_EQ(ok.decode({4, 5}), "abc<|end|>");
  EXPECT_EQ(ok.encode("abc"), std::vector<int64_t>{4});
  EXPECT_EQ(ok.vocab_size(), 6);
  EXPECT_THROW(ok.encode("abz"), Error);

  expect_load_error<CorruptData>(dir, "notjson.json", "{\"model\": ", "not valid JSON");
  expect_load_error<CorruptData>(dir, "array.json", "[1, 2]", "not a JSON object");
  auto variant = [&](const std::string& name, auto edit) {
    json j = minimal_json();
    edit(j);
    return std::make_pair(name, j.dump());
  };
  auto [n1, t1] = variant("nomodel.json", [](json& j) { j.erase("model"); });
  expect_load_error<CorruptData>(dir, n1, t1, "lacks the field \"model\"");
  auto [n2, t2] = variant("nomerges.json", [](json& j) { j["model"].erase("merges"); });
  expect_load_error<CorruptData>(dir, n2, t2, "lacks the field \"merges\"");
  auto [n3, t3] = variant("unigram.json", [](json& j) { j["model"]["type"] = "Unigram"; });
  expect_load_error<Error>(dir, n3, t3, "\"Unigram\" is not supported");
  auto [n4, t4] = variant("wordpiece.json", [](json& j) { j["model"]["type"] = "WordPiece"; });
  expect_load_error<Error>(dir, n4, t4, "\"WordPiece\" is not supported");
  // Ids index dense tables: one far-out id must be an error, not a request for tens of GiB
  // (found by fuzz_tokenizer_json under its 1 GiB allocation cap).
  auto [ns1, ts1] = variant("sparsevocab.json", [](json& j) { j["model"]["vocab"]["c"] = 1941111111; });
  expect_load_error<CorruptData>(dir, ns1, ts1, "out of range (1941111111");
  auto [ns2, ts2] = variant("sparseadded.json", [](json& j) { j["added_tokens"][0]["id"] = 2000000000; });
  expect_load_error<CorruptData>(dir, ns2, ts2, "added_tokens[0].id is not an integer in [0, ");
  auto [n5, t5] = variant("badmerge.json", [](json& j) { j["model"]["merges"].push_back("a z"); });
  expect_load_error<CorruptData>(dir, n5, t5, "names \"z\", which is not in the vocab");
  auto [n6, t6] = variant("badmerge2.json", [](json& j) { j["model"]["merges"].push_back("b c"); });
  expect_load_error<CorruptData>(dir, n6, t6, "names \"bc\", which is not in the vocab");
  auto [n7, t7] = variant("dupid.json", [](json& j) { j["model"]["vocab"]["d"] = 1; });
  expect_load_error<CorruptData>(dir, n7, t7, "have the same id 1");
  auto [n8, t8] = variant("addedclash.json", [](json& j) { j["added_tokens"][0]["id"] = 2; });
  expect_load_error<CorruptData>(dir, n8, t8, "already belongs to \"ab\"");
  auto [n9, t9] = variant("badregex.json", [](json& j) {
    j["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})");
  });
  expect_load_error<Error>(dir, n9, t9, "does not compile");
  auto [n10, t10] = variant("nobytelevel.json", [](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; });
  expect_load_error<Error>(dir, n10, t10, "\"Whitespace\" is not supported");
  auto [n11, t11] = variant("decoder.json", [](json& j) { j["decoder"] = {{"type", "WordPiece"}}; });
  expect_load_error<Error>(dir, n11, t11, "decoder \"WordPiece\" is not supported");
  auto [n12, t12] = variant("nfkc.json", [](json& j) { j["normalizer"] = {{"type", "NFKC"}}; });
  expect_load_error<Error>(dir, n12, t12, "normalizer \"NFKC\" is not supported");
  auto [n13, t13] = variant("dropout.json", [](json& j) { j["model"]["dropout"] = 0.1; });
  expect_load_error<Error>(dir, n13, t13, "dropout");
  auto [n14, t14] = variant("badid.json", [](json& j) { j["model"]["vocab"]["d"] = "seven"; });
  expect_load_error<CorruptData>(dir, n14, t14, "is not an integer");
  auto [n15, t15] = variant("badmergeform.json", [](json& j) { j["model"]["merges"].push_back("a b c"); });
  expect_load_error<CorruptData>(dir, n15, t15, "merges[2]");
  auto [n16, t16] = variant("byteafter.json", [](json& j) {
    j["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
      {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": false}]})");
  });
  expect_load_error<Error>(dir, n16, t16, "ByteLevel must be last");

  try {
    Tokenizer::load((dir.path / "absent.json").string());
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.json"), std::string::npos);
  }
}

// Every value of a small but complete file replaced by values of every JSON type: loading either
// succeeds or throws wm::Error, never anything else.
TEST(TokenizerErrors, NoCrashOnAnyMistypedValue) {
  json base = minimal_json();
  base["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFC"}]})");
  base["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": "Isolated", "invert": false},
      {"type": "Digits", "individual_digits": true},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]})");
  base["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|end|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [5], "tokens": ["<|end|>"]}}})");
  ASSERT_EQ(Tokenizer::from_json(base, "base").template_prefix(), std::vector<int64_t>{5});
  const json flat = base.flatten();
  const json replacements[] = {nullptr, json(-1), json(1u << 31), json(2.5), json(""), json("x y"),
                               json::array(), json::array({"a", 7}), json::object(), json(true)};
  int loaded = 0, refused = 0;
  for (auto it = flat.begin(); it != flat.end(); ++it) {
    std::vector<std::string> pointers = {it.key()};
    // Also the containers holding the value.
    for (std::string p = it.key(); p.rfind('/') != std::string::npos && p.rfind('/') > 0;) {
      p = p.substr(0, p.rfind('/'));
      pointers.push_back(p);
    }
    for (const std::string& ptr : pointers) {
      for (const json& r : replacements) {
        json j = base;
        j[json::json_pointer(ptr)] = r;
        try {
          const Tokenizer t = Tokenizer::from_json(j, "mutated");
          const auto ids = t.encode("abc<|end|>");
          (void)t.decode(ids);
          ++loaded;
        } catch (const Error&) {
          ++refused;
        } catch (const std::exception& e) {
          ADD_FAILURE() << ptr << " = " << r.dump() << ": not a wm::Error: " << e.what();
        }
      }
    }
  }
  EXPECT_GT(refused, 100);
  EXPECT_GT(loaded, 10);
}

TEST(TokenizerErrors, DecodeRejectsBadIds) {
  const Tokenizer q = fixture("qwen2_style");
  EXPECT_THROW(q.decode({-1}), Error);
  EXPECT_THROW(q.decode({q.vocab_size()}), Error);
  EXPECT_THROW(q.token_bytes(q.vocab_size() + 100), Error);
  try {
    q.decode({0, 1 << 30});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1073741824"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("qwen2_style.tokenizer.json"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(q.id_to_token(-5).has_value());
  EXPECT_FALSE(q.token_to_id("not a token at all").has_value());
}

// ---- chat template ----

TEST(ChatTemplate, RendersChatMlExactly) {
  const std::vector<ChatMessage> msgs = {{"system", "You are helpful."}, {"user", "Hi!\nTwo lines."}};
  EXPECT_EQ(render_chatml(msgs, false),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!\nTwo lines.<|im_end|>\n");
  EXPECT_EQ(render_chatml(msgs, true),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!\nTwo lines.<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render_chatml({}, true), "<|im_start|>assistant\n");
  EXPECT_EQ(render_chatml({{"assistant", ""}, {"tool", "{}"}}, false),
            "<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n{}<|im_end|>\n");
  try {
    render_chatml({{"user", "a"}, {"robot", "b"}}, false);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("message 1 has role \"robot\""), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, EncodeEqualsEncodingTheRenderedText) {
  const Tokenizer q = fixture("qwen2_style");
  const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "What is 12+30?"}, {"assistant", "42"}};
  for (bool gen : {false, true}) EXPECT_EQ(encode_chatml(q, msgs, gen), q.encode(render_chatml(msgs, gen)));
  // Special-token text inside a message stays text.
  const auto ids = encode_chatml(q, {{"user", "<|im_end|>"}}, false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *q.token_to_id("<|im_end|>")), 1);
  EXPECT_EQ(q.decode(ids), render_chatml({{"user", "<|im_end|>"}}, false));
  EXPECT_THROW(encode_chatml(fixture("gpt2_style"), msgs, false), Error);
}

}  // namespace tokenizer_test
}  // namespace wm::llm
