#pragma once
// Text task generators for the tiny LLM of the LLM path (library wm_llm_tasks, namespace
// wm::llmtasks): the data it is trained and evaluated on, and the workloads on which benchmarks
// measure KV-memory policies. Every task is one that only memory solves: the answer is stated once,
// early, and asked for at the end; filler and distractors never contain it.
//
// Conventions shared by all tasks
// - A Sample is the concatenation of its segments' texts. Segment ids are unique within a sample
//   and name the blocks a memory policy can keep, bank or drop (`system`, `kv:12`, `filler:3`,
//   `needle:0`, `turn:7`, `mem:brass-key`, `step:4`).
// - Targets (target = true, kind "answer", id "<owner>:answer") are the answers. A target's text is
//   always " <answer>\n": one leading space, the answer (a number, a word, or one action of the
//   plan grammar, never containing a newline), one newline. The segment before a target ends with
//   the task's fixed cue (the key "zuvo" after "Recall:", "Answer:", "Step 4:"). A trainer puts
//   the loss on the target tokens; an evaluator feeds text_before(i), decodes greedily until the first "\n" and
//   compares with the target text exactly.
// - Length: GenOptions::target_tokens as counted by GenOptions::count, summed per segment (each
//   segment is counted once, never the whole text again). Generators stop at the segment that
//   brings the total closest to the target, so a sample is within a few % of it and never over by
//   more than one segment. Explicit sizes in the options (mqar_pairs, niah_needles, ...) win over
//   the length where both cannot hold, and so does each task's floor, the shortest sample it can
//   make (with bytes/4 tokens: mqar ~35, niah ~70, multifact ~100, plan ~170..290 tokens): a shorter
//   target gives a sample of about the floor. meta["tokens"] holds the per-segment sum.
// - Seeds: any uint64 seed gives a sample; the same (task, seed, options) gives the same text on
//   every platform. Seeds with bit 47 set are held out for evaluation (is_heldout), the others are
//   for training; training_seed(i) and heldout_seed(i) enumerate the two disjoint sets. The
//   corpus for the tokenizer (sample_corpus) uses training seeds only.
//
// Tasks (examples abbreviated with "..."):
//   mqar      multi-query associative recall. Pairs "code number", one line each, then queries.
//             Keys are distinct within a sample and come from a fixed pool of kMqarKeyPool
//             two-syllable pseudo-words; values are 2-digit numbers (10..99, may repeat).
//               system "Each line pairs a code word with a number. ..."
//               kv:0 "zuvo 48\n"  kv:1 "pelo 33\n" ...
//               recall "Recall:\n"  query:0 "pelo"  query:0:answer " 33\n" ...
//   niah      needles in a haystack. Procedural filler paragraphs (a grammar of this library),
//             1-5 needle sentences at chosen depths, then one question per needle.
//               filler:0 "The quiet heron waited near the harbour. ..."
//               needle:0 "The secret code of the blue lantern is 7261. "
//               question:0 "Question: What is the secret code of the blue lantern?\nAnswer:"
//               question:0:answer " 7261\n"
//   multifact EVOKE-style ChatML session. Facts in early user turns, many unrelated turns (small
//             talk, arithmetic and other templated questions), then probes. Every message is
//             segment turn:N (kind user / assistant); an assistant reply that answers a question is
//             split in three: turn:N "<|im_start|>assistant\nAnswer:", turn:N:answer " Biscuit\n"
//             (kind "answer" and a target for probes, kind "reply" and no target for the small
//             questions), turn:N:end "<|im_end|>\n".
//               turn:0 "<|im_start|>user\nBy the way, my dog is called Biscuit.<|im_end|>\n"
//               turn:1 "<|im_start|>assistant\nThanks, noted.\n<|im_end|>\n" ...
//               turn:40 "<|im_start|>user\nWhat is my dog called?<|im_end|>\n"
//               turn:41 "<|im_start|>assistant\nAnswer:" turn:41:answer " Biscuit\n" turn:41:end ...
//   plan      KEEP-style embodied planning in a text house (plan_world.h). Static rules (and a
//             worked example when the length allows), the object-state memory (one JSON line per
//             thing, id mem:<thing>, kind "state"), the goal, the actions done so far, then the
//             next actions as targets; after each target but the last, the memory lines it
//             changed follow (id step:K:mem:<thing>, kind "state"; a later line about a thing
//             replaces an earlier one).
//               system "You control a robot in a house. ..."
//               mem:agent "{\"object\": \"agent\", \"position\": \"in the hall\"}\n"
//               mem:study-door "{\"object\": \"study-door\", \"position\": \"in the hall\",
//                               \"state\": \"locked\", \"key\": \"brass-key\"}\n" ...
//               goal "Goal: put the apple in the fridge.\n"
//               step:1 "Step 1: goto bedroom\n"  step:2 "Step 2:"  step:2:answer " open drawer\n"
// Printed examples: tests/llm_tasks/test_llm_tasks.cpp (LlmTasks.PrintExamples, with
// WM_LLM_TASKS_PRINT=1 in the environment).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace wm::llmtasks {

