"""The online n-gram cache: drafter sub-token sequences -> the one target token they spell.

Filled from verified output only (reverse translation of accepted target text), bounded with LFU (or
LRU, for the paper's Table 14 comparison) eviction, and saved per (drafter, target) pair as JSON with
a checksum so a damaged or foreign file is refused instead of silently used.

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

from omnidraft.atomic import write_bytes
from omnidraft.errors import CacheFileError, InvalidArgument

FORMAT = "omnidraft.ngram-cache"
VERSION = 1
POLICIES = ("lfu", "lru")

Key = tuple[int, ...]


def _entries_checksum(entries: list) -> str:
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
            "checksum": _entries_checksum(entries),
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    def save(self, path: str | Path) -> None:
        """Write atomically: a crash mid-write leaves the previous file intact."""
        write_bytes(path, self._serialise())

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
        path = Path(path)
        hint = "delete it to start a fresh cache"
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise CacheFileError(f"n-gram cache {path} is unreadable or not JSON ({exc}); {hint}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise CacheFileError(f"{path} is not an omnidraft n-gram cache (format {FORMAT} v{VERSION}); {hint}")
        if doc.get("drafter_tokenizer") != drafter_tokenizer or doc.get("target_tokenizer") != target_tokenizer:
            raise CacheFileError(
                f"n-gram cache {path} was built for another drafter/target tokenizer pair; "
                f"use the cache of this pair or {hint}"
            )
        entries = doc.get("entries")
        if not isinstance(entries, list) or doc.get("checksum") != _entries_checksum(entries):
            raise CacheFileError(f"n-gram cache {path} is corrupted (checksum mismatch); {hint}")
        cap = capacity if capacity is not None else doc.get("capacity")
        cache = cls(drafter_tokenizer, target_tokenizer, drafter_width, cap, policy or doc.get("policy", "lfu"))
        try:
            ordered = sorted(entries, key=lambda r: r[4])  # replay in recency order so eviction state matches
            for key, target, seen, hits, last in ordered:
                if not key or not all(0 <= d < drafter_width for d in key) or not 0 <= target < target_width:
                    raise ValueError("id out of range")
                k = tuple(int(d) for d in key)
                cache.observe(k, int(target))
                e = cache._entries.get(k)
                if e is not None:
                    e[1], e[2], e[3] = int(seen), int(hits), int(last)
                    cache._push(k, e)
        except (TypeError, ValueError) as exc:
            raise CacheFileError(f"n-gram cache {path} has a malformed entry ({exc}); {hint}") from None
        cache.clock = max(int(doc.get("clock", 0)), cache.clock)
        return cache
