"""Load a local Hugging Face model folder for export (safetensors only, no hub, no pickle)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnidraft.errors import ModelFolderError
from omnidraft.runtime.model_checks import check_model_files, read_config, weight_files, weights_digest
from omnidraft.runtime.tokenizer import load_codec

from .recipes import SUPPORTED_ARCHITECTURES

TOKENIZER_FILE = "tokenizer.json"
# Copied beside the artifact with the tokenizer so an export folder is self-contained.
SIDE_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "config.json",
    "chat_template.jinja",
)


@dataclass(frozen=True)
class ModelInfo:
    folder: Path
    architecture: str
    vocab_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    weight_files: tuple[Path, ...]


def weights_sha256(info: ModelInfo) -> str:
    """One digest over all weight files (in name order) so sharded models get a single id."""
    return weights_digest(info.weight_files)


def inspect_folder(folder: str | Path) -> ModelInfo:
    """Validate the folder layout and config without importing torch."""
    folder = Path(folder)
    if not folder.is_dir():
        state = "is not a folder" if folder.exists() else "does not exist"
        raise ModelFolderError(
            f"model folder {folder} {state}; pass a folder holding config.json, model.safetensors and tokenizer.json"
        )
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelFolderError(f"{folder} has no config.json; save the model with save_pretrained()")
    fields = read_config(folder)
    cfg: dict[str, Any] = fields.obj
    archs = fields.str_list("architectures", default=[])
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFolderError(
            f"architecture {arch!r} in {cfg_path} is not supported for export; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    weights = _weight_files(folder)
    if not (folder / TOKENIZER_FILE).is_file():
        raise ModelFolderError(
            f"{folder} has no {TOKENIZER_FILE}; save the model's fast tokenizer there "
            "(tokenizer.save_pretrained) so the export can carry it"
        )
    check_model_files(folder, load_codec(folder / TOKENIZER_FILE).vocab_size)  # truncated weights, a foreign tokenizer
    try:
        heads = int(cfg["num_attention_heads"])
        return ModelInfo(
            folder=folder,
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            max_position_embeddings=int(cfg["max_position_embeddings"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=cfg.get("eos_token_id"),
            weight_files=weights,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFolderError(f"{cfg_path} lacks or mangles a required field ({exc}); re-save the model") from exc


def _weight_files(folder: Path) -> tuple[Path, ...]:
    single = folder / "model.safetensors"
    if single.is_file():
        return (single,)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = weight_files(folder)
        missing = [s.name for s in shards if not s.is_file()]
        if missing:
            raise ModelFolderError(f"{folder} lacks weight shards {missing}; copy the complete model")
        return tuple(shards)
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ModelFolderError(
            f"{folder} holds pickle weights only; convert them to safetensors "
            "(save_pretrained(..., safe_serialization=True)) — pickle is never loaded"
        )
    raise ModelFolderError(f"{folder} has no model.safetensors; save the model with save_pretrained()")


def load_model(info: ModelInfo):
    """fp32 eager model in eval mode, from local safetensors only."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(info.folder), dtype=torch.float32, local_files_only=True, use_safetensors=True
        )
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
        msg = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise ModelFolderError(f"cannot load {info.folder}: {msg}; check config.json and the weights") from exc
    return model.eval()
