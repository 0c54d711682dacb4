#!/usr/bin/env bash
# The CUDA build (run by hand; CI never runs it): configures and builds the project against a
# libtorch with CUDA, WM_CUDA=ON, for the H100's architecture (sm_90), in a build folder of its
# own, then runs the test suite there. On a machine without a GPU every CUDA test skips with its
# reason; on one with a GPU they run.
#
#   bash tools/build_cuda.sh                 # build-cuda/, then the tests (ctest)
#   bash tools/build_cuda.sh --no-tests      # build only
#   bash tools/build_cuda.sh --keep-going    # build what builds past a failing target
#   bash tools/build_cuda.sh --target=wm_tests --no-tests   # one target
#
# Where the libtorch comes from:
#   WM_TORCH_PYTHON=python3   a Python that already has torch with CUDA (a GPU machine's image);
#   otherwise                 PyPI's torch wheel (CUDA) in a virtual environment of this script's
#                             own (WM_CUDA_VENV, default ~/.cache/worldmem/torch-cuda-venv);
#                             WM_TORCH_SPEC picks the version (default "torch").
# Other dependencies: the Debian packages of tools/setup.sh where apt-get works; or, on a
# machine without them, WM_DEPS_PREFIX=DIR naming a folder with the -dev packages unpacked in it
# (dpkg -x; nlohmann-json3-dev, libcli11-dev, libgtest-dev, libeigen3-dev, libpcre2-dev,
# libhiredis-dev with libhiredis0.14, and
# pkgconf), in which case FFmpeg/OpenCV may be missing and the media programs are left out.
# The CUDA toolkit (nvcc) must be on the PATH or in /usr/local/cuda.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${WM_BUILD_DIR:-$root/build-cuda}"
run_tests=1
keep_going=0
targets=()
for a in "$@"; do
  case "$a" in
    --no-tests) run_tests=0 ;;
    --keep-going) keep_going=1 ;;
    --target=*) targets+=(--target "${a#--target=}") ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_cuda.sh: unknown argument '$a' (--no-tests, --keep-going, --target=T, --help)" >&2; exit 2 ;;
  esac
done
t0=$(date +%s)

if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
command -v nvcc >/dev/null || { echo "build_cuda.sh: nvcc not found (install the CUDA toolkit)" >&2; exit 1; }

prefix_path=()
if [ -n "${WM_DEPS_PREFIX:-}" ]; then
  d="$(cd "$WM_DEPS_PREFIX" && pwd)"
  export PATH="$d/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$d/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$d/usr/lib/x86_64-linux-gnu/pkgconfig:$d/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$d"
  prefix_path+=("$d/usr")
else
  bash "$root/tools/setup.sh"
fi

if [ -n "${WM_TORCH_PYTHON:-}" ]; then
  py="$WM_TORCH_PYTHON"
else
  venv="${WM_CUDA_VENV:-$HOME/.cache/worldmem/torch-cuda-venv}"
  if [ ! -x "$venv/bin/python" ]; then
    echo "build_cuda.sh: creating $venv and installing PyPI's torch (a few GB)" >&2
    python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "${WM_TORCH_SPEC:-torch}"
  fi
  py="$venv/bin/python"
fi
read -r torch_version torch_cuda torch_cmake < <("$py" -W ignore -c \
  'import torch; print(torch.__version__, torch.version.cuda, torch.utils.cmake_prefix_path)')
if [ "$torch_cuda" = "None" ]; then
  echo "build_cuda.sh: $py's torch $torch_version has no CUDA" >&2
  exit 1
fi
echo "build_cuda.sh: torch $torch_version (CUDA $torch_cuda) at $torch_cmake; nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')" >&2
prefix_path+=("$torch_cmake")
# libtorch's own shared libraries (and the CUDA ones its wheel carries) for the programs.
torch_lib="$("$py" -W ignore -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"

# The CUDA libraries PyPI's torch links against come in its nvidia-* wheels; the linker must see
# those (a system NCCL or cuDNN of another version would not do), and libtorch's own libc10, not
# one a Debian libtorch installed beside it.
nvidia_libs="$("$py" -W ignore -c 'import glob, os, torch; sp = os.path.dirname(os.path.dirname(torch.__file__)); print(":".join(sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")) + glob.glob(os.path.join(sp, "nvidia", "*", "*", "lib")))))')"
link_dirs="$torch_lib${nvidia_libs:+:$nvidia_libs}"
generator=()
if command -v ninja >/dev/null 2>&1 && [ ! -f "$build/Makefile" ]; then generator=(-G Ninja); fi
IFS=';'; prefixes="${prefix_path[*]}"; unset IFS
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DWM_CUDA=ON -DWM_BUILD_VIEWER=OFF \
  -DCMAKE_PREFIX_PATH="$prefixes" -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_ARCHITECTURES=90 \
  -Dc10_LIBRARY="$torch_lib/libc10.so" -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$link_dirs" \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep "worldmem:" "$build.configure.log" >&2 || true
if [ "$keep_going" = 1 ]; then
  cmake --build "$build" -j "$(nproc)" "${targets[@]}" -- -k 0 || echo "build_cuda.sh: some targets failed (see above)" >&2
else
  cmake --build "$build" -j "$(nproc)" "${targets[@]}"
fi
t1=$(date +%s)
echo "build_cuda.sh: built in $((t1 - t0)) s in $build" >&2
if [ "$run_tests" = 1 ]; then
  export LD_LIBRARY_PATH="$link_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  (cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 900)
  echo "build_cuda.sh: tests done in $(( $(date +%s) - t1 )) s" >&2
fi