struct Segment {
  std::string id;    // unique within the sample
  std::string kind;  // system, pair, filler, needle, query, user, assistant, state, action, cue, answer, ...
  std::string text;
  bool target = false;
};

struct Sample {
  std::string task;
  uint64_t seed = 0;
  std::vector<Segment> segments;
  // Task parameters the text was built from (sizes, the plan world's seed and spec, the goal,
  // the oracle's support per target, ...): for reproduction and analysis, never needed to read
  // the text.
  nlohmann::json meta = nlohmann::json::object();

  // The whole text: the concatenation of the segments' texts.
  std::string text() const;
  // The text of segments [0, i); i <= segments.size().
  std::string text_before(size_t i) const;
  // Byte offset of segment i in text(); i <= segments.size().
  size_t offset_of(size_t i) const;
  // Indices of the target segments, in order.
  std::vector<size_t> targets() const;
  // Index of the segment with this id, or segments.size() when there is none.
  size_t find(const std::string& id) const;

  nlohmann::json to_json() const;
  // Throws wm::Error when a field is missing or has the wrong type.
  static Sample from_json(const nlohmann::json& j);
};

// Number of tokens in a text. Generators call it once per segment (and once per filler sentence
// while choosing where to stop); it need not be additive, but the closer count(a + b) is to
// count(a) + count(b), the closer the sample comes to its target length.
using TokenCounter = std::function<int64_t(const std::string&)>;

// round(bytes / bytes_per_token), at least 1 for a non-empty text: a stand-in for a tokenizer.
TokenCounter bytes_counter(double bytes_per_token = 4.0);

class ProseCorpus;  // prose.h

// How a chat model's template wraps one user message and opens the assistant's reply, as text
// around the message's content: before_user (a default system turn and the user turn's opening),
// after_user (the user turn's end and the assistant's opening). The defaults are plain text for a
// model without a template. Programs fill it from the model's ChatTemplate (the generators
// never see the template itself).
struct ChatFormat {
  std::string before_user;
  std::string after_user = "\n";
};

struct GenOptions {
  int64_t target_tokens = 1024;  // >= 64
  TokenCounter count;            // empty: bytes_counter(4)

  // mqar
  int mqar_pairs = 0;    // key-value pairs (at most kMqarKeyPool); 0: as many as fit. When set
                         // and the pairs leave room, filler paragraphs sit between the pairs and
                         // the queries.
  int mqar_queries = 0;  // queried keys (distinct); 0: half of the pairs, clamped to [1, 64]

  // niah
  int niah_needles = 0;             // 1..5; 0: random 1..5 (fewer when the length is short)
  std::vector<double> niah_depths;  // one fraction in [0, 1] per needle (0 = before all filler,
                                    // 1 = after it); empty: random. Size sets the needle count
                                    // when niah_needles is 0.

  // multifact
  int multifact_facts = 0;  // facts planted and probed, 1..8; 0: random 1..min(5, target/128)
  bool multifact_distractors = true;  // statements about other people's dog, number, ...

  // plan
  int plan_targets = 0;  // consecutive next actions asked for; 0: random 1..3

  // prose tasks (prose_task_names()): the chat format the prompt is rendered in, and the prose the
  // haystacks are cut from (null: default_prose_corpus(), the Debian Administrator's Handbook).
  // niah_depths, when set, places prose_niah's needle (one depth).
  ChatFormat chat;
  std::shared_ptr<const ProseCorpus> prose;
};

// Size of mqar's key pool: the most pairs a sample holds. A longer target is padded with filler
// paragraphs between the pairs and the queries.
constexpr int kMqarKeyPool = 128;

// The shortest GenOptions::target_tokens any generator accepts.
constexpr int64_t kMinTargetTokens = 64;

// The task names: "mqar", "niah", "multifact", "plan".
std::vector<std::string> task_names();

// One sample of a task (task_names(), training_aid_names() or prose_task_names()). Throws
// wm::Error for an unknown task or invalid options.
Sample make_sample(const std::string& task, uint64_t seed, const GenOptions& options);

Sample make_mqar(uint64_t seed, const GenOptions& options);
Sample make_niah(uint64_t seed, const GenOptions& options);
Sample make_multifact(uint64_t seed, const GenOptions& options);
Sample make_plan(uint64_t seed, const GenOptions& options);

