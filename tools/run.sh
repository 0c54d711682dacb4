#!/usr/bin/env bash
# The main job: set-up, Release build, then the core benchmark and a ground-truth render of a
# shipped revisit trajectory to MP4 (out/). Grows into the world-model rollout as it lands.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/tools/build.sh"
bin="${WM_BUILD_DIR:-$root/build}"
mkdir -p "$root/out"
"$bin/tools/bench_core/wm_bench_core" --json "$root/out/bench_core.json"
if [ -x "$bin/tools/render_world/wm_render_world" ]; then
  "$bin/tools/render_world/wm_render_world" --suite "$root/assets/suites/revisit60.json" --index 0 \
    --out "$root/out/world_gt.mp4"
fi
