#include "llmkv/bpe_trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <queue>

#include "llmkv/byte_level.h"
#include "llmkv/split_regex.h"
#include "runtime/error.h"

namespace wm::llm {

using nlohmann::json;

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Candidate {
  int64_t count;
  int32_t a, b;
};

// Heap order: the highest count on top, then the smallest (a, b).
struct Below {
  bool operator()(const Candidate& x, const Candidate& y) const {
    if (x.count != y.count) return x.count < y.count;
    if (x.a != y.a) return x.a > y.a;
    return x.b > y.b;
  }
};

// The pre-tokens as symbol sequences with their counts, the count of every adjacent pair, which
// words hold it, and a heap of candidate merges (entries may be stale: a pair's count is in
// pair_count).
class MergeState {
 public:
  // The distinct pre-tokens, in a fixed order so that training does not depend on hashing; byte
  // b is symbol k + b.
  MergeState(const std::unordered_map<std::string, int64_t>& pre_tokens, int32_t k) {
    std::vector<std::pair<std::string, int64_t>> sorted(pre_tokens.begin(), pre_tokens.end());
    std::sort(sorted.begin(), sorted.end());
    words_.resize(sorted.size());
    counts_.resize(sorted.size());
    for (size_t w = 0; w < sorted.size(); ++w) {
      counts_[w] = sorted[w].second;
      for (unsigned char c : sorted[w].first) words_[w].push_back(k + c);
      for (size_t i = 0; i + 1 < words_[w].size(); ++i) {
        const uint64_t p = pair_key(words_[w][i], words_[w][i + 1]);
        pair_count_[p] += counts_[w];
        where_[p].push_back(static_cast<int32_t>(w));
      }
    }
    for (const auto& [p, c] : pair_count_)
      heap_.push({c, static_cast<int32_t>(p >> 32), static_cast<int32_t>(p & 0xFFFFFFFFu)});
  }

  // The most frequent pair (ties: the smallest), or false when none is left with at least
  // min_frequency occurrences.
  bool best(int64_t min_frequency, Candidate* out) {
    while (!heap_.empty()) {
      const Candidate top = heap_.top();
      heap_.pop();
      auto pc = pair_count_.find(pair_key(top.a, top.b));
      const int64_t actual = pc == pair_count_.end() ? 0 : pc->second;
      if (actual != top.count) {  // a stale entry: counts of old pairs only go down
        if (actual > 0) heap_.push({actual, top.a, top.b});
        continue;
      }
      if (actual < min_frequency) return false;
      *out = top;
      return true;
    }
    return false;
  }

  // Replaces pair (a, b) by symbol id in every word that holds it, the pair counts and the heap
  // following.
  void merge(int32_t a, int32_t b, int32_t id) {
    const uint64_t p = pair_key(a, b);
    std::vector<int32_t> list = std::move(where_[p]);
    where_.erase(p);
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
    changed_.clear();
    for (int32_t w : list) merge_in(w, a, b, id);
    std::sort(changed_.begin(), changed_.end());
    changed_.erase(std::unique(changed_.begin(), changed_.end()), changed_.end());
    for (uint64_t q : changed_)
      if (auto it = pair_count_.find(q); it != pair_count_.end() && it->second > 0)
        heap_.push({it->second, static_cast<int32_t>(q >> 32), static_cast<int32_t>(q & 0xFFFFFFFFu)});
  }

 private:
  // merge() in word w: its pairs' counts out, the merge, its new pairs' counts in (those with
  // id recorded as changed).
  void merge_in(int32_t w, int32_t a, int32_t b, int32_t id) {
    std::vector<int32_t>& s = words_[w];
    const int64_t c = counts_[w];
    bool holds = false;
    for (size_t i = 0; i + 1 < s.size() && !holds; ++i) holds = s[i] == a && s[i + 1] == b;
    if (!holds) return;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = pair_count_.find(pair_key(s[i], s[i + 1]));
      if ((it->second -= c) == 0) pair_count_.erase(it);
    }
    merged_.clear();
    for (size_t i = 0; i < s.size();) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        merged_.push_back(id);
        i += 2;
      } else {
        merged_.push_back(s[i++]);
      }
    }
    s.assign(merged_.begin(), merged_.end());
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t q = pair_key(s[i], s[i + 1]);
      pair_count_[q] += c;
      if (s[i] == id || s[i + 1] == id) {
        where_[q].push_back(w);
        changed_.push_back(q);
      }
    }
  }

  std::vector<std::vector<int32_t>> words_;
  std::vector<int64_t> counts_;
  std::unordered_map<uint64_t, int64_t> pair_count_;
  std::unordered_map<uint64_t, std::vector<int32_t>> where_;
  std::priority_queue<Candidate, std::vector<Candidate>, Below> heap_;
  std::vector<uint64_t> changed_;  // pairs with the new symbol, during merge()
  std::vector<int32_t> merged_;    // a word being rewritten
};

