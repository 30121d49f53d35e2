"""Row splits: where a kernel rounds a row otherwise once the call's total length passes some size
(onnxruntime's attention GEMM with heads wider than 128), the export gate finds the size and the
runtime cuts calls there, so every row keeps the bits its one-token decode gives it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from omnidraft.errors import ExportError
from omnidraft.export import parity
from omnidraft.runtime.backends.ort import OrtBackend
from omnidraft.runtime.manifest import load_manifest

SCHED = parity.Schedule(prefill=8, tokens_a=list(range(3, 40)), tokens_b=list(range(3, 40)))


class _LengthBoundary:
    """Rows depend on (token, position) only, except that a call whose total length (with the copy of
    a padded one-token call) passes ``boundary`` adds 0.5 to every row. Honours ``splits`` as the ORT
    backend does: a call is cut at each split it spans."""

    def __init__(self, boundary: int, padded: bool, splits: list[int] | None = None, vocab: int = 7) -> None:
        self.boundary, self.splits, self.vocab = boundary, splits or [], vocab
        self.manifest = SimpleNamespace(pad_single_row=padded)

    def reset(self) -> None:
        pass

    def rollback(self, length: int) -> None:
        pass

    def _call(self, ids, pos):
        total = pos + len(ids) + (1 if self.manifest.pad_single_row and len(ids) == 1 else 0)
        rows = np.stack([np.cos(np.arange(self.vocab) * (t + 1) + pos + i) for i, t in enumerate(ids)])
        return (rows + (0.5 if total > self.boundary else 0.0)).astype(np.float32)

    def forward(self, ids, pos):
        cuts = [c for c in self.splits if pos < c < pos + len(ids)]
        bounds = [pos, *cuts, pos + len(ids)]
        return np.concatenate([self._call(ids[a - pos : b - pos], a) for a, b in zip(bounds, bounds[1:])])


@pytest.mark.parametrize("padded,split", [(True, 63), (False, 64)])
def test_the_scan_finds_where_the_kernels_switch(padded, split):
    assert parity.find_row_splits(_LengthBoundary(64, padded), SCHED, 128) == [split]
    assert parity.find_row_splits(_LengthBoundary(1000, padded), SCHED, 128) == []


def test_the_gate_measures_across_the_splits_and_refuses_a_graph_that_ignores_them():
    # The fixed verify windows end before position 64: without the scan the drift goes unseen.
    assert parity.gate_batch_invariance(_LengthBoundary(64, True), SCHED, 128, "g")["row_stable"]
    fig = parity.gate_batch_invariance(
        _LengthBoundary(64, True), SCHED, 128, "g", reopen=lambda s: _LengthBoundary(64, True, s)
    )
    assert fig["row_splits"] == [63] and fig["verify_vs_decode_max_abs_diff"] == 0.0
    with pytest.raises(ExportError, match="verified in a k-token call"):
        parity.gate_batch_invariance(
            _LengthBoundary(64, True), SCHED, 128, "the int8 graph", reopen=lambda s: _LengthBoundary(64, True)
        )


class _CountingSession:
    def __init__(self, session) -> None:
        self.session, self.calls = session, []

    def run(self, names, feed):
        self.calls.append(feed["input_ids"].shape[1])
        return self.session.run(names, feed)


@pytest.mark.parametrize("padded", [False, True])
def test_the_ort_backend_cuts_calls_at_its_splits(tiny_export, padded):
    _, export = tiny_export
    m = replace(load_manifest(export), pad_single_row=padded)
    plain = OrtBackend(export, m)
    split = OrtBackend(export, replace(m, row_splits=[5, 9]))
    split.session = counting = _CountingSession(split.session)
    ids = [int(i) for i in np.random.default_rng(0).integers(3, 1000, size=14)]
    want = plain.forward(ids[:12], 0)
    got = split.forward(ids[:12], 0)
    assert counting.calls == [5, 4, 3] and split.cached_len == 12
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    counting.calls.clear()
    split.rollback(4)
    rows = split.forward(ids[4:6], 4)  # one row each side of 5: two one-token calls
    assert counting.calls == ([2, 2] if padded else [1, 1]) and rows.shape[0] == 2 and split.cached_len == 6
    assert np.allclose(rows, want[4:6], rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert split.forward(ids[6:9], 6).shape[0] == 3 and counting.calls[-1] == 3  # within a segment: one call


def _window(backend, ids, start, k):
    backend.reset()
    backend.forward(ids[:start], 0)
    together = backend.forward(ids[start : start + k], start)
    backend.rollback(start)
    return together, np.stack([backend.forward([t], start + i)[0] for i, t in enumerate(ids[start : start + k])])


def _has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_heads_wider_than_128_are_exact_with_the_split_at_63(tmp_path):
    """Gemma 3's 256-wide heads through onnxruntime-genai's GroupQueryAttention: on AVX-512 CPUs a
    verify call that ends past position 64 rounds its rows otherwise than their decode steps (MLAS
    takes the 256-wide dot products in two passes once the keys number more than 64; seen on an
    AVX-512 Xeon and on Zen 4, not on AVX2-only Zen 3, where every length rounds alike). With the
    split at 63 every row is bit-identical on either; the gate finds the split by itself wherever
    the difference reaches the logits (Gemma 3 270M int8), which in fp32 it does not."""
    from tiny_models import make_tiny_model

    from omnidraft.export.pipeline import export_model

    tok = Path(__file__).resolve().parents[1] / "models" / "tokenizers" / "gpt2"
    t = make_tiny_model(tmp_path / "t", "gemma3", tok, seed=3, layers=1, hidden=64, max_pos=160, head_dim=256)
    res = export_model(t, "onnx", "fp32", 128, tmp_path / "e", progress=False, onnx_path="genai")
    m = res.manifest
    assert m.pad_single_row and m.row_splits == m.parity["batch_invariance"]["row_splits"]
    ids = [int(i) for i in np.random.default_rng(2).integers(3, 50000, size=80)]
    together, alone = _window(OrtBackend(res.out_dir, replace(m, row_splits=[])), ids, 58, 9)
    if _has_avx512():
        assert not np.array_equal(together, alone), "the kernel boundary this split exists for is gone"
    together, alone = _window(OrtBackend(res.out_dir, replace(m, row_splits=[63])), ids, 58, 9)
    assert np.array_equal(together, alone)
