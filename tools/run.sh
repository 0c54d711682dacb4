#!/usr/bin/env bash
# The main job: set-up, Release build, then, with the embedded model: a rollout with memory
# (worldkv) rendered to out/rollout.mp4 beside the ground truth, and the revisit table of the
# memory policies on a small suite (out/bench/: JSON, CSV, plots).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/tools/build.sh"
bin="${WM_BUILD_DIR:-$root/build}"
cd "$root"
mkdir -p out
"$bin/tools/render/wm_render" --suite assets/suites/revisit60.json --index 2 --policy worldkv \
  --side-by-side --strip --max-seconds 20 -o out/rollout.mp4
"$bin/tools/revisit_bench/wm_revisit_bench" --suite assets/suites/revisit60.json --episodes 3 --max-seconds 15 \
  --policies full_kv sliding_window worldkv worldkv_c --out-dir out/bench
