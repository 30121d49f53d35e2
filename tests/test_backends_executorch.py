"""ExecuTorchBackend follows the backend protocol like eager PyTorch: prefill, decode, k-token
verify, rollback by re-using positions, reset; a tiny fp32 Qwen2 exported along both lowering
paths (ExecuTorch's LLM path and the transformers static-cache path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_models import make_tiny_model

from omnidraft.export.pipeline import export_model
from omnidraft.runtime.backends.base import Backend
from omnidraft.runtime.backends.executorch import ExecuTorchBackend
from omnidraft.runtime.backends.torch_eager import TorchEagerBackend
from omnidraft.runtime.loader import load_model
from omnidraft.runtime.manifest import load_manifest

GPT2 = Path(__file__).resolve().parents[1] / "models" / "tokenizers" / "gpt2"


@pytest.fixture(scope="module", params=["llm", "static"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"et-{request.param}")
    hf = make_tiny_model(root / "hf", "qwen2", GPT2, seed=13, layers=1, max_pos=128)
    res = export_model(hf, "executorch", "fp32", 40, root / "pte", et_path=request.param, progress=False)
    assert res.manifest.parity["max_abs_diff"] <= 1e-4
    assert res.manifest.inputs[1] == {"llm": "input_pos", "static": "cache_position"}[request.param]
    return ExecuTorchBackend(root / "pte", load_manifest(root / "pte")), TorchEagerBackend(hf, 40)


def _script(backend, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    backend.reset()
    outs = [backend.forward(rng.integers(0, backend.vocab_size, 6).tolist(), 0)]
    while backend.cached_len < 32:
        k = int(rng.integers(1, 7))
        outs.append(backend.forward(rng.integers(0, backend.vocab_size, k).tolist(), backend.cached_len))
        backend.rollback(int(rng.integers(max(1, backend.cached_len - k), backend.cached_len + 1)))
    return outs


def test_forward_and_rollback_match_eager(pair):
    et, eager = pair
    assert isinstance(et, Backend) and et.name == "executorch" and et.max_seq_len == 40
    for seed in range(3):
        a, b = _script(et, seed), _script(eager, seed)
        assert et.cached_len == eager.cached_len
        for x, y in zip(a, b):
            assert x.dtype == np.float32 and x.shape == y.shape
            np.testing.assert_allclose(x, y, atol=1e-4, rtol=0)


def test_outputs_are_not_overwritten_by_the_next_call(pair):
    et, _ = pair
    et.reset()
    first = et.forward([1, 2, 3], 0)
    keep = first.copy()
    et.forward([9, 8, 7, 6], 3)
    np.testing.assert_array_equal(first, keep)


def test_reset_fill_to_capacity_and_errors(pair):
    et, _ = pair
    et.reset()
    first = et.forward([4, 5], 0)
    et.forward(list(range(38)), 2)  # exactly fills the 40-row cache
    et.reset()
    np.testing.assert_array_equal(et.forward([4, 5], 0), first)
    with pytest.raises(ValueError, match="exceed"):
        et.forward(list(range(39)), 2)
    with pytest.raises(ValueError, match="position 0"):
        et.forward([1], 0)  # the cache holds 2


def test_loader_builds_it_from_the_manifest(pair):
    et, _ = pair
    lm = load_model(et.export_dir)
    assert lm.source == "executorch" and isinstance(lm.backend, ExecuTorchBackend)
    assert lm.backend.forward([1, 2], 0).shape == (2, et.vocab_size)


def test_loading_and_the_first_forward_print_no_cpuinfo_probe(pair):
    """ExecuTorch's threadpool prints its CPU probe to fd 2 on first use, once per process: a fresh
    process loads the program and runs it, and its stderr keeps everything but those lines."""
    et, _ = pair
    code = (
        "import sys; from omnidraft.runtime.loader import load_model; "
        "load_model(sys.argv[1]).backend.forward([1, 2, 3], 0); print('done', file=sys.stderr)"
    )
    r = subprocess.run([sys.executable, "-c", code, str(et.export_dir)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stderr.endswith("done\n"), r.stderr
    assert "cpuinfo_utils" not in r.stderr, r.stderr
