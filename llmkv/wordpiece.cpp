#include "llmkv/wordpiece.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "llmkv/bert_chars.h"
#include "llmkv/byte_level.h"
#include "llmkv/json_file.h"
#include "runtime/error.h"

namespace wm::llm {

using nlohmann::json;

namespace {

constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max() - 1;
constexpr char32_t kReplacement = 0xFFFD;

using namespace json_fields;

// The code points of s; bytes that are not valid UTF-8 become U+FFFD, one per byte.
std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0, len = 0; i < s.size(); i += len) out.push_back(utf8_decode_at(s, i, len).value_or(kReplacement));
  return out;
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) out += utf8_encode(c);
  return out;
}

// A piece of text: plain (token < 0) or an added token (index into `added`).
struct Segment {
  std::string text;
  int32_t token = -1;
};

// Added-token contents for leftmost-longest matching, bucketed by their first byte.
class AddedMatcher {
 public:
  void add(const std::string& content, int32_t token) {
    auto& b = buckets_[static_cast<unsigned char>(content[0])];
    b.emplace_back(content, token);
    std::stable_sort(b.begin(), b.end(), [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
    empty_ = false;
  }
  // Cuts s into plain pieces and matches (appended to out in order).
  void cut(const std::string& s, std::vector<Segment>& out) const {
    if (empty_) {
      out.push_back({s, -1});
      return;
    }
    size_t done = 0;
    for (size_t p = 0; p < s.size();) {
      const auto& b = buckets_[static_cast<unsigned char>(s[p])];
      const auto hit = std::find_if(b.begin(), b.end(), [&](const auto& e) { return s.compare(p, e.first.size(), e.first) == 0; });
      if (hit == b.end()) {
        ++p;
        continue;
      }
      if (p > done) out.push_back({s.substr(done, p - done), -1});
      out.push_back({hit->first, hit->second});
      done = p = p + hit->first.size();
    }
    if (done < s.size()) out.push_back({s.substr(done), -1});
  }

 private:
  std::vector<std::pair<std::string, int32_t>> buckets_[256];  // longest first
  bool empty_ = true;
};

struct AddedEntry {
  int64_t id;
  std::string content;
  bool normalized;
};

}  // namespace

struct WordPieceTokenizer::Impl {
  std::string origin;

  // Model.
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> token_str;  // by id; empty where no token
  std::vector<uint8_t> present;
  int32_t unk = -1;
  std::string prefix = "##";
  int64_t max_chars = 100;

  // Added tokens.
  std::vector<AddedEntry> added;
  std::unordered_map<std::string, int32_t> added_id;
  AddedMatcher raw, norm;

  // Normalizer (has_normalizer false: none).
  bool has_normalizer = false;
  bool clean_text = true, chinese = true, strip_accents = true, lowercase = true;

  // Post-processor.
  std::vector<int64_t> prefix_ids, prefix_types, suffix_ids, suffix_types;
  int64_t sequence_type = 0;

  int64_t pad = 0;
  int64_t file_max = 0;

  void parse_model(const json& m);
  void parse_added(const json& j);
  void parse_normalizer(const json& n);
  void parse_pre_tokenizer(const json& p);
  void parse_post_processor(const json& p);
  void parse_truncation_padding(const json& j);
  void put_token(int64_t id, const std::string& s, const std::string& where);

