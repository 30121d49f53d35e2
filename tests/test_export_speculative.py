"""Exported graphs in the speculative loop: greedy output equals target-only greedy through the same
target artifact, for ONNX and ExecuTorch targets, in both drafting modes, with mixed formats."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import make_tiny_model

from omnidraft.errors import ContextOverflow
from omnidraft.export.pipeline import export_model
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.loader import load_model
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder

TOK = Path(__file__).resolve().parents[1] / "models" / "tokenizers"
PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:",
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé àccents: café, naïve, façade",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("spec")
    # Different vocabularies on purpose: phi-3 SentencePiece drafter, GPT-2 byte-level BPE target.
    drafter = make_tiny_model(root / "d", "llama", TOK / "phi3", seed=1, max_pos=256)
    target = make_tiny_model(root / "t", "qwen2", TOK / "gpt2", seed=2, layers=1, max_pos=256)
    return {
        "drafter-onnx-int4": export_model(drafter, "onnx", "int4", 96, root / "d-onnx", progress=False).out_dir,
        "target-onnx-int8": export_model(target, "onnx", "int8", 96, root / "t-onnx", progress=False).out_dir,
        "target-pte-8da8w": export_model(target, "executorch", "8da8w", 96, root / "t-pte", progress=False).out_dir,
    }


@pytest.mark.parametrize("target", ["target-onnx-int8", "target-pte-8da8w"])
def test_greedy_speculative_equals_target_only(exported, target):
    tgt, drf = load_model(exported[target]), load_model(exported["drafter-onnx-int4"])
    assert tgt.source in ("onnx", "executorch") and drf.source == "onnx"
    dm = SpeculativeDecoder(tgt, drf)
    cache = NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size)
    ng = SpeculativeDecoder(tgt, drf, cache)
    proposed = 0
    for k, prompt in enumerate(PROMPTS):
        ref = dm.generate(prompt, DecodeConfig(max_new_tokens=16, mode="target-only"))
        for dec, mode in ((dm, "dm"), (ng, "ngram")):
            out = dec.generate(prompt, DecodeConfig(max_new_tokens=16, mode=mode, draft_len=2 + k % 4))
            assert out.token_ids == ref.token_ids, (target, mode, prompt)
            assert out.text == ref.text
            proposed += out.stats.proposed
    assert proposed > 0


def test_prompt_that_overruns_the_exported_cache_is_refused_up_front(exported):
    tgt = load_model(exported["target-onnx-int8"])
    with pytest.raises(ContextOverflow, match="holds 96"):
        SpeculativeDecoder(tgt).generate("word " * 90, DecodeConfig(max_new_tokens=16, mode="target-only"))
