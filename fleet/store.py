"""The server's published global adapters: versioned, atomic, resumable.

Layout under ``<out>/global``::

    v0000/ v0001/ ...   adapter_config.json + adapter_model.safetensors (PEFT layout, pair identity
                        in the header, exactly what `omnidraft adapt` writes)
    latest.json         {"version", "round", ...}: written last, atomically, after the folder is in place
    drafter/            the latest global drafter with W + s*BA folded in (HF folder)

A server killed at any point restarts from ``latest.json``: the version it names is complete (its
folder was swapped in before the pointer moved), and a half-written next version is never read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omnidraft import atomic
from omnidraft.adapt import delta
from omnidraft.adapt.trainer import lora_config
from omnidraft.errors import AdapterError

from .aggregate import Adapter, check_adapter

LATEST = "latest.json"


class GlobalStore:
    def __init__(self, root: Path, ident: delta.PairIdentity, rank: int) -> None:
        self.root, self.ident, self.rank = Path(root), ident, rank

    def folder(self, version: int) -> Path:
        return self.root / f"v{version:04d}"

    def publish(self, version: int, adapter: Adapter, info: dict) -> Path:
        from safetensors.torch import save_file

        final = self.folder(version)
        with atomic.Staging(final) as tmp:
            meta = self.ident.metadata()
            meta["info"] = json.dumps(info, sort_keys=True)
            state = {k: v.detach().contiguous().cpu() for k, v in adapter.items()}
            save_file(state, str(tmp.path / delta.ADAPTER_WEIGHTS), metadata=meta)
            lora_config(self.rank).save_pretrained(str(tmp.path))
            tmp.publish()
        atomic.write_json(self.root / LATEST, {"version": version, **info})
        return final

    def latest(self, reference: Adapter) -> tuple[int, Adapter, dict] | None:
        """The last published version (checked against the pair and the LoRA layout), or None."""
        path = self.root / LATEST
        if not path.is_file():
            return None
        try:
            info = json.loads(path.read_text())
            version = int(info["version"])
        except (ValueError, KeyError, TypeError, OSError) as exc:
            raise AdapterError(f"{path} is damaged ({exc}); delete {self.root} to start the fleet afresh") from None
        tensors, _ = delta.read_adapter(self.folder(version), self.ident)
        why = check_adapter(tensors, reference)
        if why:
            raise AdapterError(
                f"published adapter {self.folder(version)} does not fit this LoRA layout ({why}); "
                f"pass the --lora-rank it was trained with or delete {self.root}"
            )
        return version, {k: v.to(torch.float32) for k, v in tensors.items()}, info