  std::u32string normalize(std::u32string_view text) const;
  void pre_tokenize(std::u32string_view text, std::vector<std::u32string>& words) const;
  void word_piece(const std::u32string& word, std::vector<int64_t>& out) const;
  std::vector<int64_t> tokens_of(std::string_view text) const;
};

void WordPieceTokenizer::Impl::put_token(int64_t id, const std::string& s, const std::string& where) {
  if (static_cast<size_t>(id) >= present.size()) {
    present.resize(id + 1, 0);
    token_str.resize(id + 1);
  }
  if (present[id] && token_str[id] != s)
    corrupt(origin, str_cat(where, ": tokens ", quoted(token_str[id]), " and ", quoted(s), " have the same id ", id));
  present[id] = 1;
  token_str[id] = s;
}

void WordPieceTokenizer::Impl::parse_model(const json& m) {
  if (!m.is_object()) corrupt(origin, "model is not a JSON object");
  const std::string type = type_of(m, "model", origin);
  if (type != "WordPiece")
    unsupported(origin, str_cat("model type \"", type, "\" is not a WordPiece model (this tokenizer reads WordPiece only; "
                                "byte-level BPE files go to llmkv/tokenizer.h)"));
  const json& v = field(m, "vocab", "model", origin);
  if (!v.is_object() || v.empty()) corrupt(origin, "model.vocab is not a non-empty JSON object");
  const int64_t limit = std::min<int64_t>(kMaxId, 2 * static_cast<int64_t>(v.size()) + 65536);  // ids nearly dense
  vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    const int64_t id = int_in(*it, 0, limit, str_cat("model.vocab[", quoted(it.key()), "]"), origin);
    put_token(id, it.key(), "model.vocab");
    vocab.emplace(it.key(), static_cast<int32_t>(id));
  }
  const std::string unk_token = string_of(field(m, "unk_token", "model", origin), "model.unk_token", origin);
  auto u = vocab.find(unk_token);
  if (u == vocab.end()) corrupt(origin, str_cat("model.unk_token ", quoted(unk_token), " is not in the vocab"));
  unk = u->second;
  if (auto it = m.find("continuing_subword_prefix"); it != m.end() && !it->is_null())
    prefix = string_of(*it, "model.continuing_subword_prefix", origin);
  if (auto it = m.find("max_input_chars_per_word"); it != m.end() && !it->is_null())
    max_chars = int_in(*it, 1, kMaxId, "model.max_input_chars_per_word", origin);
}

void WordPieceTokenizer::Impl::parse_added(const json& j) {
  auto it = j.find("added_tokens");
  if (it == j.end() || it->is_null()) return;
  if (!it->is_array()) corrupt(origin, "added_tokens is not an array");
  const int64_t limit = std::min<int64_t>(kMaxId, 2 * static_cast<int64_t>(vocab.size() + it->size()) + 65536);
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string where = str_cat("added_tokens[", i, "]");
    const int64_t id = int_in(field(e, "id", where, origin), 0, limit, where + ".id", origin);
    const std::string content = string_of(field(e, "content", where, origin), where + ".content", origin);
    if (content.empty()) corrupt(origin, str_cat(where, ".content is empty"));
    const bool special = opt_bool(e, "special", false, where, origin);
    for (const char* flag : {"single_word", "lstrip", "rstrip"})
      if (opt_bool(e, flag, false, where, origin))
        unsupported(origin, str_cat(where, " ", quoted(content), ": ", flag, " = true is not supported"));
    if (auto v = vocab.find(content); v != vocab.end() && v->second != id)
      corrupt(origin, str_cat(where, " ", quoted(content), " has id ", id, " but the vocab gives it id ", v->second));
    if (added_id.count(content)) corrupt(origin, str_cat(where, " ", quoted(content), " is listed twice"));
    put_token(id, content, where);
    added_id.emplace(content, static_cast<int32_t>(id));
    added.push_back({id, content, opt_bool(e, "normalized", !special, where, origin)});
  }
}

void WordPieceTokenizer::Impl::parse_normalizer(const json& n) {
  if (n.is_null()) return;
  const std::string type = type_of(n, "normalizer", origin);
  if (type != "BertNormalizer")
    unsupported(origin, str_cat("normalizer \"", type, "\" is not supported (BertNormalizer or null)"));
  has_normalizer = true;
  clean_text = opt_bool(n, "clean_text", true, "normalizer", origin);
  chinese = opt_bool(n, "handle_chinese_chars", true, "normalizer", origin);
  lowercase = opt_bool(n, "lowercase", true, "normalizer", origin);
  strip_accents = opt_bool(n, "strip_accents", lowercase, "normalizer", origin);  // null: as lowercase
}

void WordPieceTokenizer::Impl::parse_pre_tokenizer(const json& p) {
  if (p.is_null()) unsupported(origin, "pre_tokenizer is null; only BertPreTokenizer is supported");
  const std::string type = type_of(p, "pre_tokenizer", origin);
  if (type != "BertPreTokenizer")
    unsupported(origin, str_cat("pre_tokenizer \"", type, "\" is not supported (only BertPreTokenizer)"));
}

