"""Atomic file writes, the one implementation every module uses.

A file is written to a temporary name in its destination folder, flushed to disk, and renamed over
the destination (``os.replace`` is atomic on one filesystem). A crash or an exception mid-write
leaves the previous file (or no file) and no stray temporary file: readers never see half a file.
Standard library only, so the lightweight runtime can use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FILE_MODE = 0o644  # mkstemp creates 0600; our files are shared, copied to devices, committed


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yields a temporary path next to ``path`` for a writer that wants a file name (matplotlib,
    safetensors); on a clean exit the temporary file replaces ``path``. ``suffix`` lets writers
    that pick a format from the extension (``savefig``) see the right one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, indent: int | None = 1, compact: bool = False) -> Path:
    """JSON (UTF-8, trailing newline); ``compact`` drops all optional whitespace."""
    text = json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj, indent=indent)
    return write_text(path, text + "\n")


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Saves a matplotlib figure atomically (the temp name keeps the .png extension)."""
    with atomic_path(path, suffix=Path(path).suffix or ".png") as tmp:
        fig.savefig(tmp, dpi=dpi)
    return Path(path)
