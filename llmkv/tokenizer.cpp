#include "llmkv/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <unistd.h>

#include "llmkv/byte_level.h"
#include "llmkv/split_regex.h"
#include "llmkv/json_file.h"
#include "runtime/error.h"

namespace wm::llm {

using nlohmann::json;

// Named, not anonymous: Tokenizer::Impl holds some of these types, and in a unity batch a class
// with a field of an anonymous-namespace type warns (-Wsubobject-linkage).
namespace tokenizer_detail {

constexpr int32_t kMaxId = std::numeric_limits<int32_t>::max() - 1;

// Ids index dense tables, so a file must not make them sparse: the largest id may be at most
// twice the number of tokens listed plus 65536 (real files are dense, with a few reserved
// gaps). Otherwise one token with id 2^31 - 2 would ask for tens of GiB.
int64_t id_limit(size_t tokens_listed) {
  return std::min<int64_t>(kMaxId, 2 * static_cast<int64_t>(tokens_listed) + 65536);
}
constexpr size_t kCacheMaxPieceBytes = 255;
constexpr size_t kCacheMaxEntries = 1 << 16;

// Rust's and Unicode's White_Space property, the white space lstrip / rstrip swallow.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Added-token contents, for leftmost-longest matching at a position.
class Trie {
 public:
  Trie() { root_.fill(-1); }
  void add(const std::string& s, int32_t token) {
    int node = root_[static_cast<unsigned char>(s[0])];
    if (node < 0) {
      node = new_node();
      root_[static_cast<unsigned char>(s[0])] = node;
    }
    for (size_t i = 1; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      int child = find(node, c);
      if (child < 0) {
        child = new_node();
        nodes_[node].next.emplace_back(c, child);
      }
      node = child;
    }
    nodes_[node].token = token;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // The longest content starting at s[p]: sets `len` and returns its token index, or -1.
  int32_t longest_at(std::string_view s, size_t p, size_t& len) const {
    int node = root_[static_cast<unsigned char>(s[p])];
    int32_t best = -1;
    size_t i = p + 1;
    while (node >= 0) {
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        len = i - p;
      }
      if (i >= s.size()) break;
      node = find(node, static_cast<unsigned char>(s[i++]));
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;
    int32_t token = -1;
  };
  int new_node() {
    nodes_.emplace_back();
    return static_cast<int>(nodes_.size()) - 1;
  }
  int find(int node, unsigned char c) const {
    for (const auto& [k, v] : nodes_[node].next)
      if (k == c) return v;
    return -1;
  }
  std::array<int, 256> root_{};
  std::vector<Node> nodes_;
  bool empty_ = true;
};

struct PreStep {
  enum class Kind { Split, ByteLevel } kind = Kind::Split;
  std::shared_ptr<SplitRegex> regex;  // Split / Digits
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = true;          // ByteLevel
};

// A piece of the input: plain text (token < 0) or an added token (index into added).
struct Segment {
  std::string_view text;
  int32_t token = -1;
};

using namespace json_fields;

}  // namespace tokenizer_detail

using namespace tokenizer_detail;

struct Tokenizer::Impl {
  std::string origin;

  // Model.
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::pair<int32_t, int32_t>> merges;                    // in rank order
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_of;  // (a, b) -> (rank, merged id)
  bool ignore_merges = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  std::array<int32_t, 256> byte_id{};  // the vocab id of each byte's symbol, -1 when absent

  // Tokens by id.
  std::vector<std::string> token_str;
  std::vector<std::string> bytes;
  std::vector<uint8_t> present, special;

  // Added tokens.
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_id;  // content -> id
  Trie raw_all, raw_plain, norm_all, norm_plain;      // *_plain: the non-special tokens only
  std::shared_ptr<SplitRegex> word_char;              // \w as single_word tests it

  // Pipeline.
  bool nfc = false;
  std::vector<PreStep> steps;
  std::shared_ptr<SplitRegex> gpt2;
  std::vector<int64_t> prefix, suffix;

