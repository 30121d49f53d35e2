"""kill -9 at every publishing step of export, adapt and cache save loses nothing, and the next run
removes what the killed one left behind.

Each case forks a child that sets ``OMNIDRAFT_CRASH_AT`` (omnidraft.atomic.crash_point) and runs the
real publishing code, which SIGKILLs itself at that step: no exception handler or ``finally`` runs,
as with a power cut or the OOM killer. The parent then checks what a reader finds.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
from crash import hidden, killed_at
from tiny_models import make_tiny_model

from omnidraft import atomic
from omnidraft.runtime.manifest import load_manifest
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.ngram_cache_file import open_shared

D, T, W, TW = "d" * 64, "t" * 64, 100, 200


# -- the n-gram cache file ---------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["cache:merged", "file:written", "file:replaced"])
def test_cache_save_killed_at_any_step_keeps_a_whole_file(tmp_path, step):
    path = tmp_path / "c.json"
    first = open_shared(path, D, T, W, TW)
    first.observe((1, 2), 7)
    first.save(path)
    before = path.read_bytes()
    second = open_shared(path, D, T, W, TW)
    second.observe((3, 4), 8)
    killed_at(step, lambda: second.save(path))
    keys = {k for k, *_ in NgramCache.load(path, D, T, W, TW).items()}  # a whole, valid file
    assert keys == ({(1, 2), (3, 4)} if step == "file:replaced" else {(1, 2)})
    assert (path.read_bytes() == before) == (step != "file:replaced")
    if step == "file:written":
        assert hidden(tmp_path), "the killed writer's temporary file is the leftover to clean"
    third = open_shared(path, D, T, W, TW)
    third.observe((5, 6), 9)
    third.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]
    assert {k for k, *_ in NgramCache.load(path, D, T, W, TW).items()} == keys | {(5, 6)}


def test_a_live_writers_temp_file_is_never_taken_for_a_leftover(tmp_path):
    path = tmp_path / "c.json"
    with atomic.atomic_path(path) as tmp:
        tmp.write_bytes(b"{}")
        assert atomic.remove_stale(tmp_path, ".c.json.*.tmp") == []  # locked by this (live) writer
    assert path.read_bytes() == b"{}" and hidden(tmp_path) == []


# -- export publishing ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_export(tiny_export):
    return tiny_export


EXPORT_STEPS = ["export:copied", "export:manifest", "dir:staged", "dir:exchanged", "dir:published"]


@pytest.mark.parametrize(
    "step, exchange",
    [(s, True) for s in EXPORT_STEPS] + [(s, False) for s in ("dir:staged", "dir:moved-aside", "dir:published")],
)
def test_export_publish_killed_at_any_step_keeps_a_good_export(good_export, tmp_path, monkeypatch, step, exchange):
    """Into a folder holding a good export, as `omnidraft export --out` does; ``exchange`` False is a
    filesystem without renameat2 (two renames, a stranded .prev moved back by the next reader)."""
    from omnidraft.export import publish

    model, good = good_export
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    shutil.copytree(good, out)
    old = load_manifest(out)
    new = replace(old, export_command="the new export")

    def export_again():
        publish.check_out_dir(out, model)
        stage = publish.staging(out)
        shutil.copyfile(good / old.artifact_file, stage.path / old.artifact_file)
        publish.publish(stage, model, new)
        stage.close()

    killed_at(step, export_again)
    swapped = step in ("dir:exchanged", "dir:published")
    assert load_manifest(out).export_command == (new if swapped else old).export_command  # whole: hashes verified
    export_again()  # the next export clears what the killed one left
    assert load_manifest(out).export_command == new.export_command
    assert hidden(tmp_path) == [] and hidden(out) == []


def test_a_real_export_killed_mid_swap_keeps_the_previous_one(good_export, tmp_path):
    from omnidraft.cli import main

    model, good = good_export
    out = tmp_path / "out"
    shutil.copytree(good, out)
    (out / ".export-old1234").mkdir()  # the staging folder older versions left inside --out
    argv = ["export", "--model", str(model), "--format", "onnx", "--onnx-path", "torch", "--max-seq-len", "64"]
    argv += ["--out", str(out), "--no-progress"]
    killed_at("dir:staged", lambda: main(argv))
    assert load_manifest(out).artifact_sha256 == load_manifest(good).artifact_sha256
    assert any(n.startswith(".out.export-") for n in hidden(tmp_path))
    assert main(argv) == 0
    assert hidden(tmp_path) == [] and hidden(out) == []
    load_manifest(out)


def test_export_refuses_the_model_folder_and_foreign_folders_before_work(good_export, tmp_path, capsys):
    from omnidraft.cli import main

    model, _ = good_export
    before = sorted(p.name for p in model.iterdir())
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    for out, needle in (
        (model, "is the model folder itself"),
        (model.parent, "a folder holding the model"),
        (other, "not part of an export (todo.txt)"),
    ):
        argv = ["export", "--model", str(model), "--format", "onnx", "--onnx-path", "torch", "--max-seq-len", "64"]
        assert main([*argv, "--out", str(out)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert sorted(p.name for p in model.iterdir()) == before and (other / "todo.txt").read_text() == "mine"


# -- adaptation state --------------------------------------------------------------------------------

ADAPT_STEPS = [
    "cache:merged",
    "file:written",  # the cache file
    "file:replaced",
    "dir:staged",  # the adapter folder
    "dir:exchanged",
    "dir:published",
    "file:written#2",  # the acceptance head, written into the merged drafter's staging folder
    "dir:staged#2",  # the merged drafter (with its head)
    "dir:exchanged#2",
    "dir:published#2",
]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, tokenizer_path):
    from omnidraft.adapt.config import AdaptConfig, HeadTraining, PublishPolicy, StreamDecoding, UpdateSchedule
    from omnidraft.adapt.online import OnlineAdapter

    root = tmp_path_factory.mktemp("crash-adapt")
    d = make_tiny_model(root / "d", "llama", tokenizer_path("llama-spm"), seed=1)
    t = make_tiny_model(root / "t", "qwen2", tokenizer_path("gpt-2"), seed=2)
    cfg = AdaptConfig(
        schedule=UpdateSchedule(every=2, engine="eager", lr=3e-2, rank=4),
        decoding=StreamDecoding(max_new_tokens=8),
        head=HeadTraining(train=True),
        publish=PublishPolicy(every=1),
    )
    ad = OnlineAdapter(d, t, root / "state", cfg)
    ad.run(["def add(a, b):\n    return", "The quick brown fox jumps over"])
    return ad


def _state(ad) -> dict:
    """What a later run reads from the state folder; raises if any part is damaged or mismatched."""
    from omnidraft.adapt import delta
    from omnidraft.runtime.draft_length.head_file import check_belongs, drafter_identity, read_head
    from omnidraft.runtime.loader import check_hf_folder
    from omnidraft.runtime.model_checks import check_weights

    cache = NgramCache.load(
        ad.cache_path,
        ad.decoder.drafter.codec.sha256,
        ad.decoder.target.codec.sha256,
        ad.decoder.drafter.backend.vocab_size,
        ad.decoder.target.backend.vocab_size,
    )
    _, meta = delta.read_adapter(ad.dir / "adapter", ad.ident)
    drafter = ad.dir / "drafter"
    check_hf_folder(drafter)
    check_weights(drafter)
    check_belongs(read_head(drafter), drafter_identity(drafter), "the merged drafter")
    merged = json.loads((drafter / delta.SIDECAR).read_text())["info"]["updates"]
    return {"cache": len(cache), "adapter": json.loads(meta["info"])["updates"], "drafter": merged}


@pytest.mark.parametrize("step", ADAPT_STEPS)
def test_adapt_publish_killed_at_any_step_keeps_a_consistent_state(adapter, step):
    ad = adapter
    ad._write(ad.trainer.snapshot())
    before = _state(ad)
    ad.updates += 1
    ad.decoder.cache.observe((7, 8, 100 + ADAPT_STEPS.index(step)), 11)
    killed_at(step, lambda: ad._write(ad.trainer.snapshot()))
    after = _state(ad)  # every part whole, the head matching the drafter it sits beside
    for part in ("adapter", "drafter"):
        assert after[part] in (before[part], ad.updates)
    assert after["cache"] in (before["cache"], before["cache"] + 1)
    ad._write(ad.trainer.snapshot())  # the next publish clears the leftovers
    assert _state(ad) == {"cache": before["cache"] + 1, "adapter": ad.updates, "drafter": ad.updates}
    assert hidden(ad.dir) == [] and hidden(ad.dir / "drafter") == []
