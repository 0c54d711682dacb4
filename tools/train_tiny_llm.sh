#!/usr/bin/env bash
# The recipe of the shipped tiny LLM (assets/models/tiny-llm): set-up and build, then eleven runs
# of wm_llm_train, each starting from the weights of the one before (--init-from).
#   1. recall: the training aid alone (2..8 bare pair lines, every key queried), from a mimetic
#      initialisation, until the look-up by key has formed (it jumps from chance at ~1,200 steps).
#   2. mqar at 64-128 tokens beside recall: the instruction line and up to ~20 pairs.
#   3. mqar at 128-256 tokens beside recall: up to ~50 pairs (it levels off near 67% at 256).
#   4. the same at RoPE base 1e5 instead of 1e4 (--rope-theta): more of each head's dimensions turn
#      slowly enough over 256 tokens to match a key by content wherever it stands.
#   5. the same with the learning rate decaying to 1e-4.
#   6. the lookup aid (values of several tokens) beside recall, mqar, niah and multifact at
#      64-160 tokens: writing a value on past its first token forms (~1,500 steps), and with it
#      single-needle retrieval and the multi-fact probes.
#   7. the same five at 128-256 tokens, mqar weighted up, the learning rate decaying to 1e-4.
#   8. the same at 192-256 tokens, niah and multifact weighted up, from 5e-4 down to 5e-5.
#   9. a third layer grown on (--grow-layers 1, its output projections at zero) and the aids
#      needles (2-5 needles) and facts (2-8 facts) beside the five, 128-256 tokens, 1e-3 -> 1e-4.
#  10. the planning world weighted up (plan:4) beside one share of each of the others.
#  11. more of the same with mqar weighted up too (plan:3, mqar:3), from 5e-4 down to 5e-5.
# A model of 2 layers of 128 (configs/tiny-llm-small.json); the loss on the answers only, AdamW
# (0.9, 0.999) without weight decay or clipping at a constant 1e-3: the settings under which
# the look-up forms at all (README, "How it got there"). Each run's folder holds its model,
# checkpoint/ and train.log; the last one's model is what ships.
#   bash tools/train_tiny_llm.sh [OUT]      # OUT: out/tiny-llm; about 6 hours on 2 cores
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:-out/tiny-llm}"
bash tools/build.sh
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
train="${WM_BUILD_DIR:-$root/build}/tools/llm_train/wm_llm_train"
common=(--weight-decay 0 --clip 1e6 --context-weight 0 --beta2 0.999 --lr 1e-3 --warmup 50
        --batch-tokens 8192 --eval-every 250 --save-every 250 --eval-samples 32)
"$train" -o "$out/1-recall" --config configs/tiny-llm-small.json --qk-init 0.05 --tasks recall \
  --curriculum 64:1500 --seed 1 --min-lr 1e-3 "${common[@]}"
"$train" -o "$out/2-mqar128" --init-from "$out/1-recall" --tasks recall:1,mqar:2 --all-queries \
  --curriculum 64-128:750 --seed 1 --min-lr 1e-3 "${common[@]}"
"$train" -o "$out/3-mqar256" --init-from "$out/2-mqar128" --tasks recall:1,mqar:3 --all-queries \
  --curriculum 128-256:1500 --seed 4 --min-lr 1e-3 "${common[@]}"
"$train" -o "$out/4-theta1e5" --init-from "$out/3-mqar256" --rope-theta 1e5 --tasks recall:1,mqar:3 --all-queries \
  --curriculum 128-256:1250 --seed 7 --min-lr 1e-3 "${common[@]}"
"$train" -o "$out/5-anneal" --init-from "$out/4-theta1e5" --tasks recall:1,mqar:3 --all-queries \
  --curriculum 128-256:1500 --seed 9 "${common[@]}" --min-lr 1e-4  # cosine decay
"$train" -o "$out/6-lookup" --init-from "$out/5-anneal" --tasks lookup:2,recall:1,mqar:1,niah:2,multifact:2 \
  --all-queries --curriculum 64-160:1750 --seed 22 --min-lr 1e-3 "${common[@]}"
"$train" -o "$out/7-anneal256" --init-from "$out/6-lookup" --tasks lookup:1,recall:1,mqar:3,niah:2,multifact:2 \
  --all-queries --curriculum 128-256:1500 --seed 23 "${common[@]}" --min-lr 1e-4  # cosine decay
"$train" -o "$out/8-long" --init-from "$out/7-anneal256" --tasks lookup:1,recall:1,mqar:3,niah:3,multifact:3 \
  --all-queries --curriculum 192-256:1000 --seed 25 "${common[@]}" --lr 5e-4 --min-lr 5e-5  # cosine decay
"$train" -o "$out/9-grow" --init-from "$out/8-long" --grow-layers 1 \
  --tasks needles:2,facts:2,niah:1,multifact:1,mqar:2,lookup:1,recall:1 --all-queries \
  --curriculum 128-256:1500 --seed 31 "${common[@]}" --min-lr 1e-4  # cosine decay
"$train" -o "$out/10-plan" --init-from "$out/9-grow" \
  --tasks plan:4,mqar:1,niah:1,multifact:1,lookup:1,needles:1,facts:1 --all-queries \
  --curriculum 128-256:1500 --seed 41 "${common[@]}" --min-lr 1e-4  # cosine decay
"$train" -o "$out/11-more" --init-from "$out/10-plan" \
  --tasks plan:3,mqar:3,niah:1,multifact:1,lookup:1,needles:1,facts:1 --all-queries \
  --curriculum 128-256:1500 --seed 51 "${common[@]}" --lr 5e-4 --min-lr 5e-5  # cosine decay
echo "train_tiny_llm.sh: the model is in $out/11-more"
