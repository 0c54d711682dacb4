#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) in ./build-fuzz and runs
# each for SECONDS (default 60) on a working corpus seeded from tests/fuzz/corpus/<target>,
# with the allocation and memory caps of a hostile input: 1 GiB RSS, no single malloc over 1 GiB.
#   bash tools/fuzz.sh [SECONDS] [TARGET...]     (targets: see tests/fuzz/CMakeLists.txt)
#   bash tools/fuzz.sh --build-only              (configure and build, run nothing)
# Targets run side by side, one per core (WM_FUZZ_JOBS to change it). Exits non-zero when any
# target finds something, naming its log. Installs clang and its runtime (libFuzzer) from Debian
# when missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_only=0
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
  shift
fi
seconds="${1:-60}"
shift || true
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "fuzz.sh: SECONDS must be a positive integer, got '$seconds'" >&2
  exit 2
fi
all=(safetensors pth gguf spill_file dit_config llm_config llm_weights suite tokenizer_json tokenizer_text http_request jinja)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=("${all[@]}"); fi

bash tools/setup.sh clang libclang-rt-14-dev
build="${WM_FUZZ_BUILD_DIR:-$root/build-fuzz}"
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DWM_FUZZ=ON >"$build/configure.log" 2>&1 || {
  cat "$build/configure.log"
  exit 1
}
cmake --build "$build" -j "$(nproc)" --target wm_fuzz
if [ "$build_only" = 1 ]; then exit 0; fi

# Each target runs single-threaded, so the machine's cores run that many targets at once
# (WM_FUZZ_JOBS, default nproc); the results are printed in the targets' order.
for t in "${targets[@]}"; do
  if [ ! -x "$build/tests/fuzz/fuzz_$t" ]; then
    echo "fuzz.sh: no target '$t' (have: ${all[*]})" >&2
    exit 2
  fi
done
mkdir -p "$build/findings"
run_target() {
  local t="$1" work="$build/corpus/$1" log="$build/fuzz_$1.log"
  mkdir -p "$work"
  # One thread: libtorch would otherwise start a pool per process for nothing.
  local rc=0
  OMP_NUM_THREADS=1 "$build/tests/fuzz/fuzz_$t" "$work" "tests/fuzz/corpus/$t" -max_total_time="$seconds" \
    -rss_limit_mb=1024 -malloc_limit_mb=1024 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$build/findings/$t-" >"$log" 2>&1 || rc=$?
  echo "$rc" >"$build/fuzz_$t.rc"
}
parallel="${WM_FUZZ_JOBS:-$(nproc)}"
if ! [[ "$parallel" =~ ^[0-9]+$ ]] || [ "$parallel" -lt 1 ]; then parallel=1; fi
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
  rm -f "$build/fuzz_$t.rc"
  run_target "$t" &
done
wait

status=0
for t in "${targets[@]}"; do
  log="$build/fuzz_$t.log"
  if [ "$(cat "$build/fuzz_$t.rc" 2>/dev/null)" = "0" ]; then
    execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
    echo "fuzz $t: ${execs} executions in ${seconds} s, no finding"
  else
    status=1
    echo "fuzz $t: FINDING (log: $log)" >&2
    grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5 >&2 || true
  fi
done
exit $status