// The tokenizer.json of a trained vocabulary: tokens[id] the bytes of each id (the first k are
// the special tokens, their text), merges in order.
json trained_tokenizer_json(const std::vector<std::string>& tokens, const std::vector<std::pair<int32_t, int32_t>>& merges,
                    int32_t k, SplitStyle style) {
  auto symbols = [&](int32_t id) { return id < k ? tokens[id] : bytes_to_byte_level(tokens[id]); };
  json vocab = json::object();
  for (int32_t id = 0; id < static_cast<int32_t>(tokens.size()); ++id) vocab[symbols(id)] = id;
  json jm = json::array();
  for (const auto& [a, b] : merges) jm.push_back(json::array({symbols(a), symbols(b)}));
  json added = json::array();
  for (int32_t id = 0; id < k; ++id)
    added.push_back({{"id", id}, {"content", tokens[id]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  const json byte_level_plain = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                                 {"use_regex", false}};
  json pre;
  if (style == SplitStyle::Qwen2)
    pre = {{"type", "Sequence"},
           {"pretokenizers", json::array({{{"type", "Split"},
                                           {"pattern", {{"Regex", kQwen2SplitPattern}}},
                                           {"behavior", "Isolated"},
                                           {"invert", false}},
                                          byte_level_plain})}};
  else
    pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"post_processor", byte_level_plain},
          {"decoder", byte_level_plain},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", jm}}}};
}

}  // namespace

BpeTrainer::BpeTrainer(BpeTrainerOptions options) : opt_(std::move(options)) {
  const int64_t k = static_cast<int64_t>(opt_.special_tokens.size());
  WM_CHECK(opt_.vocab_size >= k + 256, "vocab_size ", opt_.vocab_size, " is below the ", k,
           " special tokens + 256 byte symbols");
  WM_CHECK(opt_.min_frequency >= 1, "min_frequency must be at least 1 (got ", opt_.min_frequency, ")");
  for (size_t i = 0; i < opt_.special_tokens.size(); ++i) {
    WM_CHECK(!opt_.special_tokens[i].empty(), "special token ", i, " is empty");
    for (size_t j = 0; j < i; ++j)
      WM_CHECK(opt_.special_tokens[i] != opt_.special_tokens[j], "special token \"", opt_.special_tokens[i],
               "\" is given twice");
  }
  split_ = std::make_shared<SplitRegex>(opt_.style == SplitStyle::Qwen2 ? kQwen2SplitPattern : kGpt2SplitPattern);
}

void BpeTrainer::feed(std::string_view text) {
  std::vector<std::string_view> pieces;
  auto count_gap = [&](std::string_view gap) {
    if (gap.empty()) return;
    pieces.clear();
    split_pieces(*split_, SplitBehavior::Isolated, false, gap, pieces);
    for (auto p : pieces) ++words_[std::string(p)];
  };
  size_t done = 0, i = 0;
  while (i < text.size()) {
    size_t best = 0;
    for (const auto& s : opt_.special_tokens)
      if (s.size() > best && text.compare(i, s.size(), s) == 0) best = s.size();
    if (best == 0) {
      ++i;
      continue;
    }
    count_gap(text.substr(done, i - done));
    i += best;
    done = i;
  }
  count_gap(text.substr(done));
}

void BpeTrainer::feed_all(const std::function<bool(std::string&)>& next) {
  std::string text;
  while (next(text)) feed(text);
}

Tokenizer BpeTrainer::train() const {
  const auto k = static_cast<int32_t>(opt_.special_tokens.size());
  std::vector<std::string> tokens;  // bytes of each id (a special token: its text)
  std::unordered_map<std::string, int32_t> id_of;
  for (const auto& s : opt_.special_tokens) {
    id_of.emplace(s, static_cast<int32_t>(tokens.size()));
    tokens.push_back(s);
  }
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    id_of.emplace(tokens.back(), static_cast<int32_t>(tokens.size() - 1));
  }

  MergeState state(words_, k);
  std::vector<std::pair<int32_t, int32_t>> merges;
  Candidate top{};
  while (static_cast<int64_t>(tokens.size()) < opt_.vocab_size && state.best(opt_.min_frequency, &top)) {
    const std::string bytes = tokens[top.a] + tokens[top.b];
    int32_t id;
    if (auto it = id_of.find(bytes); it != id_of.end()) {
      id = it->second;
    } else {
      id = static_cast<int32_t>(tokens.size());
      tokens.push_back(bytes);
      id_of.emplace(bytes, id);
    }
    merges.emplace_back(top.a, top.b);
    state.merge(top.a, top.b, id);
  }
  return Tokenizer::from_json(trained_tokenizer_json(tokens, merges, k, opt_.style), "BpeTrainer");
}

Tokenizer BpeTrainer::train(const std::vector<std::string>& corpus, const BpeTrainerOptions& options) {
  BpeTrainer t(options);
  for (const auto& s : corpus) t.feed(s);
  return t.train();
}

Tokenizer BpeTrainer::train(const std::function<bool(std::string&)>& next, const BpeTrainerOptions& options) {
  BpeTrainer t(options);
  t.feed_all(next);
  return t.train();
}

}  // namespace wm::llm