  // Sections written back by save() as they were read.
  json version, truncation, padding, normalizer, pre_tokenizer, post_processor, decoder, model_meta;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void check_id(int64_t id, const char* where) const {
    if (id < 0 || id >= static_cast<int64_t>(present.size()) || !present[id])
      throw Error(str_cat(where, ": id ", id, " is not a token of ", origin, " (ids run from 0 to ",
                          present.size(), ", exclusive)"));
  }

  void parse_model(const json& j);
  void parse_added(const json& j);
  void parse_normalizer(const json& j);
  void parse_pre_tokenizer(const json& j, const std::string& where);
  void parse_post_processor(const json& j, const std::string& where);
  void parse_decoder(const json& j, const std::string& where, int& n_byte_level);
  void finish();

  void cut(std::string_view s, const Trie& trie, std::vector<Segment>& out) const;
  void encode_plain(std::string_view s, std::vector<int64_t>& out) const;
  void bpe(std::string_view piece, std::vector<int64_t>& out) const;
  bool ends_with_word(std::string_view s) const;
  bool starts_with_word(std::string_view s, size_t p) const;
};

void Tokenizer::Impl::parse_model(const json& j) {
  const json& m = field(j, "model", "the document", origin);
  if (!m.is_object()) corrupt(origin, "model is not a JSON object");
  const std::string type = type_of(m, "model", origin);
  if (type != "BPE")
    unsupported(origin, str_cat("model type \"", type, "\" is not supported (only byte-level BPE is)"));
  auto bad_option = [&](const char* key, const std::string& why) {
    unsupported(origin, str_cat("model.", key, ": ", why, " is not supported"));
  };
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null()) {
    if (!it->is_number()) corrupt(origin, "model.dropout is not a number");
    if (it->get<double>() != 0.0) bad_option("dropout", "BPE dropout (random merges at encode time)");
  }
  if (opt_bool(m, "byte_fallback", false, "model", origin)) bad_option("byte_fallback", "byte fallback");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = m.find(key);
    if (it == m.end() || it->is_null()) continue;
    if (!it->is_string()) corrupt(origin, str_cat("model.", key, " is not a string"));
    if (!it->get<std::string>().empty()) bad_option(key, "a non-empty affix");
  }
  ignore_merges = opt_bool(m, "ignore_merges", false, "model", origin);
  fuse_unk = opt_bool(m, "fuse_unk", false, "model", origin);

  const json& v = field(m, "vocab", "model", origin);
  if (!v.is_object()) corrupt(origin, "model.vocab is not a JSON object");
  vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->is_number_integer())
      corrupt(origin, str_cat("model.vocab: the id of ", quoted(it.key()), " is not an integer"));
    const int64_t id = it->get<int64_t>();
    if (id < 0 || id > id_limit(v.size()))
      corrupt(origin, str_cat("model.vocab: the id of ", quoted(it.key()), " is out of range (", id, "; ",
                              v.size(), " tokens allow ids up to ", id_limit(v.size()), ")"));
    if (static_cast<size_t>(id) >= present.size()) {
      present.resize(id + 1, 0);
      token_str.resize(id + 1);
    }
    if (present[id])
      corrupt(origin, str_cat("model.vocab: tokens ", quoted(token_str[id]), " and ", quoted(it.key()),
                              " have the same id ", id));
    present[id] = 1;
    token_str[id] = it.key();
    vocab.emplace(it.key(), static_cast<int32_t>(id));
  }

  if (auto it = m.find("unk_token"); it != m.end() && !it->is_null()) {
    if (!it->is_string()) corrupt(origin, "model.unk_token is not a string");
    auto u = vocab.find(it->get<std::string>());
    if (u == vocab.end()) corrupt(origin, str_cat("model.unk_token ", quoted(it->get<std::string>()), " is not in the vocab"));
    unk_id = u->second;
  }

  const json& ms = field(m, "merges", "model", origin);
  if (!ms.is_array()) corrupt(origin, "model.merges is not an array");
  merges.reserve(ms.size());
  merge_of.reserve(ms.size());
  for (size_t r = 0; r < ms.size(); ++r) {
    const json& e = ms[r];
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        corrupt(origin, str_cat("model.merges[", r, "] ", quoted(s), " is not two tokens separated by one space"));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      corrupt(origin, str_cat("model.merges[", r, "] is neither \"a b\" nor [\"a\", \"b\"]"));
    }
    auto id_of = [&](const std::string& t) {
      auto it = vocab.find(t);
      if (it == vocab.end())
        corrupt(origin, str_cat("model.merges[", r, "] (", quoted(a), ", ", quoted(b), ") names ", quoted(t),
                                ", which is not in the vocab"));
      return it->second;
    };
    const int32_t ia = id_of(a), ib = id_of(b), ic = id_of(a + b);
    merges.emplace_back(ia, ib);
    merge_of[pair_key(ia, ib)] = {static_cast<int32_t>(r), ic};  // a repeated merge keeps its last rank
  }

  model_meta = m;
  model_meta.erase("vocab");
  model_meta.erase("merges");
}

