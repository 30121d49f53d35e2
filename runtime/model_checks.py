"""Checks of a Hugging Face model folder's own files before an engine loads them (no torch).

A truncated ``model.safetensors`` is refused from its header (the engines would raise their own
error types mid-load), the config is read bounded and typed, and the tokenizer must fit the model:
it may not hold more tokens than the model scores, and the model may be wider only by padding
(omnidraft.validate.check_vocab_fits).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from omnidraft.errors import ModelFolderError
from omnidraft.runtime.manifest import sha256_file
from omnidraft.validate import Fields, check_safetensors, check_vocab_fits, read_fields

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"


def read_config(folder: Path, name: str = CONFIG) -> Fields:
    return read_fields(
        folder / name, error=ModelFolderError, what="model config", fix="restore it from the model's source"
    )


def weight_files(folder: Path) -> list[Path]:
    """model.safetensors, or the shards its index names (each must exist)."""
    single = folder / "model.safetensors"
    if single.is_file() or not (folder / INDEX).is_file():
        return [single]
    fix = f"copy the complete model into {folder}"
    index = read_fields(folder / INDEX, error=ModelFolderError, what="weights index", fix=fix)
    shards = sorted({str(v) for v in index.dict("weight_map").values()})
    bad = [s for s in shards if Path(s).name != s]
    if bad or not shards:
        raise index.fail("weight_map", "shard file names inside the folder", bad[0] if bad else None)
    return [folder / s for s in shards]


def weights_digest(files: Sequence[Path]) -> str:
    """One id for a model's weights, recorded by exports as ``source_model_sha256`` and by heads and
    deltas as their drafter's identity: one file, its sha256; shards, a sha256 over each shard's
    name and sha256, in the order given (name order)."""
    if len(files) == 1:
        return sha256_file(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + sha256_file(f).encode())
    return h.hexdigest()


def weights_sha256(folder: Path) -> str:
    """``weights_digest`` of a Hugging Face model folder."""
    folder = Path(folder)
    files = weight_files(folder)
    if not files[0].is_file():
        raise ModelFolderError(f"{folder} has no model.safetensors; pass a complete model folder")
    return weights_digest(files)


def check_weights(folder: Path) -> None:
    for f in weight_files(folder):
        check_safetensors(f, error=ModelFolderError, fix=f"copy the model's weights into {folder} again")


def config_eos_ids(folder: Path) -> set[int]:
    """End-of-sequence ids from generation_config.json and config.json (an int or a list of ints)."""
    ids: set[int] = set()
    for name in ("generation_config.json", CONFIG):
        if not (folder / name).is_file():
            continue
        cfg = read_config(folder, name)
        v = cfg.obj.get("eos_token_id")
        if isinstance(v, list):
            ids.update(cfg.int_list("eos_token_id", lo=0))
        elif v is not None:
            ids.add(cfg.int("eos_token_id", lo=0))
    return ids


def check_model_files(folder: Path, tokenizer_size: int) -> int:
    """Weights complete and the tokenizer fitting the model; returns the model's vocabulary width."""
    check_weights(folder)
    config_eos_ids(folder)  # both configs read through the checks before the engine parses them
    width = read_config(folder).int("vocab_size", lo=1)
    check_vocab_fits(
        tokenizer_size=tokenizer_size, model_width=width, tokenizer=str(folder / "tokenizer.json"), model=str(folder)
    )
    return width
