#!/usr/bin/env bash
# The virtual environment the openai client tests run in: PyPI's openai client and its
# dependencies at the versions in openai-requirements.txt, wheels only, into VENV_DIR. Idempotent
# (a stamp holding the requirements' hash marks a finished install; a virtual environment without
# it is replaced, anything else there is refused) and safe to run twice at once (a lock beside VENV_DIR): tools/test.sh starts it in the
# background beside the build, and the tests call it again, waiting for that one to finish.
# Exit 0: ready; 77: PyPI could not be reached or python3-venv is missing (the message says which);
# 1: pip failed otherwise (a pin no longer served, no wheel for this Python), which must be seen.
# Usage: openai_venv.sh VENV_DIR
set -euo pipefail
venv="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$here/openai-requirements.txt"
# VENV_DIR is removed and made again below: refuse a path that could reach beyond what this script
# made (a '..' component, a link, a folder that is not a virtual environment), and write its lock
# and log only where they are not links.
case "/$venv/" in */../*) echo "openai_venv.sh: '$venv' has a '..' component" >&2; exit 1 ;; esac
for p in "$venv" "$venv.lock" "$venv.pip.log"; do
  if [ -L "$p" ]; then echo "openai_venv.sh: $p is a symbolic link: not touched" >&2; exit 1; fi
done
if [ -e "$venv" ] && { [ ! -d "$venv" ] || [ ! -f "$venv/pyvenv.cfg" ]; }; then
  echo "openai_venv.sh: $venv is there and is not a virtual environment: not replaced" >&2
  exit 1
fi
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock -w 600 9 || { echo "openai_venv.sh: $venv.lock held for 10 minutes by another install"; exit 1; }
want="$(sha256sum <"$req" | cut -d' ' -f1)"
if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" = "$want" ] && "$venv/bin/python" -c 'import openai' 2>/dev/null; then
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv" >"$venv.pip.log" 2>&1 || { echo "SKIP: python3 -m venv failed (python3-venv missing?):"; tail -3 "$venv.pip.log"; rm -rf "$venv"; exit 77; }
# Bounded: 20 s per network operation, one retry, and the whole install within 240 s.
rc=0
timeout 240 "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input --only-binary :all: \
  --timeout 20 --retries 1 -r "$req" >>"$venv.pip.log" 2>&1 || rc=$?
if [ "$rc" != 0 ]; then
  # Out of reach (no network, no name resolution, a timeout): a skip. Anything else (a pin PyPI no
  # longer serves, no wheel for this Python, a full disk) is a failure that must be seen.
  if [ "$rc" = 124 ] || grep -qiE 'NewConnectionError|Temporary failure in name resolution|Name or service not known|Network is unreachable|ConnectTimeout|ReadTimeout|timed out|Max retries exceeded|Connection refused|ProxyError' "$venv.pip.log"; then
    echo "SKIP: PyPI could not be reached to install the openai client (tests/cli/openai-requirements.txt):"
    tail -3 "$venv.pip.log"
    rm -rf "$venv"
    exit 77
  fi
  echo "openai_venv.sh: pip could not install tests/cli/openai-requirements.txt (exit $rc):"
  tail -5 "$venv.pip.log" | cut -c1-400
  rm -rf "$venv"
  exit 1
fi
echo "$want" >"$venv/.requirements.sha256"