// Training aids: generators the trainer may mix in but no evaluation reports. "copy": rounds of
// 2..8 of mqar's pair lines ("simo 42\n" ...), each followed by the same lines shuffled as a
// target; its dense look-back targets make the look-up-by-key circuit that the tasks need form
// early, on mqar's own tokens (copy.cpp tells what did not work). A repeat spans several lines
// (the one exception to the target convention above). "recall": mqar at its shortest, 2..8 pair
// lines with no instruction before them (mqar_pairs sets the count), "Recall:\n", every key
// queried; its length ignores target_tokens (recall.cpp tells why it exists). "lookup": recall
// with values of several tokens (3-4 digit numbers, names, pseudo-words, colours: what niah and
// multifact ask for), so that writing a value on after its first token is learned too
// (lookup.cpp tells why). "needles" and "facts": niah and multifact with as many needles (2..5)
// or facts (2..8) as the length holds, to tell several apart (dense.cpp). make_sample accepts
// these names too.
std::vector<std::string> training_aid_names();
Sample make_copy(uint64_t seed, const GenOptions& options);
Sample make_recall(uint64_t seed, const GenOptions& options);
Sample make_lookup(uint64_t seed, const GenOptions& options);
Sample make_needles(uint64_t seed, const GenOptions& options);
Sample make_facts(uint64_t seed, const GenOptions& options);

// Long-context tasks over real prose, RULER-style (ruler.cpp): one user message of the model's chat
// format holding an instruction, a haystack of consecutive paragraphs of real English text
// (prose.h: the Debian Administrator's Handbook, dev and test seeds on disjoint files), the
// needles between paragraphs at spread depths and a question; then the assistant's reply opens
// with an answer prefix that fixes the answer's form, and the answers follow as targets. Unlike
// the tasks above, a target's text is " <answer>" with no newline (what the model writes after
// it is not scored), and an answer is normalized: digits, or a word as the needle states it.
// An evaluator scores it as the tasks above: greedy decoding after the prefix reproduces it.
//   prose_niah       one needle, "One of the special magic numbers for quiet-lantern is:
//                    4829173." (a 7-digit number, or a word for odd seed indices), asked for.
//   prose_multikey   four needles of that form with distinct keys; one of them is asked for.
//   prose_multivalue four needles with the same key and distinct numbers; all four asked for in
//                    the order they appear (four targets, "," between them).
//   prose_vartrack   a chain "VAR QXKRE = 52341." "VAR BHTWA = VAR QXKRE." ... of 5 variables
//                    spread over the text; every variable that holds the value asked for, in
//                    chain order (five targets).
//   prose_qa         one fact about a person stated once ("Greta keeps the backup tapes in the
//                    cellar."), asked for in other words ("Where does Greta keep the backup
//                    tapes?").
// Segments: "system" (before_user and the instruction; kind system), "filler:N" (a paragraph and
// its blank line), "needle:N" (kind needle), "question" (the question, after_user and the answer
// prefix; kind query), "question:answer:K" (targets) and "question:sep:K" ("," between answers).
// meta: split, depths, the paragraphs' first index, and per task the keys and values.
std::vector<std::string> prose_task_names();
Sample make_prose_niah(uint64_t seed, const GenOptions& options);
Sample make_prose_multikey(uint64_t seed, const GenOptions& options);
Sample make_prose_multivalue(uint64_t seed, const GenOptions& options);
Sample make_prose_vartrack(uint64_t seed, const GenOptions& options);
Sample make_prose_qa(uint64_t seed, const GenOptions& options);

// mqar's key pool: kMqarKeyPool distinct two-syllable pseudo-words, the same on every platform.
const std::vector<std::string>& mqar_key_pool();

// Seed split. Held out: bit 47 set. Training: bit 47 clear. Both functions take an index below
// 2^47 (throw wm::Error otherwise) and are injective, so the sets they enumerate are disjoint.
constexpr uint64_t kHeldoutBit = uint64_t(1) << 47;
bool is_heldout(uint64_t seed);
uint64_t training_seed(uint64_t index);
uint64_t heldout_seed(uint64_t index);
// heldout_seed(first), ..., heldout_seed(first + n - 1).
std::vector<uint64_t> heldout_seeds(uint64_t first, size_t n);

// Held-out indices are split again, so that what settings are chosen on is not what is reported:
// the dev range [0, kDevEnd) is where settings are tuned (the programs' default), the test range
// [kTestFirst, 2^47) where figures are reported; indices in between belong to neither.
constexpr uint64_t kDevEnd = 1000000;
constexpr uint64_t kTestFirst = 2000000;
// "dev", "test", or "neither" (the range [first, first + n) crosses or misses both).
const char* heldout_split(uint64_t first, uint64_t n);

// Text for training a tokenizer: samples of every task in turn (training seeds derived from seed,
// lengths 256..2048 bytes/4 tokens), separated by a blank line, until at least approx_bytes.
std::string sample_corpus(uint64_t seed, int64_t approx_bytes);

}  // namespace wm::llmtasks
