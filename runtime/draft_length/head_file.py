"""The acceptance head's files and identity (adaptive drafting, paper §4, after SpecDec++). Pure
Python (json, hashlib, math) so the torch-free ONNX Runtime path can check a head without torch.

A head is a folder with ``head.json`` (config + the identity of the drafter it was trained on:
sha256 of the drafter's weights and its hidden size) and ``head.safetensors``. The torch module
itself is in ``omnidraft.runtime.draft_length.head_model``.
The stopping rule that reads the head is in ``policy.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from omnidraft.errors import InvalidArgument, ModelFolderError
from omnidraft.runtime.draft_length.policy import has_accept_head
from omnidraft.runtime.manifest import sha256_file
from omnidraft.runtime.model_checks import read_config, weights_sha256
from omnidraft.validate import read_fields

HEAD_JSON = "head.json"
HEAD_WEIGHTS = "head.safetensors"
FORMAT = "omnidraft.accept_head"
VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: no per-token biases
MAX_HIDDEN, MAX_LAYERS = 1 << 16, 64  # bounds a forged head.json cannot make us allocate past
# The one copy of this limitation: ExecuTorch's exported drafters have no acceptance-head output.
ET_NO_HEAD = "ExecuTorch drafters do not carry an acceptance head yet"
NO_HEAD_FIX = "export the drafter with --accept-head HEAD, or train one with omnidraft adapt --train-head"


class AcceptHeadError(ModelFolderError):
    """A head file is missing, damaged, or belongs to another drafter."""


@dataclass(frozen=True)
class DrafterIdentity:
    weights_sha256: str
    hidden_size: int

    def describe(self) -> str:
        return f"weights sha256 {self.weights_sha256[:12]}…, hidden size {self.hidden_size}"


@dataclass(frozen=True)
class HeadInfo:
    folder: Path
    hidden_size: int
    num_layers: int
    drafter: DrafterIdentity
    weights_sha256: str
    training: dict
    vocab_size: int = 0  # size of the per-drafter-token bias (0: none)


def drafter_identity(folder: str | Path) -> DrafterIdentity:
    """Identity of a Hugging Face drafter folder; the digest is the one ``omnidraft export``
    records as ``source_model_sha256`` (one file: its sha256; shards: a digest over name + sha256)."""
    folder = Path(folder)
    hidden = read_config(folder).int("hidden_size", lo=1)
    return DrafterIdentity(weights_sha256(folder), hidden)


def head_folder(path: str | Path) -> Path:
    """A head is named by its folder or by its head.json."""
    p = Path(path)
    return p.parent if p.name == HEAD_JSON else p


def read_head(path: str | Path) -> HeadInfo:
    folder = head_folder(path)
    meta, weights = folder / HEAD_JSON, folder / HEAD_WEIGHTS
    if not meta.is_file() or not weights.is_file():
        raise AcceptHeadError(
            f"{folder} is not an acceptance head (needs {HEAD_JSON} and {HEAD_WEIGHTS}); "
            "train one with omnidraft adapt --train-head"
        )
    fix = "retrain the head with omnidraft adapt --train-head"
    f = read_fields(meta, error=AcceptHeadError, what="acceptance head", fix=fix)
    if f.obj.get("format") != FORMAT or f.obj.get("version") not in READABLE_VERSIONS:
        raise AcceptHeadError(f"{meta} is not an omnidraft acceptance head (format {FORMAT} version {VERSION}); {fix}")
    drafter = f.sub("drafter")
    info = HeadInfo(
        folder,
        f.int("hidden_size", lo=1, hi=MAX_HIDDEN),
        f.int("num_layers", lo=0, hi=MAX_LAYERS),
        DrafterIdentity(drafter.sha256("weights_sha256"), drafter.int("hidden_size", lo=1, hi=MAX_HIDDEN)),
        f.sha256("weights_sha256"),
        f.dict("training", default={}),
        f.int("vocab_size", lo=0, hi=1 << 24, default=0),
    )
    if sha256_file(weights) != info.weights_sha256:
        raise AcceptHeadError(
            f"{weights} does not match {meta} (sha256 differs): it was truncated or replaced; "
            "retrain the head with omnidraft adapt --train-head"
        )
    return info


def check_belongs(info: HeadInfo, drafter: DrafterIdentity, where: str) -> None:
    """Refuse a head trained on another drafter: its features would mean something else."""
    if info.drafter != drafter or info.hidden_size != drafter.hidden_size:
        raise AcceptHeadError(
            f"the acceptance head in {info.folder} belongs to another drafter ({info.drafter.describe()}) "
            f"than {where} ({drafter.describe()}); train a head for this drafter with omnidraft adapt "
            "--train-head, or export this drafter with its own head (omnidraft export --accept-head HEAD)"
        )


def head_json(
    hidden_size: int,
    num_layers: int,
    drafter: DrafterIdentity,
    weights_sha256: str,
    training: dict | None = None,
    vocab_size: int = 0,
) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "vocab_size": vocab_size,
        "drafter": {"weights_sha256": drafter.weights_sha256, "hidden_size": drafter.hidden_size},
        "weights_file": HEAD_WEIGHTS,
        "weights_sha256": weights_sha256,
        "training": training or {},
    }


def token_bias_table(meta: dict, vocab_size: int, where: str) -> dict[int, float]:
    """The per-drafted-token biases an export's manifest carries beside its in-graph head
    (``accept_head.token_bias``: {token id: bias}, only the tokens training moved)."""
    raw = meta.get("token_bias", {})
    try:
        table = {int(k): float(v) for k, v in raw.items()}
    except (AttributeError, TypeError, ValueError):
        raise AcceptHeadError(
            f"{where}: accept_head.token_bias is malformed; re-export the drafter with "
            "omnidraft export --accept-head HEAD"
        ) from None
    bad = [k for k, v in table.items() if not (0 <= k < vocab_size and math.isfinite(v))]
    if bad:
        raise AcceptHeadError(
            f"{where}: accept_head.token_bias has {len(bad)} entries outside the drafter's "
            f"{vocab_size} tokens or not finite (first: {bad[0]}); re-export the drafter with "
            "omnidraft export --accept-head HEAD"
        )
    return table


def no_head_fix(backend_name: str) -> str:
    """How to get a drafter with an acceptance head, for a drafter running on ``backend_name``."""
    if backend_name == "executorch":
        return f"{ET_NO_HEAD}; use an ONNX or Hugging Face drafter, or a fixed --draft-len K"
    return NO_HEAD_FIX


def require_head(backend: object, where: object, what: str) -> None:
    """Refuse ``what`` (e.g. ``--draft-len auto``) for a drafter backend without an acceptance head."""
    if not has_accept_head(backend):
        raise InvalidArgument(
            f"{what} needs a drafter with an acceptance head, and {where} has none; "
            f"{no_head_fix(getattr(backend, 'name', ''))}"
        )
