// niah: needles in a haystack. Filler paragraphs from the grammar in text.cpp, needle sentences
// "The secret code of the <colour> <thing> is <4 digits>." between filler sentences at the chosen
// depths, then one question per needle in random order.
#include <algorithm>

#include "runtime/error.h"
#include "tools/llm_tasks/text.h"

namespace wm::llmtasks {

using namespace detail;

namespace {

const std::vector<std::string> kNeedleForms = {
    "The secret code of the {s} is {v}.", "Remember that the secret code of the {s} is {v}.",
    "Note: the secret code of the {s} is {v}.", "For the record, the secret code of the {s} is {v}."};

std::string fill(std::string form, const std::string& subject, const std::string& value) {
  form.replace(form.find("{s}"), 3, subject);
  form.replace(form.find("{v}"), 3, value);
  return form;
}

// The needles' depths (one per needle): o's, else drawn, as many as o asks for, else drawn
// (1 to 5, fewer for a short text). Throws wm::Error for a count outside [1, 5], a depth outside
// [0, 1], or depths not one per needle.
std::vector<double> needle_depths(Rng& rng, const GenOptions& o) {
  int needles = o.niah_needles;
  if (needles == 0 && !o.niah_depths.empty()) needles = static_cast<int>(o.niah_depths.size());
  if (needles == 0) needles = static_cast<int>(rng.uniform_int(1, std::clamp<int64_t>(o.target_tokens / 128, 1, 5)));
  if (needles < 1 || needles > 5) throw Error(str_cat("niah: needles must be in [1, 5], got ", needles));
  if (!o.niah_depths.empty() && static_cast<int>(o.niah_depths.size()) != needles)
    throw Error(str_cat("niah: ", o.niah_depths.size(), " depths for ", needles, " needles"));
  std::vector<double> depths = o.niah_depths;
  for (double d : depths)
    if (!(d >= 0.0 && d <= 1.0)) throw Error(str_cat("niah: depth ", d, " is not in [0, 1]"));
  if (depths.empty())
    for (int i = 0; i < needles; ++i) depths.push_back(rng.uniform());
  return depths;
}

// Needle i goes before filler unit at[i]: the first unit where the filler before it reaches
// depth * filler tokens (at == size: after all filler).
std::vector<size_t> needle_units(const std::vector<FillerUnit>& filler, const std::vector<double>& depths) {
  int64_t filler_tokens = 0;
  for (const FillerUnit& u : filler) filler_tokens += u.tokens;
  std::vector<size_t> at(depths.size());
  for (size_t i = 0; i < depths.size(); ++i) {
    const double want = depths[i] * static_cast<double>(filler_tokens);
    size_t k = 0;
    int64_t before = 0;
    while (k < filler.size() && static_cast<double>(before) + 0.5 * filler[k].tokens <= want)
      before += filler[k++].tokens;
    at[i] = k;
  }
  return at;
}

// A space between two sentences belongs to the start of the next segment, not the end of this
// one: byte-level BPE joins it to the next word (" The") when the text is tokenized whole, so
// segment-wise tokenization must do the same, or a lone space token would mark every segment
// boundary (and so every needle). Moves such spaces; returns the change in tokens.
int64_t move_spaces_forward(Sample& s, const TokenCounter& count) {
  int64_t change = 0;
  for (size_t i = 0; i + 1 < s.segments.size(); ++i) {
    Segment& a = s.segments[i];
    Segment& b = s.segments[i + 1];
    if (!a.target && !b.target && !a.text.empty() && a.text.back() == ' ') {
      const int64_t before = count(a.text) + count(b.text);
      a.text.pop_back();
      b.text.insert(b.text.begin(), ' ');
      change += count(a.text) + count(b.text) - before;
    }
  }
  return change;
}

}  // namespace

Sample make_niah(uint64_t seed, const GenOptions& o) {
  check_common(o, "niah");
  const TokenCounter count = counter_of(o);
  const int64_t target = o.target_tokens;
  Rng rng(hash_combine(seed, hash_string("niah")));
  const std::vector<double> depths = needle_depths(rng, o);
  const int needles = static_cast<int>(depths.size());

  // Needles: distinct subjects and values.
  std::vector<std::string> subjects, values, sentences;
  std::set<std::string> used_subjects, used_values;
  for (int i = 0; i < needles; ++i) {
    std::string subj;
    do subj = rng.pick(colours()) + " " + rng.pick(needle_things());
    while (!used_subjects.insert(subj).second);
    subjects.push_back(subj);
    values.push_back(fresh_number(rng, 1000, 9999, used_values));
    sentences.push_back(fill(rng.pick(kNeedleForms), subj, values.back()));
  }
  std::vector<std::string> questions(needles);
  for (int i = 0; i < needles; ++i)
    questions[i] = "Question: What is the secret code of the " + subjects[i] + "?\nAnswer:";

  Sample s;
  s.task = "niah";
  s.seed = seed;
  const std::string system = "Read the text. Then answer the questions about it.\n";
  // Fixed cost: system, needles (with their separator), questions and answers.
  int64_t fixed = count(system);
  for (int i = 0; i < needles; ++i)
    fixed += count(sentences[i] + " ") + count(questions[i]) + count(" " + values[i] + "\n");
  std::vector<FillerUnit> filler = make_filler(rng, count, target - fixed, values);

  const std::vector<size_t> at = needle_units(filler, depths);
  std::vector<int> by_pos(needles);
  for (int i = 0; i < needles; ++i) by_pos[i] = i;
  std::stable_sort(by_pos.begin(), by_pos.end(), [&](int a, int b) { return at[a] < at[b]; });

  int64_t total = add_segment(s, count, "system", "system", system);
  int next_filler = 0;
  size_t unit = 0;
  for (size_t r = 0; r < by_pos.size(); ++r) {
    int i = by_pos[r];
    total += add_filler_segments(s, count, filler, unit, at[i], &next_filler);
    unit = at[i];
    // A needle ends its line only when nothing but questions follows it.
    bool last = unit == filler.size() && r + 1 == by_pos.size();
    total += add_segment(s, count, str_cat("needle:", i), "needle", sentences[i] + (last ? "\n" : " "));
  }
  total += add_filler_segments(s, count, filler, unit, filler.size(), &next_filler);

  std::vector<int> ask(needles);
  for (int i = 0; i < needles; ++i) ask[i] = i;
  rng.shuffle(ask);
  nlohmann::json jn = nlohmann::json::array();
  for (int i : ask) {
    total += add_segment(s, count, str_cat("question:", i), "query", questions[i]);
    total += add_segment(s, count, str_cat("question:", i, ":answer"), "answer", " " + values[i] + "\n", true);
  }
  for (int i = 0; i < needles; ++i)
    jn.push_back({{"subject", subjects[i]}, {"value", values[i]}, {"depth", depths[i]}, {"before_unit", at[i]}});
  total += move_spaces_forward(s, count);
  s.meta = {{"needles", jn}, {"filler_sentences", filler.size()}, {"tokens", total}, {"target_tokens", target}};
  return s;
}

}  // namespace wm::llmtasks
