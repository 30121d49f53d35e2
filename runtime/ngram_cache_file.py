"""The n-gram cache on disk: validated loading with bounded reads, and saving shared by processes.

Loading refuses a file that is not regular, that belongs to another (drafter, target) pair (read
from its first 64 KiB, before anything else), or that is larger than ``MAX_FILE_BYTES``; then every
field and entry is type-checked. A cache opened from its file (``open_shared``, ``NgramCache.load``)
stays bound to it: saving it back takes a lock on the file's folder, merges what other processes
wrote since this one last read it (the union of entries, their counts added), and replaces the file
atomically. Two runs on one ``--cache`` file therefore keep every entry.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from omnidraft.atomic import crash_point, locked, write_bytes
from omnidraft.errors import CacheFileError
from omnidraft.runtime import ngram_cache as nc
from omnidraft.validate import Fields, MiB, check_regular, parse_json, read_bytes, show_size

# An entry is ~30 bytes on disk and ~12x that once parsed: 16 MiB is ~500k entries, ~200 MiB to load.
MAX_FILE_BYTES = 16 * MiB
MAX_KEY_LEN = 64  # drafter sub-tokens of one target token (the longest real ones are byte runs)
HEADER_BYTES = 64 * 1024
HINT = "delete it to start a fresh cache"
ANY_ID = 1 << 31  # target width unknown (a cache built in memory): ids are only checked non-negative


def _stamp(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _header(path: Path) -> dict | None:
    """The fields written before ``entries`` (format, version, pair, capacity, policy, clock), from
    the file's first bytes only; None when they are not there in that form."""
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    i = head.find(b'"entries"')
    if i < 0:
        return None
    try:
        doc = json.loads(head[:i].rstrip().rstrip(b",") + b"}")
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _check_identity(doc: dict, path: Path, drafter: str, target: str) -> None:
    if doc.get("format") != nc.FORMAT or doc.get("version") != nc.VERSION:
        raise CacheFileError(f"{path} is not an omnidraft n-gram cache (format {nc.FORMAT} v{nc.VERSION}); {HINT}")
    if doc.get("drafter_tokenizer") != drafter or doc.get("target_tokenizer") != target:
        raise CacheFileError(
            f"n-gram cache {path} was built for another drafter/target tokenizer pair; "
            f"use the cache of this pair or {HINT}"
        )


def _row(r: object, n: int, where: str, drafter_width: int, target_width: int) -> tuple:
    def ok_id(x: object, width: int) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < width

    if (
        isinstance(r, list)
        and len(r) == 5
        and isinstance(r[0], list)
        and 1 <= len(r[0]) <= MAX_KEY_LEN
        and all(ok_id(d, drafter_width) for d in r[0])
        and ok_id(r[1], target_width)
        and all(ok_id(x, ANY_ID) for x in r[2:])
    ):
        return tuple(r[0]), r[1], r[2], r[3], r[4]
    raise CacheFileError(
        f"{where}: entry {n} is malformed (want [[1..{MAX_KEY_LEN} drafter ids < {drafter_width}], "
        f"target id < {target_width}, seen, hits, last_used] with non-negative integers, got {json.dumps(r)[:60]}); {HINT}"
    )


def read(path: Path, drafter: str, target: str, drafter_width: int, target_width: int) -> dict:
    """The checked contents of a cache file: rows (key, target, seen, hits, last), capacity, policy, clock."""
    where = f"n-gram cache {path}"
    check_regular(path, error=CacheFileError, what="n-gram cache", fix=HINT)
    head = _header(path)
    if head is not None:  # a foreign or alien file is refused before its bulk is read
        _check_identity(head, path, drafter, target)
    data = read_bytes(
        path,
        error=CacheFileError,
        what="n-gram cache",
        fix=f"{HINT} (and bound the next one with --cache-capacity)",
        limit=MAX_FILE_BYTES,
    )
    doc = parse_json(data, error=CacheFileError, where=where, fix=HINT, depth=None)
    if not isinstance(doc, dict):
        raise CacheFileError(f"{path} is not an omnidraft n-gram cache (format {nc.FORMAT} v{nc.VERSION}); {HINT}")
    _check_identity(doc, path, drafter, target)
    f = Fields(doc, where=where, error=CacheFileError, fix=HINT)
    entries = f.list("entries")
    rows = [_row(r, n, where, drafter_width, target_width) for n, r in enumerate(entries)]
    if f.str("checksum") != nc.entries_checksum(entries):
        raise CacheFileError(f"{where} is corrupted (checksum mismatch); {HINT}")
    return {
        "rows": rows,
        "capacity": f.optional_int("capacity", lo=1),
        "policy": f.str("policy", choices=nc.POLICIES, default="lfu"),
        "clock": f.int("clock", lo=0, default=0),
    }


