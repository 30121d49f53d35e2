"""Tiny random-weight Hugging Face folders with real vocabularies, and a scripted drafter backend."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}


def make_tiny_model(
    folder: Path,
    arch: str,
    tokenizer_dir: Path,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    max_pos: int = 512,
    pad_rows: int = 0,
    head_dim: int = 16,
) -> Path:
    """Save a random-weight model whose vocabulary matches ``tokenizer_dir`` (cached if present);
    ``pad_rows`` widens its embedding past the tokenizer, as real models pad it to a round size;
    ``head_dim`` applies to Gemma 3 (the others take hidden / heads)."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from omnidraft.runtime.tokenizer import load_codec

    codec = load_codec(tokenizer_dir)
    eos = sorted(codec.eos_ids)[0] if codec.eos_ids else 0
    common = dict(
        vocab_size=codec.vocab_size + pad_rows,
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
    elif arch == "gemma3":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        # Gemma 3's shape at toy size: one KV head, q/k norms, a sliding window far shorter than the
        # prompts (so windowed layers really drop keys), every sixth layer global.
        common.update(num_key_value_heads=1, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=8)
        common["layer_types"] = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        model = Gemma3ForCausalLM(Gemma3TextConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    with torch.no_grad():  # sharpen the random logits so greedy runs are not dominated by ties
        model.get_input_embeddings().weight.mul_(8.0)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.copy(Path(tokenizer_dir) / "tokenizer.json", tmp / "tokenizer.json")
    tmp.rename(folder)
    return folder


def make_tiny_bpe(folder: Path) -> Path:
    """A 400-token byte-level BPE tokenizer trained on a few lines, with Qwen's special tokens: a
    vocabulary small enough that a GGUF of it converts in seconds."""
    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        return folder
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"] * 4
    text += ["The quick brown fox jumps over the lazy dog. Question: what is 12 plus 30? Answer: 42."] * 4
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(text, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def write_gguf(model_dir: Path, path: Path) -> Path:
    """Write a tiny Qwen2 model folder (with a make_tiny_bpe tokenizer) as an F32 GGUF file: the
    tests' stand-in for a real downloaded GGUF."""
    import json

    import gguf
    from safetensors.numpy import load_file

    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {t["content"] for t in spec["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny qwen2")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, cfg["num_hidden_layers"])
    for name, tensor in load_file(str(model_dir / "model.safetensors")).items():
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), tensor.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


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
