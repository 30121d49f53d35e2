"""`omnidraft models`: install assembles a registry model from its chunk packages, checks its digest,
converts it and publishes it whole; names work wherever a model is named; every failure is one line
and leaves what was installed before untouched. The registry is swapped for one whose chunks are
tiny local packages, so nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tiny_models import make_tiny_bpe, make_tiny_model, write_gguf

from omnidraft.cli import main
from omnidraft.models import sources


@pytest.fixture(scope="module")
def chunk_site(tmp_path_factory) -> dict:
    """A tiny GGUF split over two importable 'chunk packages', and its digest."""
    root = tmp_path_factory.mktemp("site")
    model = make_tiny_model(root / "hf", "qwen2", make_tiny_bpe(root / "tok"), seed=4, hidden=32, max_pos=128)
    data = write_gguf(model, root / "tiny.gguf").read_bytes()
    site = root / "site"
    half = len(data) // 2
    for i, part in enumerate((data[:half], data[half:])):
        pkg = site / f"omnidraft_test_chunk{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / "part.bin").write_bytes(part)
    return {"site": site, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _registry(chunk_site: dict, path: Path, sha256: str | None = None, module: str = "omnidraft_test_chunk") -> Path:
    entry = {
        "title": "tiny test model",
        "licence": "test licence line",
        "architecture": "qwen2",
        "file": "tiny.gguf",
        "bytes": chunk_site["bytes"],
        "sha256": sha256 or chunk_site["sha256"],
        "streams": ["code"],
        "chunks": [
            {"package": f"{module.replace('_', '-')}{i}", "version": "1.0", "path": f"{module}{i}/data/part.bin"}
            for i in range(2)
        ],
    }
    path.write_text(json.dumps({"tiny-test": entry}))
    return path


@pytest.fixture
def env(chunk_site, tmp_path, monkeypatch) -> dict:
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(chunk_site["site"]))
    monkeypatch.setattr(sources, "REGISTRY_FILE", _registry(chunk_site, tmp_path / "registry.json"))
    return {"tmp": tmp_path, "cache": tmp_path / "cache"}


def _one_line_error(argv: list[str], capsys) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 1 and "Traceback" not in err, err
    return err


def test_install_publishes_a_complete_folder_and_names_resolve(env, capsys):
    assert main(["models", "install", "tiny-test", "--no-progress"]) == 0
    out = capsys.readouterr()
    folder = Path(out.out.strip())
    assert folder == env["cache"] / "models" / "tiny-test"
    assert "licence: test licence line" in out.err
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tiny.gguf", sources.SOURCE_FILE} <= names
    assert [p.name for p in folder.parent.iterdir()] == ["tiny-test"]  # no staging left behind
    assert main(["models", "list"]) == 0
    assert str(folder) in capsys.readouterr().out
    assert sources.resolve("tiny-test") == folder
    argv = ["generate", "--target", "tiny-test", "--prompt", "def f", "--mode", "target-only", "--json"]
    assert main([*argv, "--max-new-tokens", "4"]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 4
    stamp = (folder / sources.SOURCE_FILE).stat().st_mtime_ns
    assert main(["models", "install", "tiny-test", "--no-progress"]) == 0
    assert "already installed" in capsys.readouterr().err
    assert (folder / sources.SOURCE_FILE).stat().st_mtime_ns == stamp


def test_a_digest_mismatch_installs_nothing_and_keeps_the_old_install(env, chunk_site, monkeypatch, capsys):
    assert main(["models", "install", "tiny-test", "--no-progress"]) == 0
    folder = Path(capsys.readouterr().out.strip())
    before = (folder / "model.safetensors").read_bytes()
    monkeypatch.setattr(sources, "REGISTRY_FILE", _registry(chunk_site, env["tmp"] / "bad.json", sha256="0" * 64))
    err = _one_line_error(["models", "install", "tiny-test", "--force", "--no-progress"], capsys)
    assert "sha256" in err and "nothing was installed" in err
    assert (folder / "model.safetensors").read_bytes() == before
    assert [p.name for p in folder.parent.iterdir()] == ["tiny-test"]


def test_no_network_is_one_line_and_leaves_nothing(env, chunk_site, monkeypatch, capsys):
    absent = "omnidraft_absent_chunk"  # not importable: install must fetch it with pip
    monkeypatch.setattr(sources, "REGISTRY_FILE", _registry(chunk_site, env["tmp"] / "net.json", module=absent))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(env["tmp"]))
    err = _one_line_error(["models", "install", "tiny-test", "--no-progress"], capsys)
    assert "could not download omnidraft-absent-chunk0==1.0" in err
    assert list((env["cache"] / "models").iterdir()) == []


def test_unknown_and_uninstalled_names_say_what_to_run(env, capsys):
    assert "known models: tiny-test" in _one_line_error(["models", "install", "no-such-model"], capsys)
    err = _one_line_error(["generate", "--target", "tiny-test", "--prompt", "x", "--mode", "target-only"], capsys)
    assert "omnidraft models install tiny-test" in err
    err = _one_line_error(["generate", "--target", "not-a-model", "--prompt", "x", "--mode", "target-only"], capsys)
    assert "neither a folder nor a known model name" in err


def test_a_full_disk_is_refused_before_anything_is_fetched(env, monkeypatch, capsys):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(1 << 30, 1 << 30, 4096))
    assert "GiB is free" in _one_line_error(["models", "install", "tiny-test"], capsys)
    assert list((env["cache"] / "models").iterdir()) == []