void WordPieceTokenizer::Impl::parse_post_processor(const json& p) {
  if (p.is_null()) return;
  const std::string type = type_of(p, "post_processor", origin);
  auto check_id = [&](int64_t id, const std::string& where) {
    if (id < 0 || static_cast<size_t>(id) >= present.size() || !present[id])
      corrupt(origin, str_cat(where, ": id ", id, " is not a token"));
  };
  if (type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const json& e = field(p, key, "post_processor", origin);
      const std::string where = str_cat("post_processor.", key);
      if (!e.is_array() || e.size() != 2 || !e[0].is_string()) corrupt(origin, str_cat(where, " is not [token, id]"));
      const int64_t id = int_in(e[1], 0, kMaxId, where + "[1]", origin);
      check_id(id, where);
      (std::string(key) == "cls" ? prefix_ids : suffix_ids).push_back(id);
      (std::string(key) == "cls" ? prefix_types : suffix_types).push_back(0);
    }
    return;
  }
  if (type != "TemplateProcessing")
    unsupported(origin, str_cat("post_processor \"", type, "\" is not supported (TemplateProcessing, BertProcessing or null)"));
  const json& single = field(p, "single", "post_processor", origin);
  const json& specials = field(p, "special_tokens", "post_processor", origin);
  if (!single.is_array()) corrupt(origin, "post_processor.single is not an array");
  if (!specials.is_object()) corrupt(origin, "post_processor.special_tokens is not an object");
  bool seen_a = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    const std::string where = str_cat("post_processor.single[", i, "]");
    if (!piece.is_object() || piece.size() != 1) corrupt(origin, str_cat(where, " is not {SpecialToken: ...} or {Sequence: ...}"));
    const json& body = piece.begin().value();
    const int64_t type_id = int_in(field(body, "type_id", where, origin), 0, kMaxId, where + ".type_id", origin);
    const std::string id = string_of(field(body, "id", where, origin), where + ".id", origin);
    if (piece.begin().key() == "Sequence") {
      if (id != "A") unsupported(origin, str_cat(where, ": sequence ", quoted(id), " in the single template (only A)"));
      if (seen_a) corrupt(origin, str_cat(where, ": sequence A twice"));
      seen_a = true;
      sequence_type = type_id;
    } else if (piece.begin().key() == "SpecialToken") {
      const json& s = field(specials, id.c_str(), "post_processor.special_tokens", origin);
      const json& ids = field(s, "ids", str_cat("post_processor.special_tokens[", quoted(id), "]"), origin);
      if (!ids.is_array()) corrupt(origin, str_cat("post_processor.special_tokens[", quoted(id), "].ids is not an array"));
      for (const json& x : ids) {
        const int64_t tid = int_in(x, 0, kMaxId, str_cat("post_processor.special_tokens[", quoted(id), "].ids[]"), origin);
        check_id(tid, str_cat("post_processor.special_tokens[", quoted(id), "]"));
        (seen_a ? suffix_ids : prefix_ids).push_back(tid);
        (seen_a ? suffix_types : prefix_types).push_back(type_id);
      }
    } else {
      corrupt(origin, str_cat(where, ": \"", piece.begin().key(), "\" is neither SpecialToken nor Sequence"));
    }
  }
  if (!seen_a) corrupt(origin, "post_processor.single has no sequence A");
}

void WordPieceTokenizer::Impl::parse_truncation_padding(const json& j) {
  if (auto t = j.find("truncation"); t != j.end() && !t->is_null())
    file_max = int_in(field(*t, "max_length", "truncation", origin), 0, kMaxId, "truncation.max_length", origin);
  if (auto p = j.find("padding"); p != j.end() && !p->is_null() && p->contains("pad_id")) {
    pad = int_in(p->at("pad_id"), 0, kMaxId, "padding.pad_id", origin);
    if (static_cast<size_t>(pad) >= present.size() || !present[pad])
      corrupt(origin, str_cat("padding.pad_id ", pad, " is not a token"));
  } else if (auto a = added_id.find("[PAD]"); a != added_id.end()) {
    pad = a->second;
  } else if (auto v = vocab.find("[PAD]"); v != vocab.end()) {
    pad = v->second;
  }
}

