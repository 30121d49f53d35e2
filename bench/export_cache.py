"""The export cache that bench, demo and adaptation fill: ``<cache>/exports/<weights digest>/<variant>``.

Every export ``cached_export`` builds stays there (one per weights, format, quantization, length,
head and draft vocabulary), so the folder only grows; ``omnidraft cache list | prune`` shows and
trims it. A folder's modification time is its last use (``cached_export`` touches a folder it
reuses). An export is pruned by renaming it to a hidden name first, so a reader sees it whole or
not at all; exports being built (hidden, locked staging folders) are never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from omnidraft.atomic import remove_stale
from omnidraft.errors import InvalidArgument, OutputError
from omnidraft.models.gguf_tokenizers import cache_dir

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhm]?)\s*$")
_UNIT = {"d": 86400, "h": 3600, "m": 60, "": 86400}


@dataclass(frozen=True)
class CachedExport:
    path: Path
    bytes: int
    last_used: float  # seconds since the epoch

    def as_dict(self) -> dict:
        return {"path": str(self.path), "bytes": self.bytes, "last_used": round(self.last_used, 3)}


def root() -> Path:
    return cache_dir() / "exports"


def parse_age(text: str) -> float:
    """'30d', '12h', '90m' or a bare number of days -> seconds."""
    m = _AGE.match(text or "")
    if not m:
        raise InvalidArgument(f"--older-than takes an age like 30d, 12h or 90m (a bare number is days); got {text!r}")
    return float(m.group(1)) * _UNIT[m.group(2)]


def _size(folder: Path) -> int:
    return sum(f.lstat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def entries(base: Path | None = None) -> list[CachedExport]:
    """Every cached export, most recently used first."""
    base = root() if base is None else base
    out = []
    for digest in sorted(base.iterdir()) if base.is_dir() else []:
        if digest.name.startswith(".") or not digest.is_dir():
            continue
        for variant in sorted(digest.iterdir()):
            if variant.name.startswith(".") or not variant.is_dir() or variant.is_symlink():
                continue
            out.append(CachedExport(variant, _size(variant), variant.stat().st_mtime))
    return sorted(out, key=lambda e: -e.last_used)


def touch(folder: Path) -> None:
    """Mark a cached export as used now (what ``prune --older-than`` and ``--keep`` go by)."""
    try:
        os.utime(folder)
    except OSError:
        pass  # a read-only cache still serves its exports


def prune(
    *, older_than: float | None, keep: int | None, dry_run: bool = False, base: Path | None = None
) -> tuple[list[CachedExport], list[CachedExport]]:
    """Remove exports unused for ``older_than`` seconds and/or all but the ``keep`` most recently
    used; returns (removed, kept)."""
    if older_than is None and keep is None:
        raise InvalidArgument("cache prune needs --older-than AGE and/or --keep N (see omnidraft cache prune -h)")
    if keep is not None and keep < 0:
        raise InvalidArgument(f"--keep must be >= 0 (got {keep})")
    now = time.time()
    removed, kept = [], []
    for n, e in enumerate(entries(base)):
        old = older_than is not None and now - e.last_used > older_than
        (removed if old or (keep is not None and n >= keep) else kept).append(e)
    if not dry_run:
        for e in removed:
            _remove(e.path)
        for digest in {e.path.parent for e in removed}:
            remove_stale(digest, ".*.export-*")
            if digest.is_dir() and not any(digest.iterdir()):
                digest.rmdir()
    return removed, kept


def _remove(folder: Path) -> None:
    try:
        hidden = Path(tempfile.mkdtemp(prefix=f".{folder.name}.pruned-", dir=folder.parent))
        os.replace(folder, hidden)  # an empty folder is replaced: the export vanishes in one step
        shutil.rmtree(hidden)
    except OSError as exc:
        raise OutputError(f"cannot remove {folder} ({exc.strerror or exc}); check the cache's permissions") from None
