"""The online n-gram cache: drafter sub-token sequences -> the one target token they spell.

Filled from verified output only (reverse translation of accepted target text), bounded with LFU (or
LRU, for the paper's Table 14 comparison) eviction, and saved per (drafter, target) pair as JSON with
a checksum so a damaged or foreign file is refused instead of silently used (the file itself, its
checks and its sharing between processes: runtime/ngram_cache_file.py).

File format (shared with the Java core in android_demo/):
``{"format": "omnidraft.ngram-cache", "version": 1, "drafter_tokenizer": sha256, "target_tokenizer": sha256,
"capacity": int|null, "policy": "lfu"|"lru", "clock": int,
"entries": [[[d1, ..., dn], t, seen, hits, last_used], ...], "checksum": sha256(json(entries))}``
"""

from __future__ import annotations

import hashlib
import heapq
import json
from pathlib import Path

import numpy as np

from omnidraft.errors import InvalidArgument

FORMAT = "omnidraft.ngram-cache"
VERSION = 1
POLICIES = ("lfu", "lru")

Key = tuple[int, ...]


def entries_checksum(entries: list) -> str:
    return hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode()).hexdigest()


class NgramCache:
    def __init__(
        self,
        drafter_tokenizer: str,
        target_tokenizer: str,
        drafter_width: int,
        capacity: int | None = None,
        policy: str = "lfu",
    ) -> None:
        if capacity is not None and capacity < 1:
            raise InvalidArgument(
                f"n-gram cache capacity must be >= 1 (got {capacity}); omit it for an unbounded cache"
            )
        if policy not in POLICIES:
            raise InvalidArgument(f"unknown eviction policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.drafter_tokenizer = drafter_tokenizer
        self.target_tokenizer = target_tokenizer
        self.capacity = capacity
        self.policy = policy
        self.clock = 0
        self.max_len = 0
        self.version = 0  # bumped whenever the key set changes (the loop caches its draft mask on it)
        self._entries: dict[Key, list[int]] = {}  # key -> [target, seen, hits, last_used]
        self._refs = np.zeros(drafter_width, dtype=np.int32)  # how many keys use each drafter id
        self._heap: list[tuple[int, int, Key]] = []
        # The file this cache was opened from (ngram_cache_file.open_shared/load): saving back to it merges.
        self.file: Path | None = None
        self.file_stamp: tuple | None = None
        self.file_base: dict[Key, tuple[int, int, int]] = {}
        self.target_width: int | None = None

    # -- queries -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def get(self, key: Key) -> int | None:
        e = self._entries.get(key)
        return None if e is None else e[0]

    def items(self) -> list[tuple[Key, int, int, int]]:
        """(key, target, seen, hits) for every entry."""
        return [(k, e[0], e[1], e[2]) for k, e in self._entries.items()]

    @property
    def drafter_tokens(self) -> np.ndarray:
        """Boolean mask of drafter ids that appear in some key."""
        return self._refs > 0

    def nbytes(self) -> int:
        """Bytes of the serialised cache (what it costs on disk and to ship)."""
        return len(self._serialise())

    # -- updates -----------------------------------------------------------------------------
    def observe(self, key: Key, target: int) -> bool:
        """Record one occurrence of ``key`` spelling ``target``; returns True if it is new."""
        self.clock += 1
        e = self._entries.get(key)
        if e is not None:
            if e[0] == target:
                e[1] += 1
                e[3] = self.clock
                self._push(key, e)
                return False
            self._remove(key)  # the same sub-tokens now spell another target token: keep the newest
        if self.capacity is not None and len(self._entries) >= self.capacity:
            self._evict()
        e = [target, 1, 0, self.clock]
        self._entries[key] = e
        self._refs[list(key)] += 1
        self.max_len = max(self.max_len, len(key))
        self.version += 1
        self._push(key, e)
        return True

    def record_hit(self, key: Key) -> None:
        """The target accepted this n-gram in verification."""
        e = self._entries.get(key)
        if e is not None:
            self.clock += 1
            e[2] += 1
            e[3] = self.clock
            self._push(key, e)

    def _rank(self, e: list[int]) -> int:
        return e[1] + e[2] if self.policy == "lfu" else e[3]

    def _push(self, key: Key, e: list[int]) -> None:
        if self.capacity is None:
            return
        heapq.heappush(self._heap, (self._rank(e), e[3], key))
        if len(self._heap) > 4 * self.capacity + 64:
            self._heap = [(self._rank(v), v[3], k) for k, v in self._entries.items()]
            heapq.heapify(self._heap)

    def _evict(self) -> None:
        while self._heap:
            rank, last, key = heapq.heappop(self._heap)
            e = self._entries.get(key)
            if e is not None and self._rank(e) == rank and e[3] == last:
                self._remove(key)
                return
        # Heap exhausted by stale items: fall back to a scan (rare).
        key = min(self._entries, key=lambda k: (self._rank(self._entries[k]), self._entries[k][3]))
        self._remove(key)

    def _remove(self, key: Key) -> None:
        del self._entries[key]
        self._refs[list(key)] -= 1
        self.version += 1

    # -- persistence -------------------------------------------------------------------------
    def _serialise(self) -> bytes:
        entries = [[list(k), e[0], e[1], e[2], e[3]] for k, e in self._entries.items()]
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "drafter_tokenizer": self.drafter_tokenizer,
            "target_tokenizer": self.target_tokenizer,
            "capacity": self.capacity,
            "policy": self.policy,
            "clock": self.clock,
            "entries": entries,
            "checksum": entries_checksum(entries),
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    def install(self, rows: list[tuple], clock: int) -> None:
        """Replace the contents with ``rows`` (key, target, seen, hits, last_used), replayed in recency
        order so the eviction state is the one the saving process had (the Java core does the same)."""
        self._entries, self._heap, self.max_len, self.clock = {}, [], 0, 0
        self._refs[:] = 0
        self.version += 1
        for key, target, seen, hits, last in sorted(rows, key=lambda r: r[4]):
            self.observe(key, target)
            e = self._entries.get(key)
            if e is not None:
                e[1], e[2], e[3] = seen, hits, last
                self._push(key, e)
        self.clock = max(clock, self.clock)

    def save(self, path: str | Path) -> None:
        """Write atomically (a crash mid-write leaves the previous file intact); a cache opened from
        ``path`` merges what other processes saved there meanwhile."""
        from omnidraft.runtime import ngram_cache_file

        ngram_cache_file.save(self, Path(path))

    @classmethod
    def load(
        cls,
        path: str | Path,
        drafter_tokenizer: str,
        target_tokenizer: str,
        drafter_width: int,
        target_width: int,
        capacity: int | None = None,
        policy: str | None = None,
    ) -> NgramCache:
        """Load a cache saved for exactly this (drafter, target) tokenizer pair."""
        from omnidraft.runtime import ngram_cache_file

        return ngram_cache_file.load(
            Path(path), drafter_tokenizer, target_tokenizer, drafter_width, target_width, capacity, policy
        )
