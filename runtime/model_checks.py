"""Checks of a Hugging Face model folder's own files before an engine loads them (no torch).

A truncated ``model.safetensors`` is refused from its header (the engines would raise their own
error types mid-load), the config is read bounded and typed, and the tokenizer must fit the model:
it may not hold more tokens than the model scores, and the model may be wider only by padding
(omnidraft.validate.check_vocab_fits).
"""

from __future__ import annotations

from pathlib import Path

from omnidraft.errors import ModelFolderError
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
