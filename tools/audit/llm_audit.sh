#!/usr/bin/env bash
# Hand-run audit of the LLM programs (wm_llm, wm_llm_bench, wm_plan_bench, wm_bench_llm,
# wm_llm_train) against careless and hostile inputs: the cases of issue 35 and more of the same
# kind. Each case runs in a fresh folder with its inputs; the audit records the exit status, the
# first line the program wrote to stderr that says error or warning (else its first line), and
# what the run left: files added to the case's folder (+), files of the case or of the repository
# that were removed or changed (LOST / CHANGED), "frame #" backtrace lines, and crashes (a signal
# the case did not send, "terminate called", a sanitizer report). Prints a Markdown table and a
# summary line; exits non-zero when any case crashed, lost or changed a file, or showed a trace.
#   bash tools/audit/llm_audit.sh [BUILD_DIR]       (default: build; about three minutes on 2 cores)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
llm="$build/tools/llm/wm_llm"
bench="$build/tools/llm_bench/wm_llm_bench"
plan="$build/tools/plan_bench/wm_plan_bench"
bllm="$build/tools/bench_llm/wm_bench_llm"
train="$build/tools/llm_train/wm_llm_train"
for b in "$llm" "$bench" "$plan" "$bllm" "$train"; do
  [ -x "$b" ] || { echo "llm_audit: $b is not built" >&2; exit 2; }
done
model="$root/assets/models/tiny-llm"
tok="$model/tokenizer.json"
work="$(mktemp -d "${TMPDIR:-/tmp}/wm_llm_audit.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
repo_state() { (cd "$root" && git status --porcelain --untracked-files=all -- assets configs tests/llmkv/fixtures | sort); }
repo_before="$(repo_state)"

rows=()
crashes=0 lost=0 traces=0 n=0

