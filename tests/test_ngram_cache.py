"""N-gram cache: bounded size, LFU/LRU eviction, atomic save, refusal of foreign or damaged files."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnidraft.errors import CacheFileError, InvalidArgument, OutputError
from omnidraft.runtime.ngram_cache import NgramCache

W = 100  # drafter width
T = 200  # target width


def make(capacity=None, policy="lfu"):
    return NgramCache("d" * 64, "t" * 64, W, capacity, policy)


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(1, 8),
    ops=st.lists(
        st.tuples(st.lists(st.integers(0, W - 1), min_size=1, max_size=3), st.integers(0, T - 1), st.booleans()),
        max_size=80,
    ),
)
def test_capacity_is_never_exceeded_and_refs_stay_consistent(cap, ops):
    c = make(cap)
    for key, t, hit in ops:
        c.observe(tuple(key), t)
        if hit:
            c.record_hit(tuple(key))
        assert len(c) <= cap
    used = {d for k, *_ in c.items() for d in k}
    assert set(c.drafter_tokens.nonzero()[0].tolist()) == used


def test_lfu_evicts_the_least_used_and_lru_the_oldest():
    lfu, lru = make(2, "lfu"), make(2, "lru")
    for c in (lfu, lru):
        c.observe((1, 2), 10)
        c.observe((1, 2), 10)  # seen twice, but old
        c.observe((3, 4), 11)  # seen once, recent
        c.observe((5, 6), 12)  # forces an eviction
    assert (1, 2) in lfu and (3, 4) not in lfu
    assert (1, 2) not in lru and (3, 4) in lru


def test_save_load_round_trip(tmp_path):
    c = make()
    c.observe((1, 2, 3), 7)
    c.observe((4,), 8)
    c.record_hit((1, 2, 3))
    c.save(tmp_path / "c.json")
    d = NgramCache.load(tmp_path / "c.json", "d" * 64, "t" * 64, W, T)
    assert sorted(d.items()) == sorted(c.items())
    assert d.max_len == 3


def test_foreign_and_corrupted_files_are_refused(tmp_path):
    c = make()
    c.observe((1, 2), 7)
    path = tmp_path / "c.json"
    c.save(path)
    with pytest.raises(CacheFileError, match="another drafter/target"):
        NgramCache.load(path, "x" * 64, "t" * 64, W, T)
    doc = json.loads(path.read_text())
    doc["entries"][0][1] = 9  # tampered value: checksum no longer matches
    path.write_text(json.dumps(doc))
    with pytest.raises(CacheFileError, match="corrupted"):
        NgramCache.load(path, "d" * 64, "t" * 64, W, T)
    path.write_bytes(b'{"format": "omnidraft.ngram')  # truncated
    with pytest.raises(CacheFileError, match="not valid JSON"):
        NgramCache.load(path, "d" * 64, "t" * 64, W, T)
    bad = make()
    bad._entries[(W + 5,)] = [1, 1, 0, 1]  # id outside this drafter's vocabulary
    bad.save(path)
    with pytest.raises(CacheFileError, match="malformed"):
        NgramCache.load(path, "d" * 64, "t" * 64, W, T)


def test_a_crash_during_save_keeps_the_previous_file(tmp_path, monkeypatch):
    c = make()
    c.observe((1, 2), 7)
    path = tmp_path / "c.json"
    c.save(path)
    before = path.read_bytes()
    c.observe((3, 4), 8)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OutputError, match="disk full"):
        c.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]  # no temp file left behind


def test_bad_capacity_and_policy():
    with pytest.raises(InvalidArgument):
        make(0)
    with pytest.raises(InvalidArgument):
        make(4, "fifo")
