#pragma once
// A plan-house memory of real prose: the house's JSON lines (plan_world.h) with paragraphs of the
// Debian Administrator's Handbook (prose.h) between them, standing for the notes an agent's
// memory keeps that have nothing to do with the task at hand (in the default memory, distractor
// objects play that part). wm_plan_bench --memory-text prose builds its episodes' memories so.
//
// The notes of an episode are fixed (they never change while its actions change the house's
// lines) and so is where they sit: the same episode's memory has the same layout at every step,
// each note a segment of its own ("note:<k>"), as each thing's line is ("mem:<name>").
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/llm_tasks/prose.h"
#include "tools/llm_tasks/sample.h"

namespace wm::llmtasks {

// An episode's notes: consecutive paragraphs of one split of the corpus.
struct ProseNotes {
  ProseSplit split = ProseSplit::Dev;   // prose_split_of(the episode's seed)
  size_t first = 0;                     // the first note's index in the split's paragraphs
  std::vector<std::string> paragraphs;  // in order, each without a newline
  int64_t tokens = 0;                   // their tokens as counted, each with its newline
};

// The notes of seed `seed`: consecutive paragraphs of corpus.paragraphs(prose_split_of(seed)) from
// a start drawn from the seed (wrapping at most once), each counted as paragraph + "\n", their
// total the closest to `budget` that closer_with allows (no note for a budget below 1).
// Deterministic: the same seed, budget, counter and corpus give the same notes.
ProseNotes make_prose_notes(uint64_t seed, int64_t budget, const TokenCounter& count, const ProseCorpus& corpus);

// The memory: `house` (World::memory_lines(), the agent's line first) with the notes spread evenly
// after its lines: note k of n follows house line floor(k * h / n) of h (so the agent's line
// comes first, then the first note). Each note is a segment {"note:<k>", "note", paragraph + "\n"}.
// The house's lines keep their order and texts; with no notes the memory is `house`. Throws
// wm::Error when there are notes and no house line.
std::vector<Segment> memory_with_notes(const std::vector<Segment>& house, const ProseNotes& notes);

}  // namespace wm::llmtasks
