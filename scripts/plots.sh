#!/usr/bin/env bash
# Draws the PNGs under bench/results/ from the committed CSVs (bench/plot_results.py): installs
# matplotlib from PyPI into .venv (git-ignored) the first time. Arguments go to the script,
# e.g. --tasks bench/results/tasks_smollm2.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import matplotlib" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check matplotlib
fi
.venv/bin/python bench/plot_results.py "$@"
