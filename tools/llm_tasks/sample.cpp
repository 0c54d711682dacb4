#include "tools/llm_tasks/sample.h"

#include "runtime/error.h"
#include "tools/llm_tasks/rng.h"

namespace wm::llmtasks {

std::string Sample::text() const { return text_before(segments.size()); }

std::string Sample::text_before(size_t i) const {
  WM_CHECK(i <= segments.size(), "segment index ", i, " out of range (", segments.size(), " segments)");
  std::string out;
  out.reserve(offset_of(i));
  for (size_t k = 0; k < i; ++k) out += segments[k].text;
  return out;
}

size_t Sample::offset_of(size_t i) const {
  WM_CHECK(i <= segments.size(), "segment index ", i, " out of range (", segments.size(), " segments)");
  size_t n = 0;
  for (size_t k = 0; k < i; ++k) n += segments[k].text.size();
  return n;
}

std::vector<size_t> Sample::targets() const {
  std::vector<size_t> out;
  for (size_t k = 0; k < segments.size(); ++k)
    if (segments[k].target) out.push_back(k);
  return out;
}

size_t Sample::find(const std::string& id) const {
  for (size_t k = 0; k < segments.size(); ++k)
    if (segments[k].id == id) return k;
  return segments.size();
}

nlohmann::json Sample::to_json() const {
  nlohmann::json segs = nlohmann::json::array();
  for (const Segment& s : segments)
    segs.push_back({{"id", s.id}, {"kind", s.kind}, {"text", s.text}, {"target", s.target}});
  return {{"task", task}, {"seed", seed}, {"segments", segs}, {"meta", meta}};
}

Sample Sample::from_json(const nlohmann::json& j) {
  try {
    Sample s;
    s.task = j.at("task").get<std::string>();
    s.seed = j.at("seed").get<uint64_t>();
    for (const auto& g : j.at("segments"))
      s.segments.push_back(Segment{g.at("id").get<std::string>(), g.at("kind").get<std::string>(),
                                   g.at("text").get<std::string>(), g.at("target").get<bool>()});
    if (j.contains("meta")) s.meta = j.at("meta");
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat("Sample::from_json: ", e.what()));
  }
}

std::vector<std::string> task_names() { return {"mqar", "niah", "multifact", "plan"}; }
std::vector<std::string> prose_task_names() {
  return {"prose_niah", "prose_multikey", "prose_multivalue", "prose_vartrack", "prose_qa"};
}
std::vector<std::string> training_aid_names() { return {"copy", "recall", "lookup", "needles", "facts"}; }

Sample make_sample(const std::string& task, uint64_t seed, const GenOptions& options) {
  if (task == "mqar") return make_mqar(seed, options);
  if (task == "niah") return make_niah(seed, options);
  if (task == "multifact") return make_multifact(seed, options);
  if (task == "plan") return make_plan(seed, options);
  if (task == "copy") return make_copy(seed, options);
  if (task == "recall") return make_recall(seed, options);
  if (task == "lookup") return make_lookup(seed, options);
  if (task == "needles") return make_needles(seed, options);
  if (task == "facts") return make_facts(seed, options);
  if (task == "prose_niah") return make_prose_niah(seed, options);
  if (task == "prose_multikey") return make_prose_multikey(seed, options);
  if (task == "prose_multivalue") return make_prose_multivalue(seed, options);
  if (task == "prose_vartrack") return make_prose_vartrack(seed, options);
  if (task == "prose_qa") return make_prose_qa(seed, options);
  throw Error(str_cat("make_sample: unknown task '", task,
                      "' (expected mqar, niah, multifact, plan, copy, recall, lookup, needles, facts or a prose task: "
                      "prose_niah, prose_multikey, prose_multivalue, prose_vartrack, prose_qa)"));
}

bool is_heldout(uint64_t seed) { return (seed & kHeldoutBit) != 0; }

uint64_t training_seed(uint64_t index) {
  WM_CHECK(index < kHeldoutBit, "seed index must be below 2^47, got ", index);
  return index;
}

uint64_t heldout_seed(uint64_t index) {
  WM_CHECK(index < kHeldoutBit, "seed index must be below 2^47, got ", index);
  return index | kHeldoutBit;
}

const char* heldout_split(uint64_t first, uint64_t n) {
  const uint64_t last = first + (n > 0 ? n - 1 : 0);
  if (last < kDevEnd) return "dev";
  if (first >= kTestFirst && last < kHeldoutBit) return "test";
  return "neither";
}

std::vector<uint64_t> heldout_seeds(uint64_t first, size_t n) {
  std::vector<uint64_t> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(heldout_seed(first + i));
  return out;
}

std::string sample_corpus(uint64_t seed, int64_t approx_bytes) {
  static const int64_t kLengths[] = {256, 512, 1024, 2048};
  const std::vector<std::string> tasks = task_names();
  Rng rng(hash_combine(seed, hash_string("corpus")));
  GenOptions opt;
  opt.count = bytes_counter(4.0);
  std::string out;
  for (uint64_t i = 0; static_cast<int64_t>(out.size()) < approx_bytes; ++i) {
    opt.target_tokens = kLengths[rng.index(4)];
    uint64_t s = training_seed(rng.next() & (kHeldoutBit - 1));
    if (!out.empty()) out += "\n\n";
    out += make_sample(tasks[i % tasks.size()], s, opt).text();
  }
  return out;
}

}  // namespace wm::llmtasks
