#include "tools/llm_tasks/text.h"

#include <cctype>
#include <cmath>

#include "runtime/error.h"

namespace wm::llmtasks {

TokenCounter bytes_counter(double bytes_per_token) {
  WM_CHECK(bytes_per_token > 0, "bytes_per_token must be positive, got ", bytes_per_token);
  return [bytes_per_token](const std::string& text) -> int64_t {
    if (text.empty()) return 0;
    int64_t n = std::llround(static_cast<double>(text.size()) / bytes_per_token);
    return n < 1 ? 1 : n;
  };
}

namespace detail {

TokenCounter counter_of(const GenOptions& options) {
  return options.count ? options.count : bytes_counter(4.0);
}

void check_common(const GenOptions& options, const char* task) {
  if (options.target_tokens < kMinTargetTokens)
    throw Error(str_cat(task, ": target_tokens must be at least ", kMinTargetTokens, ", got ", options.target_tokens));
}

int64_t add_segment(Sample& s, const TokenCounter& count, std::string id, std::string kind,
                    std::string text, bool target) {
  int64_t n = count(text);
  s.segments.push_back(Segment{std::move(id), std::move(kind), std::move(text), target});
  return n;
}

void push_segment(Sample& s, std::string id, std::string kind, std::string text, bool target) {
  s.segments.push_back(Segment{std::move(id), std::move(kind), std::move(text), target});
}

std::string capitalize(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

std::string fresh_number(Rng& rng, int lo, int hi, std::set<std::string>& used) {
  WM_CHECK(hi >= lo, "empty range [", lo, ", ", hi, "]");
  for (int tries = 0; tries < 10000; ++tries) {
    std::string v = std::to_string(rng.uniform_int(lo, hi));
    if (used.insert(v).second) return v;
  }
  throw Error(str_cat("fresh_number: no unused number left in [", lo, ", ", hi, "]"));
}

const std::vector<std::string>& syllables() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (const char* c : {"b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"})
      for (const char* w : {"a", "e", "i", "o", "u"}) out.push_back(std::string(c) + w);
    return out;
  }();
  return v;
}

std::string pseudo_word(Rng& rng) {
  int syll = static_cast<int>(rng.uniform_int(2, 3));
  std::string w;
  for (int i = 0; i < syll; ++i) {
    const size_t c = rng.index(14);  // consonant, then vowel: two draws, as the texts were made
    w += syllables()[c * 5 + rng.index(5)];
  }
  return w;
}

std::vector<std::string> distinct_pseudo_words(Rng& rng, size_t n, const std::set<std::string>& avoid) {
  std::set<std::string> seen(avoid);
  std::vector<std::string> out;
  out.reserve(n);
  size_t tries = 0;
  while (out.size() < n) {
    WM_CHECK(++tries < 100 * n + 1000, "cannot draw ", n, " distinct pseudo-words");
    std::string w = pseudo_word(rng);
    if (seen.insert(w).second) out.push_back(w);
  }
  return out;
}

const std::vector<std::string>& colours() {
  static const std::vector<std::string> v = {"red",   "blue",  "green", "yellow", "white",  "black",
                                             "brown", "grey",  "pink",  "purple", "orange", "silver",
                                             "golden", "violet", "teal"};
  return v;
}

const std::vector<std::string>& needle_things() {
  static const std::vector<std::string> v = {
      "lantern", "kettle",  "door",     "boat",   "clock",   "violin", "suitcase", "mirror",
      "carpet",  "bicycle", "teapot",   "umbrella", "piano", "compass", "telescope", "wagon",
      "chest",   "helmet",  "notebook", "statue", "tent",    "guitar", "canoe",    "scooter"};
  return v;
}

const std::vector<std::string>& person_names() {
  static const std::vector<std::string> v = {
      "Anna",  "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo",   "Ines",  "Jonas",
      "Kira",  "Lars",  "Mira",  "Nils",   "Olga",  "Pavel", "Rosa",  "Sven",   "Tara",  "Umar",
      "Vera",  "Willem", "Yusuf", "Zoe",   "Agnes", "Boris", "Celia", "Dario",  "Edith", "Felix",
      "Hanna", "Ivo",   "Jana",  "Karl",   "Lena",  "Marek", "Nora",  "Oskar",  "Petra", "Rafael"};
  return v;
}

const std::vector<std::string>& pet_names() {
  static const std::vector<std::string> v = {
      "Biscuit", "Pepper", "Luna",   "Max",    "Bella",  "Milo",    "Coco",   "Rocky",  "Daisy",
      "Oscar",   "Ginger", "Teddy",  "Nala",   "Simba",  "Rosie",   "Bailey", "Shadow", "Mango",
      "Pickles", "Waffles", "Noodle", "Ziggy", "Pip",    "Juno",    "Olive",  "Maple",  "Clover",
      "Pretzel", "Sprout", "Toffee", "Button", "Pebble", "Whiskers", "Fudge", "Nugget", "Socks"};
  return v;
}

namespace {

const std::vector<std::string> kAdj = {
    "quiet",  "old",     "small",   "bright",  "tall",   "narrow",  "busy",    "distant",
    "wooden", "dusty",   "gentle",  "cold",    "warm",   "crowded", "empty",   "ancient",
    "muddy",  "sunny",   "windy",   "hidden",  "broken", "shiny",   "heavy",   "patient",
    "curious", "tired",  "cheerful", "careful", "lazy",  "clever",  "proud",   "lonely"};
const std::vector<std::string> kAgent = {
    "farmer", "baker",  "sailor", "teacher",  "child",  "merchant", "painter", "fisherman",
    "traveller", "goat", "horse", "fox",      "heron",  "dog",      "cat",     "owl",
    "crow",   "rabbit", "beetle", "donkey",   "miller", "weaver",   "guard",   "potter"};
const std::vector<std::string> kPlace = {
    "market",  "river",   "harbour", "library", "orchard", "bridge", "village", "forest",
    "hill",    "valley",  "station", "square",  "meadow",  "garden", "mill",    "chapel",
    "workshop", "bakery", "lake",    "field",   "tower",   "cellar", "courtyard", "road"};
const std::vector<std::string> kIntrans = {"walked",   "waited", "rested",   "wandered", "paused",
                                           "sang",     "slept",  "worked",   "laughed",  "listened",
                                           "lingered", "hummed", "stumbled", "shivered"};
// Past forms that are also past participles.
const std::vector<std::string> kTrans = {"carried", "painted", "repaired", "counted",  "washed",
                                         "sold",    "found",   "lost",     "watched",  "cleaned",
                                         "opened",  "borrowed", "polished", "stacked", "sorted",
                                         "mended",  "dropped", "moved"};
const std::vector<std::string> kObj = {"basket", "barrel", "rope",  "ladder", "letter", "map",
                                       "blanket", "bucket", "coat", "drum",   "bell",   "net",
                                       "cart",   "wheel",  "bench", "candle", "box",    "jar",
                                       "spade",  "sack",   "kite",  "scarf",  "hammer", "shovel"};
const std::vector<std::string> kTime = {"morning", "afternoon", "evening", "night",
                                        "spring",  "summer",    "autumn",  "winter"};
const std::vector<std::string> kWeather = {"rain", "fog", "snow", "wind", "sunshine", "frost", "thunder", "hail"};
const std::vector<std::string> kAdv = {"slowly", "quickly", "quietly", "carefully", "happily",
                                       "suddenly", "twice", "again",  "early",     "late"};
const std::vector<std::string> kPlural = {"birds", "stones", "apples", "boats",  "sheep", "coins",
                                          "trees", "stars",  "crates", "fences", "geese", "lamps"};
// Measured attributes: numbers in filler that look like codes but answer nothing.
const std::vector<std::pair<std::string, std::string>> kMeasure = {
    {"weight", "grams"}, {"price", "coins"}, {"length", "millimetres"}, {"height", "millimetres"}};

const std::vector<std::string> kTemplates = {
    "The {adj} {agent} {intrans} near the {place}.",
    "In the {time}, {name} {trans} the {adj} {obj}.",
    "{name} said that the {obj} by the {place} was {adj}.",
    "A {adj} {agent} {intrans} {adv} along the {place}.",
    "Nobody knew why the {agent} had {trans} the {obj}.",
    "The {weather} came {adv}, and the {agent} {intrans} by the {place}.",
    "Every {time} the {agent} {trans} a {obj} at the {place}.",
    "{name} and {name} {intrans} at the {place} until the {time} ended.",
    "The road to the {place} was {adj} after the {weather}.",
    "There was a {adj} {obj} in the {place}.",
    "Someone had left a {obj} beside the {place}.",
    "The {agent} from the {place} {trans} the {obj} {adv}.",
    "It was a {adj} {time} in the {place}.",
    "{name} {intrans} {adv} and thought about the {place}.",
    "The {obj} in the {place} was {adj} and {adj}.",
    "Later, the {agent} {trans} the {obj} and {intrans}.",
    "From the {place} one could see the {adj} {place}.",
    "The {adj} {obj} belonged to {name}, who lived near the {place}.",
    "Nobody at the {place} {trans} the {obj} that {time}.",
    "The {measure} of the {colour} {thing} was {num4} {unit}.",
    "{name} counted {num2} {plural} at the {place}.",
    "The {agent} {intrans} while {name} {trans} the {obj}.",
    "After the {weather}, the {place} looked {adj}.",
    "The {time} bell rang {num1} times over the {place}.",
    "In {year}, the {place} was {adj} and full of {plural}.",
    "{name} {trans} the {colour} {thing} before the {weather} arrived."};

std::string expand(Rng& rng, const std::string& tmpl) {
  std::string out;
  std::string unit;       // set by {measure}, written by {unit}
  std::string last_name;  // two {name} slots name two people
  for (size_t i = 0; i < tmpl.size();) {
    if (tmpl[i] != '{') {
      out += tmpl[i++];
      continue;
    }
    size_t close = tmpl.find('}', i);
    std::string slot = tmpl.substr(i + 1, close - i - 1);
    i = close + 1;
    if (slot == "adj") out += rng.pick(kAdj);
    else if (slot == "agent") out += rng.pick(kAgent);
    else if (slot == "place") out += rng.pick(kPlace);
    else if (slot == "intrans") out += rng.pick(kIntrans);
    else if (slot == "trans") out += rng.pick(kTrans);
    else if (slot == "obj") out += rng.pick(kObj);
    else if (slot == "time") out += rng.pick(kTime);
    else if (slot == "weather") out += rng.pick(kWeather);
    else if (slot == "adv") out += rng.pick(kAdv);
    else if (slot == "plural") out += rng.pick(kPlural);
    else if (slot == "name") {
      std::string n = rng.pick(person_names());
      while (n == last_name) n = rng.pick(person_names());
      out += n;
      last_name = n;
    }
    else if (slot == "colour") out += rng.pick(colours());
    else if (slot == "thing") out += rng.pick(needle_things());
    else if (slot == "num4") out += std::to_string(rng.uniform_int(1000, 9999));
    else if (slot == "num2") out += std::to_string(rng.uniform_int(11, 99));
    else if (slot == "num1") out += std::to_string(rng.uniform_int(2, 9));
    else if (slot == "year") out += std::to_string(rng.uniform_int(1700, 1999));
    else if (slot == "measure") {
      const auto& m = kMeasure[rng.index(kMeasure.size())];
      out += m.first;
      unit = m.second;
    } else if (slot == "unit") {
      out += unit;
    } else {
      throw Error(str_cat("filler grammar: unknown slot {", slot, "}"));
    }
  }
  return out;
}

}  // namespace

std::string filler_sentence(Rng& rng, const std::vector<std::string>& avoid) {
  for (int tries = 0; tries < 1000; ++tries) {
    std::string s = capitalize(expand(rng, rng.pick(kTemplates)));
    bool ok = s.find("secret code") == std::string::npos;
    for (const std::string& a : avoid)
      if (!a.empty() && s.find(a) != std::string::npos) ok = false;
    if (ok) return s;
  }
  throw Error("filler_sentence: every draw contained a forbidden string");
}

std::vector<FillerUnit> make_filler(Rng& rng, const TokenCounter& count, int64_t budget,
                                    const std::vector<std::string>& avoid) {
  std::vector<FillerUnit> units;
  int64_t total = 0;
  int left_in_paragraph = static_cast<int>(rng.uniform_int(2, 6));
  while (budget > 0) {
    std::string sentence = filler_sentence(rng, avoid);
    bool end = --left_in_paragraph == 0;
    std::string text = sentence + (end ? "\n" : " ");
    int64_t n = count(text);
    if (!closer_with(total, n, budget)) break;
    units.push_back(FillerUnit{std::move(text), n, end});
    total += n;
    if (end) left_in_paragraph = static_cast<int>(rng.uniform_int(2, 6));
  }
  if (!units.empty() && !units.back().paragraph_end) {
    FillerUnit& last = units.back();
    last.text.back() = '\n';
    last.paragraph_end = true;
    last.tokens = count(last.text);
  }
  return units;
}

int64_t add_filler_segments(Sample& s, const TokenCounter& count, const std::vector<FillerUnit>& units,
                            size_t begin, size_t end, int* next_id) {
  int64_t added = 0;
  std::string text;
  for (size_t i = begin; i < end; ++i) {
    text += units[i].text;
    if (units[i].paragraph_end || i + 1 == end) {
      added += add_segment(s, count, str_cat("filler:", (*next_id)++), "filler", std::move(text));
      text.clear();
    }
  }
  return added;
}

}  // namespace detail
}  // namespace wm::llmtasks