WordPieceTokenizer WordPieceTokenizer::from_json(const json& j, const std::string& origin) {
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  try {
    if (!j.is_object()) corrupt(origin, "the document is not a JSON object");
    impl->parse_model(field(j, "model", "the document", origin));
    impl->parse_added(j);
    impl->parse_normalizer(j.value("normalizer", json()));
    impl->parse_pre_tokenizer(field(j, "pre_tokenizer", "the document", origin));
    impl->parse_post_processor(j.value("post_processor", json()));
    impl->parse_truncation_padding(j);
  } catch (const json::exception& e) {
    corrupt(origin, str_cat("malformed tokenizer: ", e.what()));
  }
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedEntry& a = impl->added[i];
    if (!a.normalized) {
      impl->raw.add(a.content, static_cast<int32_t>(i));
    } else {
      const std::string n = encode_utf8(impl->normalize(decode_utf8(a.content)));
      if (!n.empty()) impl->norm.add(n, static_cast<int32_t>(i));
    }
  }
  return WordPieceTokenizer(std::move(impl));
}

WordPieceTokenizer WordPieceTokenizer::load(const std::string& path) { return from_json(read_json_file(path), path); }

// ---- encoding ----

std::u32string WordPieceTokenizer::Impl::normalize(std::u32string_view text) const {
  if (!has_normalizer) return std::u32string(text);
  std::u32string out, stripped;
  out.reserve(text.size() + 8);
  for (char32_t c : text) {
    if (clean_text) {
      const uint8_t f = bert_chars::flags(c);
      if (f & bert_chars::kDrop) continue;
      if (f & bert_chars::kCleanSpace) c = U' ';
    }
    const bool pad = chinese && (bert_chars::flags(c) & bert_chars::kChinese);
    if (pad) out.push_back(U' ');
    stripped.clear();
    if (strip_accents)
      bert_chars::append_stripped(c, stripped);
    else
      stripped.push_back(c);
    for (char32_t s : stripped) {
      if (lowercase)
        bert_chars::append_lower(s, out);
      else
        out.push_back(s);
    }
    if (pad) out.push_back(U' ');
  }
  return out;
}

