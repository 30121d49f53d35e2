"""Tiny random-weight Hugging Face folders with real vocabularies, and a scripted drafter backend."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def make_tiny_model(
    folder: Path, arch: str, tokenizer_dir: Path, seed: int = 0, hidden: int = 32, layers: int = 2, max_pos: int = 512
) -> Path:
    """Save a random-weight model whose vocabulary matches ``tokenizer_dir`` (cached if present)."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from omnidraft.runtime.tokenizer import load_codec

    codec = load_codec(tokenizer_dir)
    eos = sorted(codec.eos_ids)[0] if codec.eos_ids else 0
    common = dict(
        vocab_size=codec.vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_pos,
        eos_token_id=eos,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    with torch.no_grad():  # sharpen the random logits so greedy runs are not dominated by ties
        model.get_input_embeddings().weight.mul_(8.0)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.copy(Path(tokenizer_dir) / "tokenizer.json", tmp / "tokenizer.json")
    tmp.rename(folder)
    return folder


class ScriptedDrafter:
    """A drafter backend that knows the text the target will write and proposes its drafter tokens.

    Row r of a forward at ``start`` predicts ``script[start + r + 1]``: a perfect drafter while the
    drafter context follows the script, an imperfect one where re-tokenization differs.
    """

    name = "scripted"

    def __init__(self, script_ids: list[int], vocab_size: int, max_seq_len: int = 4096) -> None:
        self.script = script_ids
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self._len = 0

    @property
    def cached_len(self) -> int:
        return self._len

    def forward(self, token_ids, start_pos):
        rows = np.full((len(token_ids), self.vocab_size), -10.0, dtype=np.float32)
        for r in range(len(token_ids)):
            nxt = start_pos + r + 1
            if nxt < len(self.script):
                rows[r, self.script[nxt]] = 10.0
        self._len = start_pos + len(token_ids)
        return rows

    def rollback(self, length):
        self._len = length

    def reset(self):
        self._len = 0