# A copy of the embedded model in $1.
model_copy() { mkdir -p "$1" && cp "$model"/* "$1"/; }
# A file's listing with sizes and checksums, to see what a run added, removed or changed.
listing() { (cd "$1" && find . -mindepth 1 \( -type f -printf '%p %s ' -exec sh -c 'cksum < "$1" | cut -d" " -f1' _ {} \; \) -o \( ! -type f -printf '%p %y\n' \) | sort); }

# run_case ID "description" EXPECTED_SIGNAL -- command...   (in $case, after its setup)
# The command runs with cwd $cwd (default: the repository) and stdin from /dev/null.
run_case() {
  local id="$1" desc="$2" sent="$3"
  shift 4
  local before after err rc first added removed changed frames crash
  before="$(listing "$case")"
  err="$case/../$id.err"
  (cd "${cwd:-$root}" && timeout -s KILL 180 "$@" </dev/null >"$case/../$id.out" 2>"$err")
  rc=$?
  finish_case "$id" "$desc" "$sent" "$rc" "$before"
}

# Records a case whose program ran (rc given) and whose stderr is in $case/../ID.err.
finish_case() {
  local id="$1" desc="$2" sent="$3" rc="$4" before="$5"
  local err="$case/../$id.err" after first added removed changed frames crash left
  after="$(listing "$case")"
  first="$(grep -m1 -E 'error|warning' "$err" || true)"
  [ -n "$first" ] || first="$(head -n1 "$err")"
  first="${first//|/\\|}"
  [ ${#first} -gt 150 ] && first="${first:0:147}..."
  added="$(comm -13 <(echo "$before" | cut -d' ' -f1 | sort) <(echo "$after" | cut -d' ' -f1 | sort) | tr '\n' ' ')"
  removed="$(comm -23 <(echo "$before" | cut -d' ' -f1 | sort) <(echo "$after" | cut -d' ' -f1 | sort) | tr '\n' ' ')"
  changed="$(comm -23 <(echo "$before") <(echo "$after") | cut -d' ' -f1 | grep -vxF -f <(echo "$removed" | tr ' ' '\n' | sed '/^$/d') | tr '\n' ' ' || true)"
  frames="$(grep -c 'frame #' "$err" || true)"
  crash=""
  if [ "$rc" -ge 128 ] && [ "$rc" -ne $((128 + sent)) ] && [ "$rc" -ne 124 ]; then crash="signal $((rc - 128))"; fi
  grep -qE 'terminate called|Segmentation fault|AddressSanitizer|core dumped' "$err" && crash="${crash} abort"
  left=""
  [ -n "$added" ] && left="+ ${added}"
  [ -n "$removed" ] && left="${left} LOST ${removed}" && lost=$((lost + 1))
  [ -n "$changed" ] && left="${left} CHANGED ${changed}" && lost=$((lost + 1))
  local repo_now
  repo_now="$(repo_state)"
  if [ "$repo_now" != "$repo_before" ]; then
    left="${left} REPOSITORY CHANGED: $(comm -13 <(echo "$repo_before") <(echo "$repo_now") | tr '\n' ' ')"
    lost=$((lost + 1))
  fi
  [ -n "$left" ] || left="nothing"
  [ "$frames" -gt 0 ] && traces=$((traces + 1))
  [ -n "$crash" ] && crashes=$((crashes + 1))
  n=$((n + 1))
  local notes=""
  [ "$frames" -gt 0 ] && notes="; $frames frame lines"
  [ -n "$crash" ] && notes="$notes; CRASH $crash"
  rows+=("| $id | $desc | $rc | ${first:-(none)} | $left$notes |")
  echo "llm_audit: $id rc $rc" >&2
}

# Starts a case in the background; wait_then_signal waits for a condition and signals it.
start_case() {
  local id="$1"
  shift
  (cd "${cwd:-$root}" && exec "$@" </dev/null >"$case/../$id.out" 2>"$case/../$id.err") &
  bg=$!
}
wait_then_signal() {  # CONDITION-COMMAND SIGNAL
  local cond="$1" sig="$2" i
  for i in $(seq 1 600); do
    if eval "$cond"; then break; fi
    kill -0 "$bg" 2>/dev/null || break
    sleep 0.1
  done
  sleep 0.3
  kill -s "$sig" "$bg" 2>/dev/null
  wait "$bg"
  return $?
}
new_case() { case="$work/$1/dir"; mkdir -p "$case"; cwd=""; }

# --- Issue 35's items ----------------------------------------------------------------------------

new_case I1; mkdir -p "$case/s/keep"; echo precious >"$case/s/keep/thesis.txt"
before="$(listing "$case")"
start_case I1 "$plan" --policies keep --spill-dir "$case/s" --episodes 1000 --threads 1
wait_then_signal "grep -q 'episodes (driver' '$case/../I1.err'" INT; rc=$?
finish_case I1 "plan_bench --spill-dir S (S/keep/thesis.txt there), SIGINT mid-run" 2 "$rc" "$before"

new_case I2a; run_case I2a "llm --dump-logits X --stats-json X" 0 -- "$llm" -p hi -n 2 --dump-logits "$case/X" --stats-json "$case/X"
new_case I2b; ln -s X "$case/L"; run_case I2b "llm --dump-logits X --stats-json L (L -> X, X absent)" 0 -- "$llm" -p hi -n 2 --dump-logits "$case/X" --stats-json "$case/L"
new_case I2c; run_case I2c "llm_bench --json X --csv ./X" 0 -- "$bench" --tasks mqar --contexts 64 --samples 1 --json "$case/X" --csv "$case/./X"
new_case I2d; run_case I2d "plan_bench --json X --csv X" 0 -- "$plan" --episodes 1 --max-steps 1 --memory-tokens 64 --policies full_recompute --json "$case/X" --csv "$case/X"

new_case I3a; model_copy "$case/m"; sed -i 's/"vocab_size": 2048/"vocab_size": 4194304/' "$case/m/config.json"
run_case I3a "llm: config vocab_size 2^22 beside the 3 MB checkpoint" 0 -- /usr/bin/time -f "peak RSS %M KiB, %e s" "$llm" -m "$case/m" -p hi -n 2
new_case I3b; sed -e 's/"vocab_size": [0-9]*/"vocab_size": 16777216/' "$root/configs/qwen2-0.5b.json" >"$case/huge.json"
run_case I3b "bench_llm -m qwen2-0.5b.json with vocab_size 2^24 (random weights, 60 GB)" 0 -- "$bllm" -m "$case/huge.json" --contexts 64 --bank-block 0
new_case I3c; cp "$work/I3b/dir/huge.json" "$case/"
run_case I3c "plan_bench -m the same config" 0 -- "$plan" -m "$case/huge.json" --episodes 1
new_case I3d; model_copy "$case/m"; sed -i 's/"intermediate_size": 256/"intermediate_size": 1048576/' "$case/m/config.json"
run_case I3d "llm: config intermediate_size 2^20 beside the checkpoint" 0 -- "$llm" -m "$case/m" -p hi -n 2

new_case I4a; head -c 2097152 /dev/urandom | base64 -w 80 | head -c 2097152 >"$case/p.txt"
run_case I4a "llm -f 2 MiB prompt (default --max-prompt-bytes 256 KiB)" 0 -- "$llm" -f "$case/p.txt" -n 1
new_case I4b; run_case I4b "llm -f /dev/zero" 0 -- "$llm" -f /dev/zero -n 1
new_case I4c; for i in $(seq 1 1400); do printf 'The key %d opens it. ' $((i * 7919 % 1000)); done >"$case/long.txt"
run_case I4c "llm -f prompt of ~9k tokens (trained on 4096 positions)" 0 -- "$llm" -f "$case/long.txt" -n 1
new_case I4d; cp "$work/I4c/dir/long.txt" "$case/"
run_case I4d "the same with --strict-positions" 0 -- "$llm" -f "$case/long.txt" -n 1 --strict-positions
new_case I4e; head -c 15000 "$work/I4a/dir/p.txt" >"$case/p.txt"
run_case I4e "llm -f 15 KB of base64 (~15k tokens): prefill progress" 0 -- "$llm" -f "$case/p.txt" -n 1

new_case I5; mkdir -p "$case/sp"; echo mine >"$case/sp/notes.txt"
before="$(listing "$case")"
start_case I5 "$bench" --policies evoke --budgets 64 --tasks multifact --contexts 512 --samples 1000 --bank-host-mib 0.01 --spill-dir "$case/sp"
wait_then_signal "find '$case/sp' -name '*.wmkv' | grep -q ." TERM; rc=$?
finish_case I5 "llm_bench --spill-dir S (evoke spilling), SIGTERM mid-run" 15 "$rc" "$before"
new_case I5b; mkdir -p "$case/sp/wm_llm_bench.3999999"; head -c 4096 /dev/zero >"$case/sp/wm_llm_bench.3999999/turn_3-0.wmkv"; head -c 4096 /dev/zero >"$case/sp/turn_1-0.wmkv"
run_case I5b "llm_bench --spill-dir S holding an earlier run's spill files" 0 -- "$bench" --policies evoke --budgets 64 --tasks multifact --contexts 512 --samples 1 --bank-host-mib 0.01 --spill-dir "$case/sp"

new_case I6; before="$(listing "$case")"
rc=$(cd "$root" && bash -c '"$1" -p hi -n 200 --stats-json "$2/s.json" --dump-logits "$2/l.npy" </dev/null 2>"$2/../I6.err" | head -c 1 >/dev/null; echo ${PIPESTATUS[0]}' _ "$llm" "$case")
finish_case I6 "llm ... --stats-json --dump-logits \\| head -c 1 (SIGPIPE)" 13 "$rc" "$before"

new_case I7; model_copy "$case/m"
python3 - "$case/m/model.safetensors" <<'EOF'
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
s, e = h["model.norm.weight"]["data_offsets"]
h["model.norm.weight"]["data_offsets"] = [64, 64 + e - s]
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(p, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
EOF
run_case I7 "llm: model.norm.weight's data_offsets inside the embedding's bytes" 0 -- "$llm" -m "$case/m" -p hi -n 2

new_case I8a; run_case I8a "bench_llm --policies h2o --policy-budget nan" 0 -- "$bllm" -m "$model" --contexts 64 --bank-block 0 --policies h2o --policy-budget nan
new_case I8b; run_case I8b "plan_bench --policies keep --check-layers 5 (3 layers)" 0 -- "$plan" --policies keep --check-layers 5 --episodes 1 --max-steps 1 --memory-tokens 64
new_case I8c; run_case I8c "llm --policy full --kv-budget 8" 0 -- "$llm" -p hi -n 1 --policy full --kv-budget 8
new_case I8d; run_case I8d "llm_bench --policies evoke --kind-floor bogus:2" 0 -- "$bench" --policies evoke --budgets 64 --tasks multifact --contexts 256 --samples 1 --kind-floor bogus:2
new_case I8e; run_case I8e "llm --seed -1" 0 -- "$llm" -p hi -n 1 --seed -1
new_case I8f; run_case I8f "llm --seed 18446744073709551616" 0 -- "$llm" -p hi -n 1 --seed 18446744073709551616
new_case I8g; run_case I8g "plan_bench --load-mib-per-s 1e-9" 0 -- "$plan" --load-mib-per-s 1e-9 --episodes 1
new_case I8h; run_case I8h "llm --dtype float16 (CPU)" 0 -- "$llm" -p hi -n 1 --dtype float16
new_case I8i; run_case I8i "bench_llm --dtype float16 (CPU)" 0 -- "$bllm" -m "$model" --contexts 64 --bank-block 0 --dtype float16

new_case I9a; run_case I9a "bench_llm --contexts 4194304 under ulimit -v 8 GiB" 0 -- bash -c 'ulimit -v 8388608; exec "$@"' _ "$bllm" -m "$model" --contexts 4194304 --bank-block 0
new_case I9b; printf '{"model_type":"qwen2","hidden_size":32,"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,"max_position_embeddings":512,"tie_word_embeddings":true,"vocab_size":500}' >"$case/c.json"
(cd "$root" && "$train" -o "$case/run" --config "$case/c.json" --tokenizer "$tok" --tasks recall --batch-tokens 128 --eval-samples 1 --warmup 1 --curriculum 64:1 >/dev/null 2>&1)
truncate -s 100 "$case/run/checkpoint/optimizer.pt"
run_case I9b "llm_train --resume with a damaged optimizer.pt" 0 -- "$train" -o "$case/run" --config "$case/c.json" --tokenizer "$tok" --tasks recall --batch-tokens 128 --eval-samples 1 --warmup 1 --curriculum 64:2 --resume

new_case I10a; cwd="$case"; run_case I10a "llm run outside the repository (default model)" 0 -- "$llm" -p hi -n 2
new_case I10b; run_case I10b "llm -p ''" 0 -- "$llm" -p "" -n 1
new_case I10c; mkdir "$case/d"; run_case I10c "llm -f DIR" 0 -- "$llm" -f "$case/d" -n 1
new_case I10d; run_case I10d "llm -m ''" 0 -- "$llm" -m "" -p hi
new_case I10e; model_copy "$case/m"; rm "$case/m/tokenizer.json"; mkdir "$case/m/tokenizer.json"
run_case I10e "llm: tokenizer.json is a folder" 0 -- "$llm" -m "$case/m" -p hi -n 1
new_case I10f; model_copy "$case/m"; rm "$case/m/model.safetensors"; ln -s "$case/nowhere.safetensors" "$case/m/model.safetensors"
run_case I10f "llm: model.safetensors a dangling link" 0 -- "$llm" -m "$case/m" -p hi -n 1
new_case I10g; model_copy "$case/m"; echo '{"eos_token_id": 5000}' >"$case/m/generation_config.json"
run_case I10g "llm: generation_config.json eos_token_id 5000 (vocab 2048)" 0 -- "$llm" -m "$case/m" -p hi -n 1
new_case I10h; run_case I10h "llm --stop-token -1" 0 -- "$llm" -p hi --stop-token -1
new_case I10i; run_case I10i "llm --policy pyramidkv --kv-budget 1" 0 -- "$llm" -p hi -n 1 --policy pyramidkv --kv-budget 1

new_case I11a; run_case I11a "llm_bench -m missing --plots P/Q (P absent)" 0 -- "$bench" -m "$case/missing" --plots "$case/P/Q"
new_case I11b; run_case I11b "llm_bench -m missing --spill-dir S/T (S absent)" 0 -- "$bench" -m "$case/missing" --bank-host-mib 1 --spill-dir "$case/S/T"
new_case I11c; echo '{"model_type":"qwen2"}' >"$case/bad.json"
run_case I11c "llm_train --config bad.json -o O/run (O absent)" 0 -- "$train" --config "$case/bad.json" --tokenizer "$tok" -o "$case/O/run"
new_case I11d; echo '{"model_type":"qwen2"}' >"$case/bad.json"
run_case I11d "plan_bench -m bad.json --plots P/Q --spill-dir S/T" 0 -- "$plan" -m "$case/bad.json" --plots "$case/P/Q" --spill-dir "$case/S/T"

# --- More of the same kind -----------------------------------------------------------------------

new_case A01; model_copy "$case/m"; run_case A01 "llm --stats-json MODEL/config.json (a copy)" 0 -- "$llm" -m "$case/m" -p hi -n 1 --stats-json "$case/m/config.json"
new_case A02; echo "Recall:" >"$case/p.txt"; run_case A02 "llm -f p.txt --stats-json p.txt" 0 -- "$llm" -f "$case/p.txt" -n 1 --stats-json "$case/p.txt"
new_case A03; run_case A03 "llm --dump-logits /dev/null --stats-json /dev/null" 0 -- "$llm" -p hi -n 1 --dump-logits /dev/null --stats-json /dev/null
new_case A04; mkdir "$case/d"; run_case A04 "llm --stats-json DIR" 0 -- "$llm" -p hi -n 1 --stats-json "$case/d"
new_case A05; run_case A05 "llm --stats-json /proc/x/s.json" 0 -- "$llm" -p hi -n 1 --stats-json /proc/x/s.json
new_case A06; run_case A06 "llm -m MODEL/config.json (a file)" 0 -- "$llm" -m "$model/config.json" -p hi
new_case A07; model_copy "$case/m"; rm "$case/m/config.json"; run_case A07 "llm: no config.json" 0 -- "$llm" -m "$case/m" -p hi
new_case A08; model_copy "$case/m"; echo '{"model_type": "qwen2", ' >"$case/m/config.json"; run_case A08 "llm: config.json not JSON" 0 -- "$llm" -m "$case/m" -p hi
new_case A09; model_copy "$case/m"; sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 2/' "$case/m/config.json"
run_case A09 "llm: config 2 layers, checkpoint 3" 0 -- "$llm" -m "$case/m" -p hi
new_case A10; model_copy "$case/m"; truncate -s 1500000 "$case/m/model.safetensors"; run_case A10 "llm: model.safetensors cut in half" 0 -- "$llm" -m "$case/m" -p hi
new_case A11; model_copy "$case/m"
python3 - "$case/m/model.safetensors" <<'EOF'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
s = json.loads(b[8:8 + n])["model.norm.weight"]["data_offsets"][0]
b[8 + n + s:8 + n + s + 4] = b"\x00\x00\xc0\x7f"  # a NaN gain
open(p, "wb").write(bytes(b))
EOF
run_case A11 "llm: a NaN in model.norm.weight" 0 -- "$llm" -m "$case/m" -p hi
new_case A12; model_copy "$case/m"; echo 'garbage' >"$case/m/tokenizer.json"; run_case A12 "llm: tokenizer.json garbage" 0 -- "$llm" -m "$case/m" -p hi
new_case A13; model_copy "$case/m"; rm "$case/m/tokenizer.json"; ln -s /dev/zero "$case/m/tokenizer.json"
run_case A13 "llm: tokenizer.json a link to /dev/zero" 0 -- "$llm" -m "$case/m" -p hi
new_case A14; run_case A14 "llm -f missing.txt" 0 -- "$llm" -f "$case/missing.txt"
new_case A15; run_case A15 "llm --max-prompt-bytes 0" 0 -- "$llm" -p hi --max-prompt-bytes 0
new_case A16; run_case A16 "llm --chat, stdin /dev/zero (no newline)" 0 -- bash -c 'exec "$@" </dev/zero' _ "$llm" --chat -n 1
new_case A17; run_case A17 "llm --beams 2 --dump-logits X" 0 -- "$llm" -p hi --beams 2 --dump-logits "$case/X"
new_case A18; run_case A18 "llm --device cuda:3 (no GPU)" 0 -- "$llm" -p hi --device cuda:3
new_case A19; run_case A19 "llm --stop ''" 0 -- "$llm" -p hi --stop ""
new_case A20; run_case A20 "llm --top-p 0" 0 -- "$llm" -p hi --top-p 0
new_case A21; run_case A21 "llm_bench --budgets abc" 0 -- "$bench" --budgets abc --samples 1
new_case A22; echo data >"$case/f"; run_case A22 "llm_bench --spill-dir FILE --bank-host-mib 1" 0 -- "$bench" --policies evoke --budgets 64 --tasks multifact --contexts 256 --samples 1 --bank-host-mib 1 --spill-dir "$case/f"
new_case A23; run_case A23 "llm_bench --json X --plots X" 0 -- "$bench" --tasks mqar --contexts 64 --samples 1 --json "$case/X" --plots "$case/X"
new_case A24; run_case A24 "llm_bench --spill-dir S without --bank-host-mib" 0 -- "$bench" --samples 1 --spill-dir "$case/S"
new_case A25; mkdir -p "$case/sp"
before="$(listing "$case")"
(cd "$root" && "$bench" --policies evoke --budgets 64 --tasks multifact --contexts 512 --samples 3 --bank-host-mib 0.01 --spill-dir "$case/sp" >/dev/null 2>"$case/../A25b.err") &
other=$!
(cd "$root" && "$bench" --policies evoke --budgets 64 --tasks multifact --contexts 512 --samples 3 --bank-host-mib 0.01 --spill-dir "$case/sp" >/dev/null 2>"$case/../A25.err"); rc=$?
wait "$other"; rc2=$?
[ "$rc2" -ne 0 ] && rc=$rc2
finish_case A25 "two llm_bench runs at once on one --spill-dir" 0 "$rc" "$before"
new_case A26; run_case A26 "plan_bench --pair-with keep, keep not run" 0 -- "$plan" --policies full_recompute --pair-with keep --episodes 1
new_case A27; run_case A27 "plan_bench --policies keep keep" 0 -- "$plan" --policies keep keep --episodes 1
new_case A28; run_case A28 "plan_bench --bank-tier disk --bank-host-mib 5" 0 -- "$plan" --bank-tier disk --bank-host-mib 5 --episodes 1
new_case A29; run_case A29 "plan_bench --spill-dir /proc/x" 0 -- "$plan" --spill-dir /proc/x --episodes 1 --max-steps 1 --memory-tokens 64 --policies full_recompute
new_case A30; run_case A30 "plan_bench --layers 2 with a model folder" 0 -- "$plan" --layers 2 --episodes 1
new_case A31; run_case A31 "plan_bench --ratio inf" 0 -- "$plan" --ratio inf --episodes 1
new_case A32; run_case A32 "bench_llm --prefill-chunk 0" 0 -- "$bllm" --prefill-chunk 0
new_case A33; echo '{"model_type":"qwen2"' >"$case/g.json"; run_case A33 "bench_llm -m garbage config" 0 -- "$bllm" -m "$case/g.json" --contexts 64
new_case A34; run_case A34 "bench_llm --policy-budget 0.5 without --policies" 0 -- "$bllm" -m "$model" --contexts 64 --policy-budget 0.5
new_case A35; run_case A35 "llm_train --resume without a checkpoint" 0 -- "$train" -o "$case/run" --tokenizer "$tok" --resume
new_case A36; cp -r "$work/I9b/dir/run" "$case/run"; cp "$work/I9b/dir/c.json" "$case/"; (cd "$root" && "$train" -o "$case/run" --config "$case/c.json" --tokenizer "$tok" --tasks recall --batch-tokens 128 --eval-samples 1 --warmup 1 --curriculum 64:1 >/dev/null 2>&1)
echo '{"step": "three", "seed": 1}' >"$case/run/checkpoint/trainer_state.json"
run_case A36 "llm_train --resume, trainer_state.json with a string step" 0 -- "$train" -o "$case/run" --config "$case/c.json" --tokenizer "$tok" --tasks recall --batch-tokens 128 --eval-samples 1 --warmup 1 --curriculum 64:2 --resume
new_case A37; echo data >"$case/f"; run_case A37 "llm_train -o FILE" 0 -- "$train" -o "$case/f" --tokenizer "$tok"
new_case A38; model_copy "$case/m"; rm "$case/m/model.safetensors"; ln -s "$case/none" "$case/m/model.safetensors"
run_case A38 "llm_train --init-from a folder with a dangling model.safetensors" 0 -- "$train" -o "$case/run" --init-from "$case/m"
new_case A39; before="$(listing "$case")"
start_case A39 "$llm" -f "$work/I4e/dir/p.txt" -n 1 --stats-json "$case/s.json" --dump-logits "$case/l.npy"
wait_then_signal "grep -q prefill '$case/../A39.err'" TERM; rc=$?
finish_case A39 "llm long prefill with --stats-json, SIGTERM mid-prefill" 15 "$rc" "$before"
new_case A41; head -c 262144 "$work/I4a/dir/p.txt" >"$case/p.txt"; run_case A41 "llm -f 256 KiB of base64 (~250k tokens), --prefill-chunk 65536" 0 -- "$llm" -f "$case/p.txt" -n 1 --prefill-chunk 65536
new_case A40; run_case A40 "llm --seed 007 (leading zeros)" 0 -- "$llm" -p hi -n 2 --seed 007

echo "| case | input | exit | first line of stderr (error or warning) | left behind |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "llm_audit: $n cases; $crashes crashed; $lost lost or changed files; $traces showed backtraces"
[ $crashes -eq 0 ] && [ $lost -eq 0 ] && [ $traces -eq 0 ]