void Tokenizer::Impl::parse_added(const json& j) {
  auto it = j.find("added_tokens");
  if (it == j.end() || it->is_null()) return;
  if (!it->is_array()) corrupt(origin, "added_tokens is not an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string where = str_cat("added_tokens[", i, "]");
    const json& jid = field(e, "id", where, origin);
    const json& jc = field(e, "content", where, origin);
    const int64_t limit = id_limit(vocab.size() + it->size());
    if (!jid.is_number_integer() || jid.get<int64_t>() < 0 || jid.get<int64_t>() > limit)
      corrupt(origin, str_cat(where, ".id is not an integer in [0, ", limit, "] (", vocab.size() + it->size(),
                              " tokens listed; ids must be nearly dense)"));
    if (!jc.is_string() || jc.get<std::string>().empty()) corrupt(origin, str_cat(where, ".content is not a non-empty string"));
    AddedToken t;
    t.id = jid.get<int64_t>();
    t.content = jc.get<std::string>();
    t.special = opt_bool(e, "special", false, where, origin);
    t.single_word = opt_bool(e, "single_word", false, where, origin);
    t.lstrip = opt_bool(e, "lstrip", false, where, origin);
    t.rstrip = opt_bool(e, "rstrip", false, where, origin);
    t.normalized = opt_bool(e, "normalized", !t.special, where, origin);

    if (auto v = vocab.find(t.content); v != vocab.end() && v->second != t.id)
      corrupt(origin, str_cat(where, " ", quoted(t.content), " has id ", t.id, " but the vocab gives it id ", v->second));
    if (added_id.count(t.content)) corrupt(origin, str_cat(where, " ", quoted(t.content), " is listed twice"));
    if (static_cast<size_t>(t.id) >= present.size()) {
      present.resize(t.id + 1, 0);
      token_str.resize(t.id + 1);
    }
    if (present[t.id] && token_str[t.id] != t.content)
      corrupt(origin, str_cat(where, " ", quoted(t.content), " has id ", t.id, ", which already belongs to ",
                              quoted(token_str[t.id])));
    for (const auto& o : added)
      if (o.id == t.id) corrupt(origin, str_cat(where, " ", quoted(t.content), " has the id of ", quoted(o.content)));
    present[t.id] = 1;
    token_str[t.id] = t.content;
    added_id.emplace(t.content, static_cast<int32_t>(t.id));
    added.push_back(std::move(t));
  }
}

void Tokenizer::Impl::parse_normalizer(const json& j) {
  auto it = j.find("normalizer");
  if (it == j.end() || it->is_null()) return;
  normalizer = *it;
  std::vector<const json*> todo{&*it};
  while (!todo.empty()) {
    const json& n = *todo.back();
    todo.pop_back();
    const std::string type = type_of(n, "normalizer", origin);
    if (type == "NFC") {
      nfc = true;
    } else if (type == "Sequence") {
      const json& list = field(n, "normalizers", "normalizer", origin);
      if (!list.is_array()) corrupt(origin, "normalizer.normalizers is not an array");
      for (const auto& x : list) todo.push_back(&x);
    } else {
      unsupported(origin, str_cat("normalizer \"", type, "\" is not supported (only NFC, and not applied)"));
    }
  }
}

