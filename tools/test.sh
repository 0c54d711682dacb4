#!/usr/bin/env bash
# The test command: set-up, Release build, every GoogleTest suite through ctest, then a short
# run of each fuzz target (WM_FUZZ_SECONDS each, default 5; 0 skips) so a reader regression shows.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/tools/build.sh" "$@"
cd "${WM_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "$(nproc)" --timeout 600
fuzz_seconds="${WM_FUZZ_SECONDS:-5}"
if [ "$fuzz_seconds" != "0" ]; then
  bash "$root/tools/fuzz.sh" "$fuzz_seconds"
fi