void WordPieceTokenizer::Impl::pre_tokenize(std::u32string_view text, std::vector<std::u32string>& words) const {
  std::u32string word;
  for (char32_t c : text) {
    const uint8_t f = bert_chars::flags(c);
    if (f & (bert_chars::kSpace | bert_chars::kPunct)) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
      if (f & bert_chars::kPunct) words.emplace_back(1, c);
    } else {
      word.push_back(c);
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
}

void WordPieceTokenizer::Impl::word_piece(const std::u32string& word, std::vector<int64_t>& out) const {
  if (static_cast<int64_t>(word.size()) > max_chars) {
    out.push_back(unk);
    return;
  }
  const size_t first = out.size();
  std::string piece;
  for (size_t start = 0; start < word.size();) {
    size_t end = word.size();
    int32_t found = -1;
    for (; end > start; --end) {
      piece = start > 0 ? prefix : std::string();
      piece += encode_utf8(std::u32string_view(word).substr(start, end - start));
      auto it = vocab.find(piece);
      if (it != vocab.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {  // no piece fits: the whole word is unknown
      out.resize(first);
      out.push_back(unk);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

std::vector<int64_t> WordPieceTokenizer::Impl::tokens_of(std::string_view text) const {
  std::vector<int64_t> out;
  const std::string valid = encode_utf8(decode_utf8(text));
  std::vector<Segment> raw_segments, segments;
  raw.cut(valid, raw_segments);
  std::vector<std::u32string> words;
  for (const Segment& r : raw_segments) {
    if (r.token >= 0) {
      out.push_back(added[r.token].id);
      continue;
    }
    segments.clear();
    norm.cut(encode_utf8(normalize(decode_utf8(r.text))), segments);
    for (const Segment& s : segments) {
      if (s.token >= 0) {
        out.push_back(added[s.token].id);
        continue;
      }
      words.clear();
      pre_tokenize(decode_utf8(s.text), words);
      for (const auto& w : words) word_piece(w, out);
    }
  }
  return out;
}

WordPieceEncoding WordPieceTokenizer::encode(std::string_view text, bool add_special, int64_t max_length) const {
  const Impl& m = *impl_;
  WM_CHECK(max_length >= 0, "max_length must be >= 0 (0: no truncation), got ", max_length);
  const int64_t n_template = add_special ? n_template_tokens() : 0;
  WM_CHECK(max_length == 0 || max_length > n_template, "max_length ", max_length, " leaves no room beside the ",
           n_template, " template tokens of ", m.origin);
  std::vector<int64_t> body = m.tokens_of(text);
  if (max_length > 0 && static_cast<int64_t>(body.size()) + n_template > max_length) body.resize(max_length - n_template);
  WordPieceEncoding e;
  e.ids.reserve(body.size() + n_template);
  if (add_special) {
    e.ids = m.prefix_ids;
    e.type_ids = m.prefix_types;
  }
  e.ids.insert(e.ids.end(), body.begin(), body.end());
  e.type_ids.resize(e.ids.size(), m.sequence_type);
  if (add_special) {
    e.ids.insert(e.ids.end(), m.suffix_ids.begin(), m.suffix_ids.end());
    e.type_ids.insert(e.type_ids.end(), m.suffix_types.begin(), m.suffix_types.end());
  }
  return e;
}

WordPieceBatch WordPieceTokenizer::encode_batch(const std::vector<std::string>& texts, bool add_special,
                                                int64_t max_length) const {
  std::vector<WordPieceEncoding> rows;
  rows.reserve(texts.size());
  WordPieceBatch b;
  for (const auto& t : texts) {
    rows.push_back(encode(t, add_special, max_length));
    b.length = std::max<int64_t>(b.length, static_cast<int64_t>(rows.back().ids.size()));
  }
  b.rows = static_cast<int64_t>(rows.size());
  b.ids.assign(b.rows * b.length, impl_->pad);
  b.type_ids.assign(b.rows * b.length, 0);
  b.attention_mask.assign(b.rows * b.length, 0);
  for (int64_t r = 0; r < b.rows; ++r) {
    const auto& e = rows[r];
    std::copy(e.ids.begin(), e.ids.end(), b.ids.begin() + r * b.length);
    std::copy(e.type_ids.begin(), e.type_ids.end(), b.type_ids.begin() + r * b.length);
    std::fill_n(b.attention_mask.begin() + r * b.length, e.ids.size(), 1);
  }
  return b;
}

std::string WordPieceTokenizer::normalize(std::string_view text) const {
  return encode_utf8(impl_->normalize(decode_utf8(text)));
}

std::vector<std::string> WordPieceTokenizer::pre_tokenize(std::string_view normalized) const {
  std::vector<std::u32string> words;
  impl_->pre_tokenize(decode_utf8(normalized), words);
  std::vector<std::string> out;
  out.reserve(words.size());
  for (const auto& w : words) out.push_back(encode_utf8(w));
  return out;
}

// ---- lookups ----

std::optional<std::string> WordPieceTokenizer::id_to_token(int64_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || id >= static_cast<int64_t>(m.present.size()) || !m.present[id]) return std::nullopt;
  return m.token_str[id];
}

std::optional<int64_t> WordPieceTokenizer::token_to_id(const std::string& token) const {
  const Impl& m = *impl_;
  if (auto it = m.added_id.find(token); it != m.added_id.end()) return it->second;
  if (auto it = m.vocab.find(token); it != m.vocab.end()) return it->second;
  return std::nullopt;
}

int64_t WordPieceTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->present.size()); }
int64_t WordPieceTokenizer::unk_id() const { return impl_->unk; }
int64_t WordPieceTokenizer::pad_id() const { return impl_->pad; }
int64_t WordPieceTokenizer::file_max_length() const { return impl_->file_max; }
int64_t WordPieceTokenizer::n_template_tokens() const {
  return static_cast<int64_t>(impl_->prefix_ids.size() + impl_->suffix_ids.size());
}
const std::string& WordPieceTokenizer::origin() const { return impl_->origin; }

}  // namespace wm::llm
