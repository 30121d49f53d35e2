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


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory, tokenizer_path) -> tuple[Path, Path]:
    """(model folder, its fp32 ONNX export): a tiny random Llama over the llama-spm vocabulary."""
    from tiny_models import make_tiny_model

    from omnidraft.export.pipeline import export_model

    root = tmp_path_factory.mktemp("tiny-export")
    model = make_tiny_model(root / "m", "llama", tokenizer_path("llama-spm"), seed=3, max_pos=128)
    return model, export_model(model, "onnx", "fp32", 64, root / "export", progress=False, onnx_path="torch").out_dir


@pytest.fixture(scope="session")
def make_tiny_pair(tmp_path_factory, tokenizer_path) -> Callable[[int], tuple[Path, Path]]:
    """Target context length -> (drafter, target): tiny random models over real vocabularies that
    differ (Llama/llama-spm drafter, Qwen2/gpt-2 target), built once per length and shared by the
    tests that only read them."""
    from tiny_models import make_tiny_model

    built: dict[int, tuple[Path, Path]] = {}

    def make(target_max_pos: int = 512) -> tuple[Path, Path]:
        if target_max_pos not in built:
            root = tmp_path_factory.mktemp(f"tiny-pair-{target_max_pos}")
            d = make_tiny_model(root / "drafter", "llama", tokenizer_path("llama-spm"), seed=1)
            t = make_tiny_model(root / "target", "qwen2", tokenizer_path("gpt-2"), seed=2, max_pos=target_max_pos)
            built[target_max_pos] = (d, t)
        return built[target_max_pos]

    return make


@pytest.fixture(scope="session")
def tiny_pair(make_tiny_pair) -> tuple[Path, Path]:
    """(drafter, target) tiny random models over real vocabularies, the target holding 128 positions."""
    return make_tiny_pair(128)
