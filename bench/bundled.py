"""The bundled drafter/target pair: integrity checks and cached exports."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omnidraft.errors import ManifestError, ModelFolderError
from omnidraft.models.gguf_tokenizers import cache_dir

BUNDLED = Path(__file__).resolve().parent.parent / "models" / "bundled"
ROLES = ("drafter", "target")
# Bump when the exporters change what they produce for the same inputs, so cached exports are rebuilt.
EXPORT_REVISION = 4


def _rebuild_hint(role: str, name: str) -> str:
    if name == "tokenizer.json" and role == "drafter":
        return "convert it with `bash scripts/setup.sh` (Llama-2's tokenizer is built locally, never committed)"
    return (f"restore it with `git checkout -- models/bundled/{role}` or retrain it with "
            f"`python -m omnidraft.models.train --recipe {role}`")


def check_bundled(root: Path = BUNDLED) -> dict[str, Path]:
    """Both folders, or a ModelFolderError naming the file that is missing or damaged."""
    from safetensors import safe_open

    out = {}
    for role in ROLES:
        folder = root / role
        for name in ("config.json", "tokenizer.json", "model.safetensors"):
            f = folder / name
            if not f.is_file():
                raise ModelFolderError(f"bundled {role} file {f} is missing; {_rebuild_hint(role, name)}")
            try:
                if name.endswith(".json"):
                    json.loads(f.read_bytes())
                else:
                    with safe_open(str(f), framework="numpy") as st:
                        next(iter(st.keys()))
            except Exception:  # any parse failure means the file is damaged
                raise ModelFolderError(f"bundled {role} file {f} is damaged; {_rebuild_hint(role, name)}") from None
        out[role] = folder
    return out


def _folder_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        h.update((folder / name).read_bytes())
    return h.hexdigest()[:16]


def cached_export(folder: Path, fmt: str, quant: str, max_seq_len: int, progress: bool = True,
                  accept_head: Path | None = None) -> Path:
    """Export ``folder`` once per (weights, format, quant, length[, acceptance head]); later calls
    reuse the valid export."""
    tag = ""
    if accept_head is not None:
        from omnidraft.runtime.accept_head import read_head

        tag = f"-head{read_head(accept_head).weights_sha256[:12]}"
    out = cache_dir() / "exports" / _folder_digest(folder) / f"{fmt}-{quant}-{max_seq_len}-r{EXPORT_REVISION}{tag}"
    if (out / "manifest.json").is_file():
        from omnidraft.runtime.manifest import load_manifest

        try:
            load_manifest(out)
            return out
        except (ManifestError, ModelFolderError):
            pass  # damaged cache entry: export again
    from omnidraft.export.pipeline import export_model

    export_model(folder, fmt, quant, max_seq_len, out, progress=progress, accept_head=accept_head)
    return out
