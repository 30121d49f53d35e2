"""Gemma 3's architecture (sliding-window layers shorter than the prompts, one KV head, q/k norms) on a
tiny random config: every export path passes its gates, and greedy speculative output with a
foreign-vocabulary drafter equals target-only through the torch reference and each artifact."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import make_tiny_model

from omnidraft.export.pipeline import export_model
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.loader import load_model
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder

TOK = Path(__file__).resolve().parents[1] / "models" / "tokenizers"
PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number, counting from zero."""\n',
    "Question: Tom has 3 apples and buys 5 more. How many apples does he have now?\nAnswer:",
    "The quick brown fox jumps over the lazy dog, and the dog does not mind at all.",
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma3")
    drafter = make_tiny_model(root / "d", "llama", TOK / "phi3", seed=1, max_pos=256)
    target = make_tiny_model(root / "t", "gemma3", TOK / "gpt2", seed=2, layers=3, max_pos=256)
    return {"drafter": drafter, "target": target, "root": root}


@pytest.fixture(scope="module")
def exports(pair) -> dict[str, Path]:
    root, t = pair["root"], pair["target"]
    out = {
        "onnx-genai-int8": export_model(t, "onnx", "int8", 128, root / "genai", progress=False, min_top1=0.0),
        "onnx-torch-int8": export_model(
            t, "onnx", "int8", 128, root / "torch", progress=False, onnx_path="torch", min_top1=0.0
        ),
        "pte-static-fp32": export_model(t, "executorch", "fp32", 128, root / "pte", progress=False),
    }
    return {k: r.out_dir for k, r in out.items()}


def test_every_path_records_a_row_stable_gated_artifact(exports):
    from omnidraft.runtime.manifest import load_manifest

    for name, folder in exports.items():
        m = load_manifest(folder)
        assert m.architecture == "Gemma3ForCausalLM", name
        assert m.parity["batch_invariance"]["verify_vs_decode_max_abs_diff"] == 0.0, name
        if m.quant != "fp32":
            assert "quality" in m.parity and m.parity["quality"]["text_tokens"] > 0, name
    assert "static" in load_manifest(exports["pte-static-fp32"]).exporter


@pytest.mark.parametrize("target", ["torch", "onnx-genai-int8", "onnx-torch-int8", "pte-static-fp32"])
def test_greedy_speculative_equals_target_only(pair, exports, target):
    tgt = load_model(pair["target"] if target == "torch" else exports[target])
    drf = load_model(pair["drafter"])
    dm = SpeculativeDecoder(tgt, drf)
    ng = SpeculativeDecoder(tgt, drf, NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size))
    proposed = 0
    for k, prompt in enumerate(PROMPTS):
        ref = dm.generate(prompt, DecodeConfig(max_new_tokens=20, mode="target-only"))
        assert len(ref.token_ids) == 20
        for dec, mode in ((dm, "dm"), (ng, "ngram")):
            out = dec.generate(prompt, DecodeConfig(max_new_tokens=20, mode=mode, draft_len=2 + k))
            assert out.token_ids == ref.token_ids, (target, mode, prompt)
            proposed += out.stats.proposed
    assert proposed > 0


def test_torch_reference_rolls_back_past_the_sliding_window(pair):
    """A rollback after the window has filled must give the logits of a fresh pass."""
    import numpy as np

    tgt = load_model(pair["target"])
    ids = tgt.codec.encode(PROMPTS[0] + PROMPTS[2])[:30]  # far past the window of 8
    be = tgt.backend
    be.reset()
    full = be.forward(ids, 0)
    be.rollback(12)
    again = be.forward(ids[12:], 12)
    assert np.allclose(again, full[12:], atol=1e-4 * np.abs(full).max())
