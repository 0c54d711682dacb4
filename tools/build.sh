#!/usr/bin/env bash
# Installs the project's Debian packages (idempotent), configures and builds it in ./build
# (Release). Extra arguments go to the CMake configure step, e.g. -DTorch_DIR=... for a CUDA
# libtorch. Used by tools/run.sh and tools/test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash tools/setup.sh
build="${WM_BUILD_DIR:-$root/build}"
generator=()
if command -v ninja >/dev/null 2>&1 && [ ! -f "$build/Makefile" ]; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >"$build.configure.log" 2>&1 || {
  cat "$build.configure.log"
  exit 1
}
jobs="$(nproc)"
cmake --build "$build" -j "$jobs"
