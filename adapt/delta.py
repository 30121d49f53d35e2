"""Adapter deltas and merged drafters on disk, per target, written atomically.

Layout of a state folder (one base drafter, many targets)::

    <state>/<target-id>/adapter/            adapter_config.json + adapter_model.safetensors (PEFT layout)
    <state>/<target-id>/drafter/            the drafter with W + s*BA folded in (HF folder)
    <state>/<target-id>/drafter-<format>/   the merged drafter re-lowered by `omnidraft export`
    <state>/<target-id>/ngram_cache.json    the pair's n-gram cache
    <state>/<target-id>/answer_memory.json  the target's answers so far (runtime/answer_memory.py)

The safetensors header records who the delta belongs to (drafter and target tokenizer sha256 and
base-weights sha256); loading it for any other pair is refused. Folders are replaced by writing a
temp folder next to them and swapping it in (omnidraft.atomic.Staging): the previous folder is
deleted only after the new one is in place, and a kill at any step leaves a complete folder.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from omnidraft import atomic
from omnidraft.errors import AdapterError, ExportError, ManifestError, ModelFolderError
from omnidraft.runtime.manifest import sha256_file
from omnidraft.runtime.model_checks import weights_sha256
from omnidraft.validate import read_fields

FORMAT = "omnidraft.adapter"
VERSION = "1"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
SIDECAR = "omnidraft-adapt.json"
# token_counts.json ranks the drafter's tokens for `export --draft-vocab`; an adapted drafter keeps the base's.
SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "token_counts.json",
)


# -- identity --------------------------------------------------------------------------------
def model_identity(folder: str | Path) -> tuple[str, str]:
    """(tokenizer sha256, base-weights sha256) of an HF folder or of an export folder (whose
    manifest names the HF weights it was lowered from, so both give the same identity)."""
    folder = Path(folder)
    manifest = folder / "manifest.json"
    if manifest.is_file():
        fix = "re-export the model with `omnidraft export`"
        m = read_fields(manifest, error=ManifestError, what="manifest", fix=fix)
        return m.sha256("tokenizer_sha256"), m.sha256("source_model_sha256")
    tok = folder / "tokenizer.json"
    if not tok.is_file():
        raise ModelFolderError(f"{folder} has no tokenizer.json; pass a model folder with its tokenizer")
    return sha256_file(tok), weights_sha256(folder)


@dataclass(frozen=True)
class PairIdentity:
    drafter_tokenizer: str
    drafter_weights: str
    target_tokenizer: str
    target_weights: str

    @classmethod
    def of(cls, drafter: str | Path, target: str | Path) -> PairIdentity:
        return cls(*model_identity(drafter), *model_identity(target))

    @property
    def target_id(self) -> str:
        return hashlib.sha256(f"{self.target_tokenizer}:{self.target_weights}".encode()).hexdigest()[:16]

    def metadata(self) -> dict[str, str]:
        return {"format": FORMAT, "version": VERSION, **asdict(self)}


def pair_dir(state: str | Path, ident: PairIdentity) -> Path:
    return Path(state) / ident.target_id


# -- atomic folders --------------------------------------------------------------------------
def recover_dir(final: Path) -> None:
    """Undo a crash between the two renames of a fallback swap; drop abandoned temp folders."""
    atomic.recover_dir(Path(final))


# -- LoRA deltas -----------------------------------------------------------------------------
def save_adapter(
    peft_model: torch.nn.Module, folder: str | Path, ident: PairIdentity, info: dict | None = None
) -> Path:
    """Write the LoRA weights in PEFT layout with the pair's identity in the safetensors header."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    final = Path(folder)
    with atomic.Staging(final) as tmp:
        # Only the LoRA factors: with lm_head among the targets PEFT would also store the whole base head.
        state = {
            k: v.detach().contiguous().cpu()
            for k, v in get_peft_model_state_dict(peft_model, save_embedding_layers=False).items()
        }
        meta = ident.metadata()
        meta["info"] = json.dumps(info or {}, sort_keys=True)
        save_file(state, str(tmp.path / ADAPTER_WEIGHTS), metadata=meta)
        peft_model.peft_config["default"].save_pretrained(str(tmp.path))
        tmp.publish()
    return final


