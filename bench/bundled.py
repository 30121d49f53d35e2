"""The bundled drafter/target pair: integrity checks and cached exports."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omnidraft.atomic import locked
from omnidraft.bench.export_cache import touch
from omnidraft.errors import ManifestError, ModelFolderError
from omnidraft.models.gguf_tokenizers import cache_dir

BUNDLED = Path(__file__).resolve().parent.parent / "models" / "bundled"
ROLES = ("drafter", "target")  # the tiny pair: our own drafter and target, trained together
# The drafter shipped for real targets: the bundled drafter trained further on their own answers
# (models/recipes/drafter-teachers.json), so it drafts for real targets before any user data.
REAL_DRAFTER = "drafter-teachers"
LLAMA_VOCAB_ROLES = ("drafter", REAL_DRAFTER)  # their Llama-2 tokenizer.json is built locally
# Bump when the exporters change what they produce for the same inputs, so cached exports are rebuilt.
EXPORT_REVISION = 8
# Drafter exports keep their 4,096 most frequent tokens (export/draft_vocab.py) where the folder
# ranks them (token_counts.json): the LM head is a large share of a small drafter's step, and 4,096
# tokens still cover over 90 % of the streams' held-out text.
DRAFT_VOCAB = 4096


def _rebuild_hint(role: str, name: str) -> str:
    if name == "tokenizer.json" and role in LLAMA_VOCAB_ROLES:
        return "convert it with `bash scripts/setup.sh` (Llama-2's tokenizer is built locally, never committed)"
    return (
        f"restore it with `git checkout -- models/bundled/{role}` or retrain it with "
        f"`python -m omnidraft.models.train --recipe {role}`"
    )


def check_bundled(root: Path = BUNDLED, *, roles: tuple[str, ...] = ROLES) -> dict[str, Path]:
    """The folders of ``roles`` (default: the tiny pair), or a ModelFolderError naming the file that
    is missing or damaged."""
    from safetensors import safe_open

    out = {}
    for role in roles:
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


def cached_export(
    folder: Path,
    fmt: str,
    quant: str,
    max_seq_len: int,
    progress: bool = True,
    accept_head: Path | None = None,
    draft_vocab: int | None = None,
    device: str = "cpu",
    et_path: str = "auto",
) -> Path:
    """Export ``folder`` once per (weights, format, quant, length[, acceptance head, draft vocabulary,
    device, ExecuTorch path]); later calls reuse the valid export. An accelerator ``device`` takes its
    own quant."""
    tag = f"-{et_path}" if fmt == "executorch" and et_path != "auto" else ""
    if device != "cpu":
        from omnidraft.export.recipes import default_quant

        quant, tag = default_quant(fmt, device), f"{tag}-{device}"
    if accept_head is not None:
        from omnidraft.runtime.draft_length.head_file import read_head

        tag = f"-head{read_head(accept_head).weights_sha256[:12]}"
    if draft_vocab:
        from omnidraft.export.recipes import COUNTS_FILE

        counts = hashlib.sha256((folder / COUNTS_FILE).read_bytes()).hexdigest()[:8]
        tag += f"-v{draft_vocab}-{counts}"
    out = cache_dir() / "exports" / _folder_digest(folder) / f"{fmt}-{quant}-{max_seq_len}-r{EXPORT_REVISION}{tag}"
    out.parent.mkdir(parents=True, exist_ok=True)
    # One exporter per model at a time: a second process (a bench beside a demo, a parallel test
    # worker) waits and then reuses the finished export instead of building the same one again.
    with locked(out):
        if (out / "manifest.json").is_file():
            from omnidraft.runtime.manifest import load_manifest

            try:
                load_manifest(out)
                touch(out)  # its last use, for omnidraft cache prune
                return out
            except (ManifestError, ModelFolderError):
                pass  # damaged cache entry: export again
        from omnidraft.export.pipeline import export_model

        export_model(
            folder,
            fmt,
            quant,
            max_seq_len,
            out,
            progress=progress,
            accept_head=accept_head,
            draft_vocab=draft_vocab or None,
            device=device,
            et_path=et_path,
        )
    return out


def target_export(folder: Path, fmt: str, quant: str, max_seq_len: int, progress: bool = True) -> Path:
    """``cached_export`` of a target. An ExecuTorch target takes the static-cache path: its attention
    is row-stable, so verifying k tokens gives the rows k decode steps give and speculative greedy
    output equals target-only (the faster LLM path's custom sdpa is not, see export/executorch_export.py)."""
    return cached_export(folder, fmt, quant, max_seq_len, progress, et_path="static" if fmt == "executorch" else "auto")


def drafter_vocab(folder: Path, requested: int | None = DRAFT_VOCAB) -> int | None:
    """The draft vocabulary a drafter export gets: ``requested`` where ``folder`` ranks its tokens
    (token_counts.json), else every token (None)."""
    from omnidraft.export.recipes import COUNTS_FILE

    return requested if requested and (folder / COUNTS_FILE).is_file() else None


def drafter_export(
    folder: Path,
    fmt: str,
    quant: str,
    max_seq_len: int,
    progress: bool = True,
    accept_head: Path | None = None,
    draft_vocab: int | None = DRAFT_VOCAB,
    device: str = "cpu",
) -> Path:
    """``cached_export`` of a drafter, with its output layer trimmed where the folder allows it."""
    vocab = drafter_vocab(folder, draft_vocab)
    return cached_export(folder, fmt, quant, max_seq_len, progress, accept_head, vocab, device=device)
