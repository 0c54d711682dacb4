#pragma once
// Helpers of the Matrix-Game-2.0 conformance tests: the deterministic inputs the fixture script
// (tools/mg2_fixtures/make_dit_fixtures.py) generates, and the comparison.
#include <ATen/ATen.h>

#include "tests/gpu/cuda_test_util.h"
#include "tools/bench_dit/fixture_inputs.h"

namespace wm::test {

// The fixture script's input generator (shared with the benchmark program that checks the
// full-size model).
using bench::fixture_inputs;
using bench::fixture_uniform;

// max |a - b| / max |b| (0 when both are zero).
inline double rel_max_diff(const at::Tensor& a, const at::Tensor& b) { return rel_diff(a, b); }

}  // namespace wm::test
