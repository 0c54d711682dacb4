#!/usr/bin/env bash
# Installs the Debian packages this project builds and runs with, plus any named as arguments
# (tools/fuzz.sh asks for clang's). Idempotent: when every package is already installed it
# returns at once without touching apt.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build ccache mold pkg-config
  libtorch-dev libopenblas0-openmp libdnnl-dev
  libopencv-dev libeigen3-dev libsdl2-dev libsdl2-ttf-dev fonts-dejavu-core
  libavcodec-dev libavformat-dev libavutil-dev libswscale-dev ffmpeg
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libpcre2-dev
  libhiredis-dev libxxhash-dev redis-server redis-tools libcpp-httplib-dev python3-venv
  libsentencepiece-dev debian-handbook
  xvfb xdotool
  "$@"
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
