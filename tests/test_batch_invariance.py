"""Exactness of speculative greedy decoding needs batch-invariant graphs: the logits a target gives a
position must not depend on how many other tokens share the call (verify k tokens vs decode one).
Dynamic per-tensor activation quantization breaks this (one scale for all k rows), which shows up as
greedy output differing from target-only on trained models with near-tied logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_models import make_tiny_model

from omnidraft.export.pipeline import export_model
from omnidraft.runtime.loader import load_model

TOK = Path(__file__).resolve().parents[1] / "models" / "tokenizers"
CASES = [("onnx", "fp32"), ("onnx", "int8"), ("onnx", "int4"), ("executorch", "8da4w")]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("inv") / "t", "qwen2", TOK / "gpt2", seed=5, layers=1,
                           hidden=64, max_pos=128)


@pytest.mark.parametrize("fmt,quant", CASES)
def test_rows_do_not_depend_on_the_rest_of_the_call(target, tmp_path, fmt, quant):
    be = load_model(export_model(target, fmt, quant, 64, tmp_path / "x", progress=False).out_dir).backend
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 50000, size=12)]
    be.reset()
    be.forward(ids[:6], 0)
    together = be.forward(ids[6:], 6)  # one 6-token verify call
    be.rollback(6)
    alone = np.stack([be.forward([t], 6 + i)[0] for i, t in enumerate(ids[6:])])  # six 1-token calls
    scale = np.abs(alone).max()
    assert np.abs(together - alone).max() <= 1e-4 * max(scale, 1.0), (fmt, quant)
