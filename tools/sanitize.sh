#!/usr/bin/env bash
# Builds everything with a sanitizer and runs the test suite under it:
#   bash tools/sanitize.sh address [ctest args...]      ASan + UBSan in ./build-asan: everything,
#                                                       then the whole suite through ctest
#   bash tools/sanitize.sh address-core [gtest args...] ASan + UBSan in ./build-asan: the core and
#                                                       its suites (wm_runtime_tests) alone
#   bash tools/sanitize.sh thread [gtest args...]       TSan in ./build-tsan: the core and its
#                                                       suites (wm_runtime_tests), e.g.
#                                                       --gtest_filter='BlockStore.*' 
# libtorch itself is not instrumented; the project's code is. A sanitizer report fails the test
# that triggered it (UBSan does not recover; ASan and TSan abort with exit code 1).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
kind="${1:-}"
case "$kind" in
  address | address-core) build="${WM_ASAN_BUILD_DIR:-$root/build-asan}" ;;
  thread) build="${WM_TSAN_BUILD_DIR:-$root/build-tsan}" ;;
  *)
    echo "usage: bash tools/sanitize.sh address|address-core|thread [ctest or gtest args...]" >&2
    exit 2
    ;;
esac
shift
bash tools/setup.sh
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWM_SANITIZE="${kind%-core}" \
  >"$build/configure.log" 2>&1 || {
  cat "$build/configure.log"
  exit 1
}
if [ "$kind" != address ]; then
  cmake --build "$build" -j "$(nproc)" --target wm_runtime_tests
else
  cmake --build "$build" -j "$(nproc)"
fi
# Leak checking stays on for the project's code; the process-lifetime allocations of libtorch,
# OpenMP and the system libraries under SDL (D-Bus, X11, the GL drivers it loads) are not leaks
# of ours, so the suppressions name only those libraries.
supp="$build/lsan.supp"
printf '%s\n' leak:libtorch_cpu.so leak:libc10.so leak:libgomp.so leak:libopenblas leak:libprotobuf.so \
  leak:libdbus-1.so leak:libxerces-c leak:libSDL2 leak:libX11 leak:libGLX leak:libEGL >"$supp"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
export OMP_WAIT_POLICY=passive
export WM_TEST_TIME_SCALE="${WM_TEST_TIME_SCALE:-4}"  # tests that wait on a program allow for the slowdown
cd "$build"
if [ "$kind" != address ]; then
  # A binary that holds no test passes; one that should hold the core's suites must not.
  if ! "$build/tests/wm_runtime_tests" --gtest_list_tests | grep -q '^  '; then
    echo "sanitize.sh: $build/tests/wm_runtime_tests holds no test" >&2
    exit 1
  fi
  exec "$build/tests/wm_runtime_tests" "$@"
fi
if [ $# -gt 0 ]; then
  exec ctest --output-on-failure -j "$(nproc)" --timeout 1800 "$@"
fi
ctest --output-on-failure -j "$(nproc)" --timeout 1800 -E '^ViewerProgram$'
# The viewer's runs load Mesa's GL driver through SDL, which unloads it at exit: the driver's
# own allocations are then reported from a module that is gone, which no suppression can name.
# Leak checking is off for those runs only; address and undefined-behaviour checks stay on.
ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0}" \
  ctest --output-on-failure -j "$(nproc)" --timeout 1800 -R '^ViewerProgram$'