void Tokenizer::Impl::parse_pre_tokenizer(const json& p, const std::string& where) {
  const std::string type = type_of(p, where, origin);
  if (type == "Sequence") {
    const json& list = field(p, "pretokenizers", where, origin);
    if (!list.is_array()) corrupt(origin, str_cat(where, ".pretokenizers is not an array"));
    for (size_t i = 0; i < list.size(); ++i) parse_pre_tokenizer(list[i], str_cat(where, ".pretokenizers[", i, "]"));
    return;
  }
  if (!steps.empty() && steps.back().kind == PreStep::Kind::ByteLevel)
    unsupported(origin, str_cat(where, ": a ", type, " step after ByteLevel is not supported (ByteLevel must be last)"));
  PreStep s;
  try {
    if (type == "ByteLevel") {
      s.kind = PreStep::Kind::ByteLevel;
      s.add_prefix_space = opt_bool(p, "add_prefix_space", true, where, origin);
      s.use_regex = opt_bool(p, "use_regex", true, where, origin);
    } else if (type == "Split") {
      const json& pat = field(p, "pattern", where, origin);
      if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string())
        s.regex = std::make_shared<SplitRegex>(pat["Regex"].get<std::string>());
      else if (pat.is_object() && pat.contains("String") && pat["String"].is_string())
        s.regex = std::make_shared<SplitRegex>(pat["String"].get<std::string>(), true);
      else
        corrupt(origin, str_cat(where, ".pattern is neither {\"Regex\": ...} nor {\"String\": ...}"));
      const json& b = field(p, "behavior", where, origin);
      const std::string bs = b.is_string() ? b.get<std::string>() : std::string();
      if (bs == "Isolated") s.behavior = SplitBehavior::Isolated;
      else if (bs == "Removed") s.behavior = SplitBehavior::Removed;
      else if (bs == "MergedWithPrevious") s.behavior = SplitBehavior::MergedWithPrevious;
      else if (bs == "MergedWithNext") s.behavior = SplitBehavior::MergedWithNext;
      else if (bs == "Contiguous") s.behavior = SplitBehavior::Contiguous;
      else corrupt(origin, str_cat(where, ".behavior ", b.dump(), " is not a split behaviour"));
      s.invert = opt_bool(p, "invert", false, where, origin);
    } else if (type == "Digits") {
      s.regex = std::make_shared<SplitRegex>(R"(\p{N})");
      s.behavior = opt_bool(p, "individual_digits", false, where, origin) ? SplitBehavior::Isolated
                                                                           : SplitBehavior::Contiguous;
    } else {
      unsupported(origin, str_cat(where, ": pre-tokenizer \"", type,
                                  "\" is not supported (only ByteLevel, Split, Digits and Sequence)"));
    }
  } catch (const CorruptData&) {
    throw;
  } catch (const Error& e) {
    unsupported(origin, str_cat(where, ": ", e.what()));
  }
  steps.push_back(std::move(s));
}

