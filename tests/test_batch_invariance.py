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
    return make_tiny_model(
        tmp_path_factory.mktemp("inv") / "t", "qwen2", TOK / "gpt2", seed=5, layers=1, hidden=64, max_pos=128
    )


@pytest.mark.parametrize("fmt,quant", CASES)
def test_rows_do_not_depend_on_the_rest_of_the_call(target, tmp_path, fmt, quant):
    res = export_model(target, fmt, quant, 64, tmp_path / "x", progress=False)
    inv = res.manifest.parity["batch_invariance"]  # every export measures it; ONNX ones are gated on it
    assert inv["verify_vs_decode_rows"] >= 40 and inv["row_stable"] is True, inv
    be = load_model(res.out_dir).backend
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 50000, size=12)]
    be.reset()
    be.forward(ids[:6], 0)
    together = be.forward(ids[6:], 6)  # one 6-token verify call
    be.rollback(6)
    alone = np.stack([be.forward([t], 6 + i)[0] for i, t in enumerate(ids[6:])])  # six 1-token calls
    scale = np.abs(alone).max()
    assert np.abs(together - alone).max() <= 1e-4 * max(scale, 1.0), (fmt, quant)


@pytest.mark.parametrize("fmt,quant,et_path", [("onnx", "int8", "auto"), ("executorch", "8da4w", "static")])
def test_verify_rows_are_bit_identical_to_decode_steps(target, tmp_path, fmt, quant, et_path):
    """Row-stable attention (export/row_stable_attention.py) keeps every attention product on one
    kernel, so activation-rounding kernels (ORT int8 MatMulNBits, XNNPACK 8da4w) give the same bits,
    not just close ones: a rounding-grid jump anywhere would flip near-tied greedy choices on a
    trained target. ExecuTorch's LLM path (custom sdpa) is not row-stable; its static path is."""
    res = export_model(target, fmt, quant, 64, tmp_path / "x", et_path=et_path, progress=False)
    assert res.manifest.parity["batch_invariance"]["verify_vs_decode_max_abs_diff"] == 0.0
    be = load_model(res.out_dir).backend
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 50000, size=40)]
    for start, m in ((1, 2), (5, 7), (20, 3), (30, 9)):
        be.reset()
        be.forward(ids[:start], 0)
        together = be.forward(ids[start : start + m], start)
        be.rollback(start)
        alone = np.stack([be.forward([t], start + i)[0] for i, t in enumerate(ids[start : start + m])])
        assert np.array_equal(together, alone), (start, m)


class _ShiftedVerify:
    """A backend whose multi-token calls drift from its 1-token calls, as a graph without row-stable
    attention does behind int8 activation rounding on AVX-512 VNNI CPUs."""

    def __init__(self, vocab: int = 11, shift: float = 0.03) -> None:
        self.vocab, self.shift = vocab, shift

    def reset(self) -> None:
        pass

    def rollback(self, length: int) -> None:
        pass

    def forward(self, ids, pos):
        rows = np.stack([np.sin(np.arange(self.vocab) * (t + 1) + pos + i) for i, t in enumerate(ids)]).astype(
            np.float32
        )
        return rows + (self.shift if len(ids) > 1 else 0.0)


def test_the_gate_refuses_a_graph_whose_verify_rows_drift():
    from omnidraft.errors import ExportError
    from omnidraft.export import parity

    sched = parity.Schedule(prefill=8, tokens_a=list(range(13)), tokens_b=list(range(13)))
    assert parity.gate_batch_invariance(_ShiftedVerify(shift=0.0), sched, 64, "g")["verify_vs_decode_max_abs_diff"] == 0
    with pytest.raises(ExportError, match="verified in a k-token call than for the same token decoded alone"):
        parity.gate_batch_invariance(_ShiftedVerify(), sched, 64, "the int8 ONNX graph")


def test_a_pair_with_a_target_that_is_not_row_stable_says_so(monkeypatch, capsys, tmp_path):
    from types import SimpleNamespace

    from omnidraft.runtime import session

    class Stop(Exception):
        pass

    def fake_load(path, **kw):
        if path == tmp_path / "drafter":
            return SimpleNamespace(
                source="onnx", codec=SimpleNamespace(sha256="d"), backend=SimpleNamespace(vocab_size=8)
            )
        return SimpleNamespace(info={"quant": "8da4w", "row_stable": False}, codec=SimpleNamespace(sha256="t"))

    def stop(*args, **kw):
        raise Stop

    monkeypatch.setattr(session, "load_model", fake_load)
    monkeypatch.setattr(session, "NgramCache", stop)  # the note comes before the pair's cache is made
    with pytest.raises(Stop):
        session.open_pair(tmp_path / "target", tmp_path / "drafter")
    err = capsys.readouterr().err
    assert "is not row-stable" in err and "--format onnx" in err and "--et-path static" in err


@pytest.mark.parametrize("q_len", [1, 3])
def test_row_stable_attention_without_a_mask_is_bottom_right_causal(q_len):
    """The padded call has two rows, so the no-mask case must state the causal mask itself: a decode
    step sees every key, row i of a k-token call sees keys up to kv_len - q_len + i."""
    import torch

    from omnidraft.export.row_stable_attention import _attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (q_len, 5, 5))
    module = torch.nn.Module()
    module.is_causal = True
    got, _ = _attention(module, q, k, v, None, scaling=8**-0.5)
    allowed = torch.arange(5)[None, :] <= torch.arange(q_len)[:, None] + (5 - q_len)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed).transpose(1, 2)
    assert got.shape == (1, q_len, 2, 8)
    torch.testing.assert_close(got, want)
