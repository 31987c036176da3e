#!/usr/bin/env bash
# Prepares .deps/ for a GPU machine that has nvcc, CMake and ninja but no Debian packages and no
# network (the device machine): downloads the -dev packages the build needs here and unpacks
# them with dpkg -x. bench/gpu_check.sh adds .deps/usr to the search paths. Name .deps in the
# device tool's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/debs
(cd .deps/debs && apt-get download doctest-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev libbenchmark1debian)
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps; done
rm -rf .deps/debs
du -sh .deps
