"""A merged delta re-lowered through `omnidraft export` (parity gate included) decodes the same
greedy tokens from .pte, .onnx and the eager merged drafter, and differs from the base drafter."""

from __future__ import annotations

import torch
from tiny_models import make_tiny_model

from omnidraft.adapt import delta
from omnidraft.adapt.trainer import wrap_lora
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.loader import load_model
from omnidraft.runtime.speculative import SpeculativeDecoder

PROMPTS = ["def add(a, b):", "The quick brown fox", "Question: 3 + 4 =", "import os\n"]


def _greedy(folder) -> list[list[int]]:
    dec = SpeculativeDecoder(load_model(folder))
    cfg = DecodeConfig(max_new_tokens=8, mode="target-only")
    return [dec.generate(p, cfg).token_ids for p in PROMPTS]


def test_merged_delta_reexported_decodes_identically(tmp_path, tokenizer_path):
    from transformers import AutoModelForCausalLM

    d = make_tiny_model(tmp_path / "d", "llama", tokenizer_path("llama-spm"), seed=4, layers=1, max_pos=128)
    t = make_tiny_model(tmp_path / "t", "qwen2", tokenizer_path("gpt-2"), seed=2, layers=1, max_pos=128)
    ident = delta.PairIdentity.of(d, t)
    model = wrap_lora(AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32), 4)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g))
    state = delta.pair_dir(tmp_path / "state", ident)
    merged = delta.write_merged(model, d, state / "drafter", ident)
    eager = _greedy(merged)
    assert eager != _greedy(d)  # the delta changes what the drafter writes
    for fmt in ("onnx", "executorch"):
        out = delta.export_merged(merged, fmt, state / f"drafter-{fmt}", max_seq_len=32)
        assert load_model(out).source == fmt
        assert _greedy(out) == eager, fmt
    assert not [p for p in state.iterdir() if p.name.startswith(".")]  # no temp folders left