void Tokenizer::Impl::parse_post_processor(const json& p, const std::string& where) {
  if (p.is_null()) return;
  const std::string type = type_of(p, where, origin);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const json& list = field(p, "processors", where, origin);
    if (!list.is_array()) corrupt(origin, str_cat(where, ".processors is not an array"));
    for (size_t i = 0; i < list.size(); ++i) parse_post_processor(list[i], str_cat(where, ".processors[", i, "]"));
    return;
  }
  if (type != "TemplateProcessing")
    unsupported(origin, str_cat(where, ": post-processor \"", type,
                                "\" is not supported (only ByteLevel, TemplateProcessing and Sequence)"));
  if (!prefix.empty() || !suffix.empty())
    unsupported(origin, str_cat(where, ": a second TemplateProcessing is not supported"));
  const json& single = field(p, "single", where, origin);
  if (!single.is_array())
    unsupported(origin, str_cat(where, ".single: only the list form of a template is supported"));
  const json& specials = field(p, "special_tokens", where, origin);
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& item = single[i];
    const std::string iw = str_cat(where, ".single[", i, "]");
    if (item.is_object() && item.contains("Sequence")) {
      if (seen_sequence) corrupt(origin, str_cat(iw, ": the single template has two sequences"));
      const json& id = field(item["Sequence"], "id", iw, origin);
      if (id != "A") corrupt(origin, str_cat(iw, ": the single template may only hold sequence A"));
      seen_sequence = true;
    } else if (item.is_object() && item.contains("SpecialToken")) {
      const json& name = field(item["SpecialToken"], "id", iw, origin);
      if (!name.is_string()) corrupt(origin, str_cat(iw, ".SpecialToken.id is not a string"));
      const json& entry = field(specials, name.get<std::string>().c_str(), str_cat(where, ".special_tokens"), origin);
      const json& ids = field(entry, "ids", str_cat(where, ".special_tokens.", name.get<std::string>()), origin);
      if (!ids.is_array()) corrupt(origin, str_cat(iw, ": the ids of ", name.dump(), " are not an array"));
      for (const auto& x : ids) {
        if (!x.is_number_integer()) corrupt(origin, str_cat(iw, ": an id of ", name.dump(), " is not an integer"));
        const int64_t v = x.get<int64_t>();
        if (v < 0 || v >= static_cast<int64_t>(present.size()) || !present[v])
          corrupt(origin, str_cat(iw, ": ", name.dump(), " names id ", v, ", which is not a token"));
        (seen_sequence ? suffix : prefix).push_back(v);
      }
    } else {
      corrupt(origin, str_cat(iw, " is neither a Sequence nor a SpecialToken"));
    }
  }
  if (!seen_sequence) corrupt(origin, str_cat(where, ".single does not hold sequence A"));
}

void Tokenizer::Impl::parse_decoder(const json& d, const std::string& where, int& n_byte_level) {
  const std::string type = type_of(d, where, origin);
  if (type == "ByteLevel") {
    ++n_byte_level;
  } else if (type == "Sequence") {
    const json& list = field(d, "decoders", where, origin);
    if (!list.is_array()) corrupt(origin, str_cat(where, ".decoders is not an array"));
    for (size_t i = 0; i < list.size(); ++i) parse_decoder(list[i], str_cat(where, ".decoders[", i, "]"), n_byte_level);
  } else {
    unsupported(origin, str_cat(where, ": decoder \"", type, "\" is not supported (only ByteLevel)"));
  }
}

void Tokenizer::Impl::finish() {
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(utf8_encode(byte_to_unicode(static_cast<uint8_t>(b))));
    byte_id[b] = it == vocab.end() ? -1 : it->second;
  }
  bytes.resize(token_str.size());
  special.assign(token_str.size(), 0);
  for (size_t id = 0; id < token_str.size(); ++id)
    if (present[id]) bytes[id] = byte_level_to_bytes(token_str[id]).value_or(token_str[id]);
  bool any_single_word = false;
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    if (t.special) special[t.id] = 1;
    any_single_word |= t.single_word;
    Trie& all = t.normalized ? norm_all : raw_all;
    Trie& plain = t.normalized ? norm_plain : raw_plain;
    all.add(t.content, static_cast<int32_t>(i));
    if (!t.special) plain.add(t.content, static_cast<int32_t>(i));
  }
  if (any_single_word)
    word_char = std::make_shared<SplitRegex>(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])");
  gpt2 = std::make_shared<SplitRegex>(kGpt2SplitPattern);
}

