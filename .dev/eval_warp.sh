#!/usr/bin/env bash
# usage: eval_warp.sh MODEL OUTDIR  (run from the repo root)
set -u
M=$1; O=$2; mkdir -p $O
export OMP_WAIT_POLICY=passive
date
for s in 1 3; do
  build/tools/train/wm_train --eval-only $M --eval-samples 64 --seed $s > $O/probe_seed$s.txt 2>&1
done
date
build/tools/render/wm_render --model $M --suite /tmp/ev/suite77.json --policy worldkv --side-by-side --upscale 2 --max-seconds 60 \
  --tile $O/rollout60_worldkv.png --tile-every 60 --out $O/rollout60_worldkv.mp4 > $O/render.txt 2>&1
date
for m in $M assets/models/tiny-ae/model.safetensors; do
  n=$(basename $(dirname $m))
  build/tools/revisit_bench/wm_revisit_bench --model $m --suite assets/suites/revisit60.json --episodes 3 --max-seconds 15 \
    --policies sliding_window worldkv worldkv_c --out-dir $O/rb_$n > $O/revisit_$n.txt 2>&1
  date
done
for r in 1 2; do
  for m in $M assets/models/tiny-ae/model.safetensors; do
    n=$(basename $(dirname $m))
    xvfb-run -a build/viewer/wm_viewer --model $m --software --seed 3 --chunks 40 --threads 2 \
      --inject "hold W 10c; hold Right 10c; hold W 10c; hold Right 10c" --summary-json $O/viewer_${n}_$r.json > $O/viewer_${n}_$r.txt 2>&1
  done
done
date
