"""One n-gram cache file shared by several processes keeps every entry; a hostile or foreign file is
refused fast, with bounded memory, and left as it was."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import tracemalloc

import pytest

from omnidraft.errors import CacheFileError
from omnidraft.runtime import ngram_cache_file
from omnidraft.runtime.ngram_cache import NgramCache, entries_checksum
from omnidraft.runtime.ngram_cache_file import open_shared

D, T, W, TW = "d" * 64, "t" * 64, 1000, 2000


def keys_in(path, **kw) -> dict:
    return {k: (t, seen, hits) for k, t, seen, hits in NgramCache.load(path, D, T, W, TW, **kw).items()}


def test_two_writers_opened_before_either_saved_keep_every_entry_with_counts_added(tmp_path):
    path = tmp_path / "c.json"
    base = open_shared(path, D, T, W, TW)
    base.observe((1, 2), 5)
    base.save(path)
    a, b = open_shared(path, D, T, W, TW), open_shared(path, D, T, W, TW)
    a.observe((1, 2), 5)  # both use the shared entry once more
    b.observe((1, 2), 5)
    b.record_hit((1, 2))
    a.observe((3,), 6)
    b.observe((7, 8), 9)
    a.save(path)
    b.save(path)
    assert keys_in(path) == {(1, 2): (5, 3, 1), (3,): (6, 1, 0), (7, 8): (9, 1, 0)}
    assert len(b) == 3  # the later writer now holds the union too
    b.save(path)  # saving again adds nothing twice
    assert keys_in(path)[(1, 2)] == (5, 3, 1)


def test_an_evicted_entry_goes_unless_another_writer_used_it(tmp_path):
    path = tmp_path / "c.json"
    c = open_shared(path, D, T, W, TW, capacity=2)
    c.observe((1,), 1)
    c.observe((2,), 2)
    c.save(path)
    solo = open_shared(path, D, T, W, TW, capacity=2)
    solo.observe((3,), 3)  # evicts one of the two
    solo.save(path)
    assert set(keys_in(path)) == {k for k, *_ in solo.items()} and len(keys_in(path)) == 2
    a, b = open_shared(path, D, T, W, TW, capacity=2), open_shared(path, D, T, W, TW, capacity=2)
    a.observe((4,), 4)
    b.observe((5,), 5)
    a.save(path)
    b.save(path)
    assert len(keys_in(path)) == 2  # the capacity holds after the merge


def _writer(path: str, n: int, rounds: int) -> None:
    for r in range(rounds):
        c = open_shared(path, D, T, W, TW)
        c.observe((n, r), n)
        c.save(path)


def test_many_processes_saving_one_file_at_once_lose_nothing(tmp_path):
    path = tmp_path / "c.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), n, 5)) for n in range(1, 7)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert set(keys_in(path)) == {(n, r) for n in range(1, 7) for r in range(5)}
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_two_concurrent_generate_runs_on_one_cache_keep_every_entry(tmp_path):
    """`omnidraft generate --cache F` twice at once on the bundled pair, both loading F before either
    saves (a barrier holds each run at its save until both decoded): F ends with the entries of both."""
    from omnidraft.bench.bundled import BUNDLED
    from omnidraft.cli import main

    d, t = BUNDLED / "drafter", BUNDLED / "target"
    prompts = [
        "Question: A baker makes 12 cakes and sells 5. How many are left?\nAnswer:",
        "Question: Sam reads 7 pages a day for 3 days. How many pages?\nAnswer:",
    ]

    shared = tmp_path / "shared.json"
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    save = ngram_cache_file.save

    def run(n, prompt):
        def held(cache, path):
            (tmp_path / f"own{n}.json").write_text(json.dumps([list(k) for k, *_ in cache.items()]))
            barrier.wait(120)  # both runs have loaded F (absent) and decoded before either saves
            save(cache, path)

        ngram_cache_file.save = held
        argv = ["generate", "--drafter", str(d), "--target", str(t), "--prompt", prompt, "--max-new-tokens", "32"]
        os._exit(main([*argv, "--json", "--cache", str(shared)]))

    procs = [ctx.Process(target=run, args=item) for item in enumerate(prompts)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    own = [{tuple(k) for k in json.loads((tmp_path / f"own{n}.json").read_text())} for n in range(2)]
    assert all(own) and own[0] != own[1]  # each run found entries, not all the same
    assert keys_of(shared) == own[0] | own[1]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def keys_of(path) -> set:
    return {tuple(e[0]) for e in json.loads(path.read_text())["entries"]}


# -- hostile cache files ----------------------------------------------------------------------------


def _doc(**over):
    entries = over.pop("entries", [[[1, 2], 3, 1, 0, 1]])
    doc = {
        "format": "omnidraft.ngram-cache",
        "version": 1,
        "drafter_tokenizer": D,
        "target_tokenizer": T,
        "capacity": None,
        "policy": "lfu",
        "clock": 1,
        "entries": entries,
        "checksum": entries_checksum(entries) if isinstance(entries, list) else "x",
    }
    doc.update(over)
    return doc


@pytest.mark.parametrize(
    "over, match",
    [
        ({"clock": "x"}, "field 'clock' must be an integer >= 0"),
        ({"clock": -1}, "field 'clock' must be an integer >= 0"),
        ({"capacity": 1.5}, "field 'capacity' must be an integer >= 1"),
        ({"capacity": 0}, "field 'capacity' must be an integer >= 1"),
        ({"policy": "fifo"}, "field 'policy' must be one of lfu, lru"),
        ({"entries": {"a": 1}}, "field 'entries' must be a list"),
        ({"entries": [[[1, 2], 3, 1, 0]]}, "entry 0 is malformed"),
        ({"entries": [[[], 3, 1, 0, 1]]}, "entry 0 is malformed"),
        ({"entries": [[list(range(65)), 3, 1, 0, 1]]}, "entry 0 is malformed"),
        ({"entries": [[[1, W], 3, 1, 0, 1]]}, "entry 0 is malformed"),
        ({"entries": [[[1, 2], TW, 1, 0, 1]]}, "entry 0 is malformed"),
        ({"entries": [[[True, 2], 3, 1, 0, 1]]}, "entry 0 is malformed"),
        ({"entries": [[[1, 2], 3, -1, 0, 1]]}, "entry 0 is malformed"),
        ({"entries": [[[1, 2], 3, 1, 0, 1.5]]}, "entry 0 is malformed"),
        ({"entries": [[[1, 2], 3, 1, 0, 1], "x"]}, "entry 1 is malformed"),
        ({"format": "other"}, "not an omnidraft n-gram cache"),
        ({"target_tokenizer": "u" * 64}, "another drafter/target tokenizer pair"),
        ({"checksum": "0" * 64}, "corrupted \\(checksum mismatch\\)"),
    ],
)
def test_malformed_cache_fields_get_one_line_and_the_file_is_kept(tmp_path, over, match):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_doc(**over)))
    before = path.read_bytes()
    with pytest.raises(CacheFileError, match=match) as info:
        open_shared(path, D, T, W, TW)
    assert "\n" not in str(info.value) and "delete it to start a fresh cache" in str(info.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "text", ["[" * 200_000 + "]" * 200_000, '{"entries": ' + "[" * 50_000 + "]" * 50_000 + "}", "\xff"]
)
def test_deep_or_binary_cache_files_are_refused(tmp_path, text):
    path = tmp_path / "c.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff" else b"\xff\xfe")
    with pytest.raises(CacheFileError):
        open_shared(path, D, T, W, TW)


def _big_cache(path, drafter: str, size: int) -> None:
    """A syntactically valid cache of ``size`` bytes (entries not checked against the checksum)."""
    head = json.dumps(_doc(drafter_tokenizer=drafter, entries=[]))[:-1].split('"entries"')[0] + '"entries":['
    row = "[[11,12,13],14,1,0,1],"
    chunk = row * ((1 << 20) // len(row))
    with open(path, "w") as f:
        f.write(head)
        written = len(head)
        while written < size:
            f.write(chunk)
            written += len(chunk)
        f.write('[[1],2,1,0,1]],"checksum":"0"}')


@pytest.mark.parametrize("pair", ["foreign", "own"])
def test_a_200_mb_cache_is_refused_with_bounded_memory(tmp_path, pair):
    """Refused from its header or its size, never parsed: under 1 MiB allocated for a 200 MiB file.
    (The time it takes is a benchmark figure, printed here, not asserted.)"""
    path = tmp_path / "big.json"
    _big_cache(path, "x" * 64 if pair == "foreign" else D, 200 << 20)
    assert path.stat().st_size >= 200 << 20
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(
            CacheFileError, match="another drafter/target" if pair == "foreign" else "above its 16.0 MiB limit"
        ):
            open_shared(path, D, T, W, TW)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"{pair} 200 MiB cache refused in {seconds * 1e3:.1f} ms, peak {peak / 2**10:.0f} KiB allocated")
    assert peak < 1 << 20


def test_a_cache_that_would_outgrow_the_file_limit_is_not_written(tmp_path, monkeypatch):
    monkeypatch.setattr(ngram_cache_file, "MAX_FILE_BYTES", 200)
    c = NgramCache(D, T, W)
    for i in range(40):
        c.observe((i, i + 1), i)
    with pytest.raises(CacheFileError, match="bound it with --cache-capacity"):
        c.save(tmp_path / "c.json")
    assert not (tmp_path / "c.json").exists()