Tokenizer Tokenizer::from_json(const json& j, const std::string& origin) {
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  try {
    if (!j.is_object()) corrupt(origin, "the document is not a JSON object");
    impl->parse_model(j);
    impl->parse_added(j);
    impl->parse_normalizer(j);
    const json& pre = field(j, "pre_tokenizer", "the document", origin);
    if (pre.is_null()) unsupported(origin, "pre_tokenizer is null; only byte-level BPE (a ByteLevel pre-tokenizer) is supported");
    impl->parse_pre_tokenizer(pre, "pre_tokenizer");
    if (impl->steps.empty() || impl->steps.back().kind != PreStep::Kind::ByteLevel)
      unsupported(origin, "pre_tokenizer has no ByteLevel step; only byte-level BPE is supported");
    impl->pre_tokenizer = pre;
    if (auto it = j.find("post_processor"); it != j.end()) {
      impl->parse_post_processor(*it, "post_processor");
      impl->post_processor = *it;
    }
    int n_byte_level = 0;
    const json& dec = field(j, "decoder", "the document", origin);
    if (dec.is_null()) unsupported(origin, "decoder is null; only the ByteLevel decoder is supported");
    impl->parse_decoder(dec, "decoder", n_byte_level);
    if (n_byte_level != 1) unsupported(origin, "decoder: exactly one ByteLevel decoder is supported");
    impl->decoder = dec;
    impl->version = j.value("version", json());
    impl->truncation = j.value("truncation", json());
    impl->padding = j.value("padding", json());
    impl->finish();
  } catch (const json::exception& e) {
    corrupt(origin, str_cat("malformed tokenizer: ", e.what()));
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& path) { return from_json(read_json_file(path), path); }

void Tokenizer::save(const std::string& path) const {
  const Impl& m = *impl_;
  auto dump = [](const json& v) { return v.dump(); };
  std::string out;
  out.reserve(m.token_str.size() * 24 + m.merges.size() * 24 + 4096);
  out += "{\n  \"version\": " + dump(m.version.is_null() ? json("1.0") : m.version);
  out += ",\n  \"truncation\": " + dump(m.truncation);
  out += ",\n  \"padding\": " + dump(m.padding);
  out += ",\n  \"added_tokens\": [";
  for (size_t i = 0; i < m.added.size(); ++i) {
    const AddedToken& t = m.added[i];
    out += i ? ",\n    " : "\n    ";
    out += str_cat("{\"id\": ", t.id, ", \"content\": ", dump(t.content), ", \"single_word\": ", t.single_word ? "true" : "false",
                   ", \"lstrip\": ", t.lstrip ? "true" : "false", ", \"rstrip\": ", t.rstrip ? "true" : "false",
                   ", \"normalized\": ", t.normalized ? "true" : "false", ", \"special\": ", t.special ? "true" : "false", "}");
  }
  out += m.added.empty() ? "]" : "\n  ]";
  out += ",\n  \"normalizer\": " + dump(m.normalizer);
  out += ",\n  \"pre_tokenizer\": " + dump(m.pre_tokenizer);
  out += ",\n  \"post_processor\": " + dump(m.post_processor);
  out += ",\n  \"decoder\": " + dump(m.decoder);
  out += ",\n  \"model\": {\n    \"type\": \"BPE\"";
  auto meta = [&](const char* key, const json& dflt) {
    auto it = m.model_meta.find(key);
    out += str_cat(",\n    \"", key, "\": ", dump(it == m.model_meta.end() ? dflt : *it));
  };
  meta("dropout", nullptr);
  meta("unk_token", nullptr);
  meta("continuing_subword_prefix", nullptr);
  meta("end_of_word_suffix", nullptr);
  meta("fuse_unk", false);
  meta("byte_fallback", false);
  meta("ignore_merges", false);
  out += ",\n    \"vocab\": {";
  bool first = true;
  for (size_t id = 0; id < m.token_str.size(); ++id) {
    if (!m.present[id] || !m.vocab.count(m.token_str[id]) || m.vocab.at(m.token_str[id]) != static_cast<int32_t>(id))
      continue;  // an added token that is not in the model's vocab
    out += first ? "\n      " : ",\n      ";
    first = false;
    out += str_cat(dump(m.token_str[id]), ": ", id);
  }
  out += first ? "}" : "\n    }";
  out += ",\n    \"merges\": [";
  for (size_t r = 0; r < m.merges.size(); ++r) {
    out += r ? ",\n      [" : "\n      [";
    out += dump(m.token_str[m.merges[r].first]) + ", " + dump(m.token_str[m.merges[r].second]) + "]";
  }
  out += m.merges.empty() ? "]" : "\n    ]";
  out += "\n  }\n}\n";

  const std::string tmp = str_cat(path, ".tmp.", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(str_cat("Tokenizer::save: cannot create ", tmp));
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      throw Error(str_cat("Tokenizer::save: cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(str_cat("Tokenizer::save: cannot rename ", tmp, " to ", path));
  }
}

// ---- encoding ----

bool Tokenizer::Impl::ends_with_word(std::string_view s) const {
  if (s.empty()) return false;
  size_t p = s.size() - 1;
  for (int k = 0; k < 3 && p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80; ++k) --p;
  return word_char->matches_at(s, p);
}

bool Tokenizer::Impl::starts_with_word(std::string_view s, size_t p) const {
  return p < s.size() && word_char->matches_at(s, p);
}

void Tokenizer::Impl::cut(std::string_view s, const Trie& trie, std::vector<Segment>& out) const {
  if (trie.empty()) {
    out.push_back({s, -1});
    return;
  }
  size_t done = 0;  // s[0, done) is in `out`
  size_t pos = 0;   // where the search for the next match starts
  while (pos < s.size()) {
    size_t b = pos, len = 0;
    int32_t tok = -1;
    for (; b < s.size(); ++b)
      if ((tok = trie.longest_at(s, b, len)) >= 0) break;
    if (tok < 0) break;
    const AddedToken& t = added[tok];
    size_t start = b, stop = b + len;
    if (t.single_word && ((b > 0 && ends_with_word(s.substr(0, b))) || starts_with_word(s, stop))) {
      pos = stop;  // not a word of its own: the search goes on after it
      continue;
    }
    if (t.lstrip) {
      size_t p = start;
      while (p > done) {
        size_t q = p - 1, len1;
        while (q > done && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) --q;
        const auto c = utf8_decode_at(s, q, len1);
        if (!c || q + len1 != p || !is_white_space(*c)) break;
        p = q;
      }
      start = p;
    }
    if (t.rstrip) {
      size_t len1;
      while (stop < s.size()) {
        const auto c = utf8_decode_at(s, stop, len1);
        if (!c || !is_white_space(*c)) break;
        stop += len1;
      }
    }
    if (start > done) out.push_back({s.substr(done, start - done), -1});
    out.push_back({s.substr(start, stop - start), tok});
    done = pos = stop;
  }
  if (done < s.size()) out.push_back({s.substr(done), -1});
}

void Tokenizer::Impl::encode_plain(std::string_view s, std::vector<int64_t>& out) const {
  std::vector<std::string_view> pieces{s}, next;
  size_t i = 0;
  for (; i < steps.size() && steps[i].kind == PreStep::Kind::Split; ++i) {
    next.clear();
    for (auto p : pieces) split_pieces(*steps[i].regex, steps[i].behavior, steps[i].invert, p, next);
    pieces.swap(next);
  }
  const PreStep& bl = steps[i];  // the ByteLevel step, last (checked at load)
  std::string spaced;
  std::vector<std::string_view> words;
  for (auto p : pieces) {
    if (bl.add_prefix_space && (p.empty() || p[0] != ' ')) {
      spaced = " ";
      spaced += p;
      p = spaced;
    }
    if (bl.use_regex) {
      words.clear();
      split_pieces(*gpt2, SplitBehavior::Isolated, false, p, words);
      for (auto w : words) bpe(w, out);
    } else {
      bpe(p, out);
    }
  }
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int64_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges) {
    auto it = vocab.find(bytes_to_byte_level(piece));
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kCacheMaxPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(std::string(piece));
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }

  struct Sym {
    int32_t id, prev, next;
    bool live;
  };
  std::vector<Sym> sym;
  sym.reserve(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    const auto byte = static_cast<unsigned char>(piece[i]);
    int32_t id = byte_id[byte];
    if (id < 0) {
      if (unk_id < 0) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02X", byte);
        throw Error(str_cat("Tokenizer::encode: byte ", hex, " has no symbol in the vocab of ", origin,
                            " and the model has no unk_token"));
      }
      if (fuse_unk && !sym.empty() && sym.back().id == unk_id) continue;
      id = unk_id;
    }
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, n + 1, true});
  }
  sym.back().next = -1;

  struct Cand {
    int32_t rank, pos, id;
  };
  auto lower = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(lower)> queue(lower);
  for (size_t i = 0; i + 1 < sym.size(); ++i) {
    auto it = merge_of.find(pair_key(sym[i].id, sym[i + 1].id));
    if (it != merge_of.end()) queue.push({it->second.first, static_cast<int32_t>(i), it->second.second});
  }
  while (!queue.empty()) {
    const Cand top = queue.top();
    queue.pop();
    Sym& left = sym[top.pos];
    if (!left.live || left.next < 0) continue;
    Sym& right = sym[left.next];
    auto it = merge_of.find(pair_key(left.id, right.id));
    if (it == merge_of.end() || it->second.second != top.id) continue;  // an expired entry
    left.id = top.id;
    right.live = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) {
      auto p = merge_of.find(pair_key(sym[left.prev].id, left.id));
      if (p != merge_of.end()) queue.push({p->second.first, left.prev, p->second.second});
    }
    if (left.next >= 0) {
      auto n = merge_of.find(pair_key(left.id, sym[left.next].id));
      if (n != merge_of.end()) queue.push({n->second.first, top.pos, n->second.second});
    }
  }
  std::vector<int32_t> ids;
  for (const Sym& s : sym)
    if (s.live) ids.push_back(s.id);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() >= kCacheMaxEntries) cache.clear();
    cache.emplace(std::string(piece), std::move(ids));
  }
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool allow_special, bool add_special) const {
  const Impl& m = *impl_;
  std::vector<int64_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special) out.insert(out.end(), m.prefix.begin(), m.prefix.end());
  std::vector<Segment> raw, segs;
  m.cut(text, allow_special ? m.raw_all : m.raw_plain, raw);
  for (const Segment& r : raw) {
    if (r.token >= 0)
      segs.push_back(r);
    else
      m.cut(r.text, allow_special ? m.norm_all : m.norm_plain, segs);
  }
  for (const Segment& s : segs) {
    if (s.token >= 0)
      out.push_back(m.added[s.token].id);
    else if (!s.text.empty())
      m.encode_plain(s.text, out);
  }
  if (add_special) out.insert(out.end(), m.suffix.begin(), m.suffix.end());
  return out;
}