def _bind(cache: nc.NgramCache, path: Path, target_width: int, stamp: tuple | None) -> None:
    """Bind ``cache`` to ``path`` as read at ``stamp`` (None: no file yet), the base of the next merge."""
    cache.file = Path(os.path.abspath(path))
    cache.target_width = target_width
    cache.file_stamp = stamp
    cache.file_base = {k: tuple(e[:3]) for k, e in cache._entries.items()}


def load(
    path: Path,
    drafter: str,
    target: str,
    drafter_width: int,
    target_width: int,
    capacity: int | None = None,
    policy: str | None = None,
) -> nc.NgramCache:
    stamp = _stamp(Path(path))  # taken before the read: a newer file written meanwhile is merged on save
    doc = read(Path(path), drafter, target, drafter_width, target_width)
    cap = capacity if capacity is not None else doc["capacity"]
    cache = nc.NgramCache(drafter, target, drafter_width, cap, policy or doc["policy"])
    cache.install(doc["rows"], doc["clock"])
    _bind(cache, Path(path), target_width, stamp)
    return cache


def open_shared(
    path: Path,
    drafter: str,
    target: str,
    drafter_width: int,
    target_width: int,
    capacity: int | None = None,
    policy: str = "lfu",
) -> nc.NgramCache:
    """The cache kept in ``path`` (a fresh one if there is none yet), bound to it for ``save``."""
    if os.path.lexists(path):
        return load(Path(path), drafter, target, drafter_width, target_width, capacity, policy)
    cache = nc.NgramCache(drafter, target, drafter_width, capacity, policy)
    _bind(cache, Path(path), target_width, None)
    return cache


def _merged_rows(cache: nc.NgramCache, disk: dict) -> list[tuple]:
    """Disk entries plus this process's changes since it last read the file: new keys join, counts
    of keys both used are added, keys this process dropped (eviction) go unless another used them."""
    merged = {k: [t, seen, hits, last] for k, t, seen, hits, last in disk["rows"]}
    base = cache.file_base
    for k, e in cache._entries.items():
        b, d = base.get(k), merged.get(k)
        if d is None:
            merged[k] = list(e)
        elif d[0] == e[0]:
            b_seen, b_hits = (b[1], b[2]) if b is not None and b[0] == e[0] else (0, 0)
            d[1] = max(1, d[1] + e[1] - b_seen)
            d[2] = max(0, d[2] + e[2] - b_hits)
            d[3] = max(d[3], e[3])
        elif b is None or b != tuple(e[:3]):
            merged[k] = list(e)  # both wrote another target for these sub-tokens: this run's is newer to it
    for k, b in base.items():
        if k not in cache._entries and k in merged and tuple(merged[k][:3]) == b:
            del merged[k]
    return [(k, *v) for k, v in merged.items()]


def save(cache: nc.NgramCache, path: Path) -> None:
    """Write ``cache`` to ``path`` atomically; merged with the file's newer contents when the cache
    was opened from that file."""
    path = Path(path)
    if cache.file is None or cache.file != Path(os.path.abspath(path)):
        _write(cache, path)
        return
    with locked(path):
        now = _stamp(path)
        if now is not None and now != cache.file_stamp:
            try:
                disk = read(path, cache.drafter_tokenizer, cache.target_tokenizer, len(cache._refs), cache.target_width)
            except CacheFileError as exc:
                raise CacheFileError(
                    f"{exc} — it changed while this run used it and was left as it is; this run's cache was not saved"
                ) from None
            cache.install(_merged_rows(cache, disk), max(disk["clock"], cache.clock))
        crash_point("cache:merged")
        _write(cache, path)
        _bind(cache, path, cache.target_width, _stamp(path))


def _write(cache: nc.NgramCache, path: Path) -> None:
    data = cache._serialise()
    if len(data) > MAX_FILE_BYTES:
        raise CacheFileError(
            f"the n-gram cache has grown to {show_size(len(data))} ({len(cache)} entries), above the "
            f"{show_size(MAX_FILE_BYTES)} a cache file may hold, so {path} was not written; bound it with --cache-capacity"
        )
    write_bytes(path, data)
