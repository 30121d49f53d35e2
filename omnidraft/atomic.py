"""Atomic file writes and folder swaps, the one implementation every module uses.

A file is written to a temporary name in its destination folder, flushed to disk, and renamed over
the destination (``os.replace`` is atomic on one filesystem). A folder is built beside its
destination and exchanged with it in one step (``renameat2(RENAME_EXCHANGE)``; where a filesystem
lacks it, two renames, and the next writer or reader moves a stranded ``.prev`` back). A crash or an
exception at any point leaves the previous file or folder (or the new one): readers never see half
of either, and nothing already saved is lost.

A destination that exists and is not a regular file (a device, a FIFO, a folder) is refused, never
replaced. Each writer holds a lock on its temporary file or folder while it lives, so a later writer
removes what a killed one left behind and never what a live one is still writing. Failures to write
(read-only folder, full disk) surface as ``OutputError``, one line for the CLI. Standard library
only, so the lightweight runtime can use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import json
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omnidraft.errors import OutputError
from omnidraft.validate import describe_special

FILE_MODE = 0o644  # mkstemp creates 0600; our files are shared, copied to devices, committed
DIR_MODE = 0o755
CRASH_ENV = "OMNIDRAFT_CRASH_AT"
_reached: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Kill this process outright (SIGKILL: no cleanup, no finally) at the named publishing step when
    the environment asks for it, ``OMNIDRAFT_CRASH_AT=name`` or ``name#N`` (the N-th time the step is
    reached). The crash tests use it to show that a kill at any step loses nothing."""
    want = os.environ.get(CRASH_ENV)
    if not want:
        return
    _reached[name] = _reached.get(name, 0) + 1
    step, _, nth = want.partition("#")
    if step == name and _reached[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def _cannot_write(path: Path, exc: OSError) -> OutputError:
    why = exc.strerror or str(exc)
    hint = "free some disk space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "pick a writable location"
    return OutputError(f"cannot write {path} ({why}); {hint}")


def _destination(path: Path) -> Path:
    """The file a write to ``path`` replaces: a symlink's target (the link stays a link), refused
    when it is not a regular file."""
    kind = describe_special(path)
    if kind is not None:
        raise OutputError(
            f"{path} is {kind}, not a regular file: omnidraft never replaces one; pass the path of a regular file"
        )
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:  # a filesystem without flock: treat as unlocked (no stale-file detection there)
        return True


def remove_stale(parent: Path, pattern: str) -> list[Path]:
    """Remove temporary files and folders matching ``pattern`` in ``parent`` that no live writer holds
    (their writer was killed); returns what was removed."""
    removed = []
    for p in sorted(Path(parent).glob(pattern)):
        try:
            mode = p.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                continue
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if _try_lock(fd):
                if stat.S_ISDIR(mode):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
        finally:
            os.close(fd)
    return removed


def _temp_pattern(name: str, suffix: str = ".tmp") -> str:
    return f".{glob.escape(name)}.*{glob.escape(suffix)}"


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yields a temporary path next to ``path`` for a writer that wants a file name (matplotlib,
    safetensors); on a clean exit the temporary file replaces ``path``. ``suffix`` lets writers
    that pick a format from the extension (``savefig``) see the right one."""
    path = _destination(Path(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path.parent, _temp_pattern(path.name, suffix))
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    _try_lock(fd)  # held until the rename: marks the temp file as a live writer's
    try:
        yield Path(tmp)
        os.chmod(tmp, FILE_MODE)
        crash_point("file:written")
        os.replace(tmp, path)
        crash_point("file:replaced")
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _cannot_write(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


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


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Exclusive lock among omnidraft processes for a read-modify-write of ``path``: a flock on the
    folder that holds it (no lock file is left behind)."""
    parent = Path(path).parent
    try:
        fd = os.open(parent, os.O_RDONLY)
    except OSError as exc:
        raise _cannot_write(Path(path), exc) from None
    try:
        with contextlib.suppress(OSError):  # flock-less filesystems: no lock, as before
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_writable(path: str | Path, *, folder: bool = False) -> Path:
    """Refuse, before any work starts, an output that could not be written once the work is done:
    a special file, a file where a folder is wanted (or the reverse), a read-only location."""
    path = Path(path)
    if folder:
        if path.exists() and not path.is_dir():
            raise OutputError(f"{path} exists and is not a folder; pick another output folder")
        where = path
    else:
        _destination(path)
        where = path.parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=where, prefix=".omnidraft-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    return path


# -- folders ---------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file() and not f.is_symlink():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _prev(final: Path) -> Path:
    return final.with_name(final.name + ".prev")


def recover_dir(final: Path, tag: str = "tmp") -> None:
    """Undo a crash between the two renames of the fallback swap, and remove staging folders of
    ``final`` whose writer is gone."""
    final = Path(final)
    prev = _prev(final)
    if not final.exists() and prev.is_dir():
        os.rename(prev, final)
    if final.parent.is_dir():
        remove_stale(final.parent, f".{glob.escape(final.name)}.{glob.escape(tag)}-*")


def swap_dir(new: Path, final: Path) -> None:
    """Put the complete folder ``new`` at ``final``; the previous folder is deleted only once the new
    one is in place."""
    new, final = Path(new), Path(final)
    if final.exists() and not final.is_dir():
        raise OutputError(f"{final} exists and is not a folder; remove it or pick another output folder")
    try:
        _fsync_tree(new)
        crash_point("dir:staged")
        if not final.exists():
            os.rename(new, final)
        elif _exchange(new, final):
            crash_point("dir:exchanged")
            shutil.rmtree(new, ignore_errors=True)  # ``new`` now holds the previous folder
        else:
            prev = _prev(final)
            if prev.exists():
                shutil.rmtree(prev)
            os.rename(final, prev)
            crash_point("dir:moved-aside")
            os.rename(new, final)
            shutil.rmtree(prev, ignore_errors=True)
        _fsync_dir(final.parent)
        crash_point("dir:published")
    except OSError as exc:
        raise _cannot_write(final, exc) from None


class Staging:
    """A folder built beside ``final`` (``.<name>.<tag>-XXXX``), locked while its writer lives, then
    swapped in with ``publish()``; on an exception it is removed and ``final`` is left as it was."""

    def __init__(self, final: str | Path, tag: str = "tmp") -> None:
        self.final = Path(final)
        try:
            self.final.parent.mkdir(parents=True, exist_ok=True)
            recover_dir(self.final, tag)
            self.path = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.{tag}-", dir=self.final.parent))
            self.path.chmod(DIR_MODE)  # mkdtemp makes it private; the swapped-in folder reads like any other
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise _cannot_write(self.final, exc) from None
        _try_lock(self._fd)

    def publish(self) -> Path:
        swap_dir(self.path, self.final)
        return self.final

    def close(self) -> None:
        """Remove what is left at the staging path (all of it when unpublished) and release the lock."""
        if self._fd < 0:
            return
        if self.path.exists():  # not published, or the previous folder a swap left here
            shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