// ---- decoding and lookups ----

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string out;
  for (int64_t id : ids) {
    m.check_id(id, "Tokenizer::decode");
    if (skip_special && m.special[id]) continue;
    out += m.bytes[id];
  }
  return out;
}

std::string Tokenizer::token_bytes(int64_t id) const {
  impl_->check_id(id, "Tokenizer::token_bytes");
  return impl_->bytes[id];
}

std::optional<std::string> Tokenizer::id_to_token(int64_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || id >= static_cast<int64_t>(m.present.size()) || !m.present[id]) return std::nullopt;
  return m.token_str[id];
}

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  const Impl& m = *impl_;
  if (auto it = m.added_id.find(token); it != m.added_id.end()) return it->second;
  if (auto it = m.vocab.find(token); it != m.vocab.end()) return it->second;
  return std::nullopt;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->present.size()); }

bool Tokenizer::is_special(int64_t id) const {
  return id >= 0 && id < static_cast<int64_t>(impl_->special.size()) && impl_->special[id];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const std::vector<int64_t>& Tokenizer::template_prefix() const { return impl_->prefix; }
const std::vector<int64_t>& Tokenizer::template_suffix() const { return impl_->suffix; }
bool Tokenizer::normalizer_is_nfc() const { return impl_->nfc; }
bool Tokenizer::adds_prefix_space() const {
  for (const auto& st : impl_->steps)
    if (st.kind == PreStep::Kind::ByteLevel && st.add_prefix_space) return true;
  return false;
}
int64_t Tokenizer::n_merges() const { return static_cast<int64_t>(impl_->merges.size()); }
const std::string& Tokenizer::origin() const { return impl_->origin; }

// ---- streaming ----

StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool skip_special, bool valid_utf8)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special), valid_utf8_(valid_utf8) {}

std::string StreamDecoder::push(int64_t id) {
  std::string bytes = tokenizer_.decode({id}, skip_special_);
  pending_ += bytes;
  const size_t n = utf8_complete_prefix(pending_);
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  return valid_utf8_ ? utf8_valid(out) : out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  return valid_utf8_ ? utf8_valid(out) : out;
}

}  // namespace wm::llm
