#!/usr/bin/env bash
# The test command (README and CI): install what is missing, lint, run the Python tests, then the Java core.
set -uo pipefail
cd "$(dirname "$0")/.."
OMNIDRAFT_SKIP_MODELS=1 bash scripts/setup.sh || { echo "setup failed" >&2; exit 1; }
.venv/bin/ruff check . && .venv/bin/ruff format --check . || { echo "ruff: run .venv/bin/ruff check --fix . && .venv/bin/ruff format ." >&2; exit 1; }
# Two workers, one per core of the machines CI runs on: each test runs its tiny models on one thread
# (tests/conftest.py), so one worker leaves a core idle. --dist loadfile keeps a file's tests (and
# its module fixtures, some of which export models for a minute) in one worker.
# --durations: the CI log says where the time goes (the run must stay well under 30 minutes)
.venv/bin/python -m pytest -p no:cacheprovider -n 2 --dist loadfile --durations=25 tests  # -q comes from pyproject; -qq would hide the summary line
py=$?
bash android_demo/ci/test_core.sh
java=$?
[ $py -eq 0 ] && [ $java -eq 0 ]