def read_adapter(folder: str | Path, ident: PairIdentity) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors and header of a saved delta; refuses a delta of another drafter or target."""
    from safetensors import safe_open

    folder = Path(folder)
    recover_dir(folder)
    path = folder / ADAPTER_WEIGHTS
    if not path.is_file() or not (folder / ADAPTER_CONFIG).is_file():
        raise AdapterError(
            f"{folder} is not an adapter folder ({ADAPTER_WEIGHTS} + {ADAPTER_CONFIG}); "
            "delete it to start a fresh adapter"
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for damaged files
        raise AdapterError(f"adapter {path} is damaged ({exc}); delete {folder} to start a fresh adapter") from None
    if meta.get("format") != FORMAT:
        raise AdapterError(
            f"{path} was not written by omnidraft adapt (no pair identity in its header); "
            "delete it or pass a folder from `omnidraft adapt`"
        )
    for who, keys in (
        ("drafter", ("drafter_tokenizer", "drafter_weights")),
        ("target", ("target_tokenizer", "target_weights")),
    ):
        if any(meta.get(k) != getattr(ident, k) for k in keys):
            raise AdapterError(
                f"adapter {folder} was trained for another {who} (tokenizer or weights differ); "
                f"use the adapter of this {who}, or delete {folder} to adapt from scratch"
            )
    return tensors, meta


def load_adapter(peft_model: torch.nn.Module, folder: str | Path, ident: PairIdentity) -> dict:
    """Load a saved delta into ``peft_model`` (same rank and target modules required)."""
    from peft import set_peft_model_state_dict

    tensors, meta = read_adapter(folder, ident)
    own = {k: v for k, v in peft_model.named_parameters() if "lora_" in k}
    try:
        result = set_peft_model_state_dict(peft_model, tensors)
    except RuntimeError as exc:  # shape mismatch: another rank
        raise AdapterError(
            f"adapter {folder} does not fit this LoRA layout ({str(exc).splitlines()[0][:160]}); "
            "pass the --lora-rank it was trained with or delete it"
        ) from None
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected or len(tensors) != len(own):
        raise AdapterError(
            f"adapter {folder} has {len(tensors)} tensors but this LoRA layout has {len(own)}; "
            "pass the --lora-rank/targets it was trained with or delete it"
        )
    return meta


# -- merge back ------------------------------------------------------------------------------
def merged_model(model: torch.nn.Module) -> torch.nn.Module:
    """A plain HF model with W + s*BA folded in (``model`` itself is left untouched)."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        merged = copy.deepcopy(model).merge_and_unload()
        _retie_unchanged_head(merged)
        return merged
    return model


def _retie_unchanged_head(model: torch.nn.Module) -> None:
    """wrap_lora unties lm_head so a merge cannot move the embeddings. Where the merged head still
    equals the embeddings (a frozen drafter, a zero delta), tie them again: the folder keeps the base
    layout and weights digest, and the export stays as small as the base one."""
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or emb is None or head.weight is emb.weight or head.weight.shape != emb.weight.shape:
        return
    if torch.equal(head.weight, emb.weight):
        head.weight = emb.weight
        model.config.tie_word_embeddings = True


def write_merged(
    model: torch.nn.Module,
    base_folder: str | Path,
    folder: str | Path,
    ident: PairIdentity,
    info: dict | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Save the merged drafter as an HF folder (tokenizer files copied from the base drafter);
    ``extra(staging)`` adds files that must be published with it (its acceptance head)."""
    final = Path(folder)
    with atomic.Staging(final) as tmp:
        merged_model(model).save_pretrained(str(tmp.path), safe_serialization=True)
        for name in SIDE_FILES:
            if (Path(base_folder) / name).is_file():
                shutil.copyfile(Path(base_folder) / name, tmp.path / name)
        sidecar = json.dumps({"base": ident.metadata(), "info": info or {}}, indent=1, sort_keys=True)
        (tmp.path / SIDECAR).write_text(sidecar)
        if extra is not None:
            extra(tmp.path)
        tmp.publish()
    return final


def export_merged(merged: str | Path, fmt: str, folder: str | Path, max_seq_len: int, quant: str = "fp32") -> Path:
    """Re-lower the merged drafter with the export pipeline (parity gate included) and swap the
    export folder in only when the gate passed."""
    try:
        from omnidraft.export.pipeline import export_model
    except ImportError as exc:
        raise ExportError(
            f"the export pipeline is not available ({exc}); install omnidraft with its export extras"
        ) from None
    final = Path(folder)
    recover_dir(final)
    export_model(merged, fmt, quant, max_seq_len, final, progress=False)  # it swaps the folder in itself
    return final
