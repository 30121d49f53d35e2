"""OrtBackend follows the backend protocol exactly like eager PyTorch, and loads without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_models import make_tiny_model

from omnidraft.export.pipeline import export_model
from omnidraft.runtime.backends.base import Backend
from omnidraft.runtime.backends.ort import OrtBackend
from omnidraft.runtime.backends.torch_eager import TorchEagerBackend
from omnidraft.runtime.manifest import load_manifest

GPT2 = Path(__file__).resolve().parents[1] / "models" / "tokenizers" / "gpt2"


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"ort-{request.param}")
    hf = make_tiny_model(root / "hf", request.param, GPT2, seed=11, max_pos=128)
    export_model(hf, "onnx", "fp32", 48, root / "onnx", progress=False)
    return OrtBackend(root / "onnx", load_manifest(root / "onnx")), TorchEagerBackend(hf, 48)


def _script(backend, rng_seed: int) -> list[np.ndarray]:
    """A fixed random walk of forwards and rollbacks, as the speculative loop produces."""
    rng = np.random.default_rng(rng_seed)
    backend.reset()
    outs = [backend.forward(rng.integers(0, backend.vocab_size, 7).tolist(), 0)]
    while backend.cached_len < 40:
        k = int(rng.integers(1, 6))
        outs.append(backend.forward(rng.integers(0, backend.vocab_size, k).tolist(), backend.cached_len))
        backend.rollback(int(rng.integers(max(1, backend.cached_len - k), backend.cached_len + 1)))
    return outs


def test_forward_and_rollback_match_eager(pair):
    ort_b, eager = pair
    assert isinstance(ort_b, Backend) and ort_b.name == "ort"
    assert ort_b.vocab_size == eager.vocab_size and ort_b.max_seq_len == 48
    for seed in range(3):
        a, b = _script(ort_b, seed), _script(eager, seed)
        assert ort_b.cached_len == eager.cached_len
        for x, y in zip(a, b):
            assert x.dtype == np.float32 and x.shape == y.shape
            np.testing.assert_allclose(x, y, atol=1e-4, rtol=0)


def test_reset_and_protocol_errors(pair):
    ort_b, _ = pair
    ort_b.reset()
    first = ort_b.forward([1, 2, 3], 0)
    ort_b.forward([4], 3)
    ort_b.reset()
    assert ort_b.cached_len == 0
    np.testing.assert_array_equal(ort_b.forward([1, 2, 3], 0), first)
    with pytest.raises(ValueError, match="position 5"):
        ort_b.forward([1], 5)
    with pytest.raises(ValueError, match="rollback"):
        ort_b.rollback(4)
    with pytest.raises(ValueError, match="exceed"):
        ort_b.forward(list(range(46)), 3)


def test_ort_path_never_imports_torch(pair, tmp_path):
    ort_b, _ = pair
    folder = ort_b.export_dir
    code = f"""
import sys
from omnidraft.runtime.manifest import load_manifest
from omnidraft.runtime.backends.ort import OrtBackend
from omnidraft.runtime.loader import load_model
d = {str(folder)!r}
b = OrtBackend(d, load_manifest(d))
assert b.forward([1, 2, 3], 0).shape == (3, b.vocab_size)
lm = load_model(d)
assert lm.source == "onnx" and lm.backend.forward([5], 0).shape == (1, b.vocab_size)
bad = [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "executorch", "torchao")
       or m.startswith("omnidraft.export")]
assert not bad, bad
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
