#!/usr/bin/env bash
# Builds everything with a sanitizer and runs the test suite under it:
#   bash tools/sanitize.sh address [ctest args...]      ASan + UBSan in ./build-asan: everything,
#                                                       then the whole suite through ctest
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
  address) build="${WM_ASAN_BUILD_DIR:-$root/build-asan}" ;;
  thread) build="${WM_TSAN_BUILD_DIR:-$root/build-tsan}" ;;
  *)
    echo "usage: bash tools/sanitize.sh address|thread [ctest args...]" >&2
    exit 2
    ;;
esac
shift
bash tools/setup.sh
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWM_SANITIZE="$kind" \
  >"$build/configure.log" 2>&1 || {
  cat "$build/configure.log"
  exit 1
}
if [ "$kind" = thread ]; then
  cmake --build "$build" -j "$(nproc)" --target wm_runtime_tests
else
  cmake --build "$build" -j "$(nproc)"
fi
# Leak checking stays on for the project's code; libtorch's and OpenMP's process-lifetime
# allocations are not leaks of ours, so the suppressions name only those libraries.
supp="$build/lsan.supp"
printf 'leak:libtorch_cpu.so\nleak:libc10.so\nleak:libgomp.so\nleak:libopenblas\nleak:libprotobuf.so\n' >"$supp"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
export OMP_WAIT_POLICY=passive
cd "$build"
if [ "$kind" = thread ]; then
  exec "$build/tests/wm_runtime_tests" "$@"
fi
ctest --output-on-failure -j "$(nproc)" --timeout 1800 "$@"
