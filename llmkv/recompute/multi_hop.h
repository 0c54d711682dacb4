#pragma once
// KEEP's multi-hop selection of memory units to recompute. Importance starts from the query's
// attention to each unit (direct). The most important units that fit the token budget are
// selected; then each selected unit's attention to the others raises their importance (by its own
// importance times the share of its attention they receive), and the selection is made again,
// until it stops changing. A unit the query hardly looks at, but that a unit it looks at depends
// on, is reached this way (a chain the query's attention alone misses).
#include <cstdint>
#include <functional>
#include <vector>

namespace wm::llm {

// The units in order of score (highest first; ties to the earlier unit) that are candidates and
// fit the budget together: a unit that does not fit is passed over for smaller ones after it.
// Returned in increasing unit order. scores, tokens and candidate have one entry per unit.
std::vector<int> top_within_budget(const std::vector<double>& scores, const std::vector<int64_t>& tokens,
                                   const std::vector<char>& candidate, int64_t budget);

// For units `from`, each one's attention over all units (rows of shares, any non-negative values).
using UnitRows = std::function<std::vector<std::vector<double>>(const std::vector<int>& from)>;

struct MultiHopSelection {
  std::vector<int> selected;   // increasing unit order
  std::vector<double> scores;  // the final importance per unit
  int hops = 0;                // propagation rounds run (0: max_hops was 0 or nothing was selected)
};

// The multi-hop selection above, at most max_hops propagation rounds. rows() is asked once per
// unit that gets selected (lazily: only selected units' attention is ever computed). Throws
// wm::Error when the vectors' sizes differ or a row has the wrong length.
MultiHopSelection multi_hop_select(const std::vector<double>& direct, const std::vector<int64_t>& tokens,
                                   const std::vector<char>& candidate, int64_t budget, const UnitRows& rows,
                                   int max_hops);

}  // namespace wm::llm
