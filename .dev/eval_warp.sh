#!/usr/bin/env bash
# usage: eval_warp.sh MODEL OUTDIR  (run from the repo root)
set -u
M=$1; O=$2; mkdir -p $O
export OMP_WAIT_POLICY=passive
for s in 1 3; do
  build/tools/train/wm_train --eval-only $M --eval-samples 64 --seed $s > $O/probe_seed$s.txt 2>&1
done
build/tools/make_suite/wm_make_suite --seed 77 --count 1 --min-seconds 60 --max-seconds 60 --out $O/suite77.json > /dev/null 2>&1 || true
build/tools/render/wm_render --model $M --suite $O/suite77.json --policy worldkv --side-by-side --upscale 2 --max-seconds 60 \
  --tile $O/rollout60_worldkv.png --tile-every 60 --out $O/rollout60_worldkv.mp4 > $O/render.txt 2>&1
