"""Shared pytest fixtures."""

from __future__ import annotations

import os

# Tests run tiny models: one intra-op thread avoids thread-pool spinning that makes them 5-10x slower
# on a 2-core machine (measured: 3.86 s -> 0.46 s for a 32-token tiny-model decode under load).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Callable
from pathlib import Path

import pytest

from omnidraft.models import gguf_tokenizers


@pytest.fixture(scope="session")
def real_tokenizer_dirs() -> dict[str, Path]:
    """name -> folder with tokenizer.json for every llama.cpp vocabulary we convert.

    Converted once into the cache ($OMNIDRAFT_CACHE or ~/.cache/omnidraft) and reused by later
    sessions; the first run downloads the llama-cpp-python sdist (~76 MB, needs PyPI) and converts
    all five (about a minute on two cores).
    """
    return {name: gguf_tokenizers.get_tokenizer_dir(name) for name in gguf_tokenizers.VOCABS}


@pytest.fixture(scope="session")
def tokenizer_path() -> Callable[[str], Path]:
    """Function name -> folder with tokenizer.json, converting only the vocabulary asked for
    (cheaper than real_tokenizer_dirs when a test needs just llama-spm or gpt-2)."""
    return gguf_tokenizers.get_tokenizer_dir
