"""`omnidraft cache list | prune`: the export cache is listed with sizes and trimmed by age or count,
never removing an export being built."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from omnidraft import atomic
from omnidraft.bench import bundled, export_cache
from omnidraft.cli import main

DAY = 86400


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path))
    root = tmp_path / "exports"

    def add(name: str, size: int, age_days: float):
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text("{}")
        (folder / "model.onnx").write_bytes(b"x" * size)
        t = time.time() - age_days * DAY
        os.utime(folder, (t, t))
        return folder

    return root, add


def run(capsys, *argv):
    code = main(["cache", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_shows_each_export_by_last_use_with_sizes_and_the_total(cache, capsys):
    root, add = cache
    add("aaaa/onnx-int8-512-r5", 3 << 20, 30)
    add("bbbb/onnx-int8-512-r5", 1 << 20, 1)
    code, out, _ = run(capsys, "list")
    lines = out.splitlines()
    assert code == 0 and "bbbb/onnx-int8-512-r5" in lines[0] and "aaaa/onnx-int8-512-r5" in lines[1]
    assert "3.0 MiB" in lines[1] and "used    30.0 d ago" in lines[1]
    assert lines[-1] == f"2 cached exports, 4.0 MiB in {root}"
    code, out, _ = run(capsys, "list", "--json")
    doc = json.loads(out)
    assert doc["total_bytes"] == sum(e["bytes"] for e in doc["exports"]) > 4 << 20


def test_prune_by_age_and_by_count(cache, capsys):
    root, add = cache
    old = add("aaaa/onnx-int8-512-r5", 100, 30)
    mid = add("bbbb/onnx-int8-512-r5", 100, 5)
    new = add("bbbb/onnx-fp32-512-r5", 100, 0.1)
    code, out, _ = run(capsys, "prune", "--older-than", "10d", "--dry-run")
    assert code == 0 and "would remove aaaa/onnx-int8-512-r5" in out and old.is_dir()
    code, out, _ = run(capsys, "prune", "--older-than", "240h")
    assert code == 0 and not old.exists() and not old.parent.exists() and mid.is_dir() and new.is_dir()
    code, out, _ = run(capsys, "prune", "--keep", "1", "--json")
    doc = json.loads(out)
    assert [e["path"] for e in doc["kept"]] == [str(new)] and not mid.exists() and new.is_dir()
    assert sorted(os.listdir(root)) == ["bbbb"] and os.listdir(root / "bbbb") == ["onnx-fp32-512-r5"]


def test_prune_removes_dead_staging_but_never_an_export_being_built(cache, capsys):
    root, add = cache
    gone = add("aaaa/onnx-int8-512-r5", 100, 30)
    (root / "aaaa" / ".onnx-int8-512-r5.export-dead").mkdir()  # its exporter was killed
    with atomic.Staging(root / "aaaa" / "onnx-fp32-512-r5", tag="export") as live:
        code, _, _ = run(capsys, "prune", "--keep", "0")
        assert code == 0 and not gone.exists() and live.path.is_dir()
        assert [p.name for p in (root / "aaaa").iterdir()] == [live.path.name]


def test_a_reused_export_counts_as_used(tiny_export, cache):
    model, export = tiny_export
    root, _ = cache
    out = root / bundled._folder_digest(model) / f"onnx-fp32-64-r{bundled.EXPORT_REVISION}"
    shutil.copytree(export, out)
    os.utime(out, (time.time() - 30 * DAY,) * 2)
    assert bundled.cached_export(model, "onnx", "fp32", 64, progress=False) == out
    assert time.time() - out.stat().st_mtime < 60
    assert [e.path for e in export_cache.entries()] == [out]


@pytest.mark.parametrize(
    "argv, needle",
    [
        ((), "say what to do: omnidraft cache list"),
        (("prune",), "cache prune needs --older-than AGE and/or --keep N"),
        (("prune", "--keep", "-1"), "--keep must be >= 0"),
        (("prune", "--older-than", "soon"), "--older-than takes an age like 30d, 12h or 90m"),
    ],
)
def test_bad_cache_commands_get_one_line(cache, capsys, argv, needle):
    code, _, err = run(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and needle in lines[0]
