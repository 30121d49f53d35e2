"""The hostile-input battery through the CLI: each case gets one line naming the problem and the fix,
a non-zero exit, no traceback; no special file is touched and nothing already saved is lost.

Numbers refer to the defects the battery was written against (careless or hostile use on tiny
models and the bundled pair): special files as outputs, truncated weights, tokenizer/model
mismatches, unwritable caches, non-finite options, undecodable text, deep JSON, forged manifests
and cache fields, late output checks.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from crash import hidden, killed_at
from tiny_models import make_tiny_model

from omnidraft import atomic
from omnidraft.cli import main


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def refused(capsys, needle: str, *argv) -> str:
    """Run the CLI; it must fail with exactly one error line containing ``needle``. Returns stdout."""
    code, out, err = cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("omnidraft "), err
    assert needle in lines[0], lines[0]
    return out


def gen(pair, *extra):
    d, t = pair
    return ("generate", "--drafter", d, "--target", t, "--prompt", "def f(x):", "--max-new-tokens", 6, *extra)


def spoiled(src: Path, dst: Path, how) -> Path:
    shutil.copytree(src, dst)
    how(dst)
    return dst


# -- 1. special files are never replaced -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "char-device", "folder", "symlink-to-dev-null"])
def test_cache_option_never_replaces_a_special_file(tiny_pair, tmp_path, capsys, kind):
    path = tmp_path / "x"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "char-device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("creating a device node needs root")
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/null")
    before = os.stat(path)
    refused(capsys, "not a regular file", *gen(tiny_pair, "--cache", path))
    after = os.stat(path)
    assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)
    assert path.is_symlink() == (kind == "symlink-to-dev-null") and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_atomic_writes_refuse_special_destinations(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for dest in (fifo, tmp_path):
        with pytest.raises(atomic.OutputError, match="not a regular file: omnidraft never replaces one"):
            atomic.write_text(dest, "x")
    link = tmp_path / "link"
    real = tmp_path / "real.json"
    real.write_text("old")
    link.symlink_to(real)
    atomic.write_text(link, "new")  # a link to a regular file is written through, and stays a link
    assert link.is_symlink() and real.read_text() == "new"


# -- 4. truncated weights ------------------------------------------------------------------------------


def _truncate(folder: Path) -> None:
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


@pytest.mark.parametrize("role", ["drafter", "target", "export input", "adapt drafter"])
def test_truncated_weights_get_one_line(tiny_pair, tmp_path, capsys, role):
    d, t = tiny_pair
    bad = spoiled(d if role != "target" else t, tmp_path / "bad", _truncate)
    stream = tmp_path / "s.jsonl"
    stream.write_text('{"prompt": "def f(x):"}\n')
    argv = {
        "drafter": gen((bad, t)),
        "target": ("generate", "--target", bad, "--mode", "target-only", "--prompt", "x", "--max-new-tokens", 2),
        "export input": ("export", "--model", bad, "--format", "onnx", "--max-seq-len", 64, "--out", tmp_path / "e"),
        "adapt drafter": ("adapt", "--drafter", bad, "--target", t, "--stream", stream, "--out", tmp_path / "o"),
    }[role]
    refused(capsys, "is truncated: its header describes", *argv)


# -- 5. tokenizer vs model vocabulary -------------------------------------------------------------------


def test_a_tokenizer_of_another_model_is_refused_and_padded_embeddings_work(
    tiny_pair, tmp_path, capsys, tokenizer_path
):
    d, t = tiny_pair
    small = spoiled(t, tmp_path / "t32k", lambda f: shutil.copy(tokenizer_path("llama-spm") / "tokenizer.json", f))
    refused(
        capsys,
        "ids 32000..50256 would vanish from the text",
        "generate",
        "--target",
        small,
        "--mode",
        "target-only",
        "--prompt",
        "x",
    )
    big = spoiled(d, tmp_path / "d50k", lambda f: shutil.copy(tokenizer_path("gpt-2") / "tokenizer.json", f))
    refused(capsys, "has 50257 tokens but", *gen((big, t)))
    padded = make_tiny_model(tmp_path / "padded", "qwen2", tokenizer_path("gpt-2"), seed=2, max_pos=128, pad_rows=271)
    code, out, err = cli(capsys, *gen((d, padded), "--json"))
    assert code == 0 and json.loads(out)["new_tokens"] == 6, err


# -- 6. an unwritable cache: refused before decoding, or the result printed before the error ----------


def test_a_cache_folder_or_read_only_location_is_refused_before_decoding(tiny_pair, tmp_path, capsys, monkeypatch):
    out = refused(capsys, "is a folder, not a regular file", *gen(tiny_pair, "--json", "--cache", tmp_path))
    assert out == ""

    def read_only(*a, **k):
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    out = refused(
        capsys,
        "(Read-only file system); pick a writable location",
        *gen(tiny_pair, "--json", "--cache", tmp_path / "c.json"),
    )
    assert out == ""


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_really_read_only_cache_folder_is_refused_before_decoding(tiny_pair, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        refused(capsys, "pick a writable location", *gen(tiny_pair, "--json", "--cache", ro / "c.json"))
    finally:
        ro.chmod(0o700)


def test_a_full_disk_at_save_still_prints_the_result_and_keeps_the_previous_cache(
    tiny_pair, tmp_path, capsys, monkeypatch
):
    cache = tmp_path / "c.json"
    code, _, err = cli(capsys, *gen(tiny_pair, "--json", "--cache", cache))
    assert code == 0, err
    before = cache.read_bytes()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    out = refused(
        capsys, "(No space left on device); free some disk space", *gen(tiny_pair, "--json", "--cache", cache)
    )
    assert json.loads(out)["new_tokens"] == 6  # the run's result came first
    assert cache.read_bytes() == before and hidden(tmp_path) == []


def test_a_kill_during_the_cache_write_leaves_a_temp_file_the_next_run_removes(tiny_pair, tmp_path, capsys):
    cache = tmp_path / "c.json"
    killed_at("file:written", lambda: main([str(a) for a in gen(tiny_pair, "--cache", cache)]))
    assert not cache.exists() and hidden(tmp_path)
    code, _, err = cli(capsys, *gen(tiny_pair, "--cache", cache))
    assert code == 0 and hidden(tmp_path) == [] and cache.is_file(), err


# -- 7. non-finite and out-of-range numbers -----------------------------------------------------------


@pytest.mark.parametrize(
    "extra, needle",
    [
        (("--temperature", "nan"), "temperature must be >= 0 and finite"),
        (("--temperature", "inf"), "temperature must be >= 0 and finite"),
        (("--seed", "-1"), "seed must be an integer >= 0"),
        (("--gamma", "nan", "--draft-len", "auto"), "--gamma must be within (0, 1)"),
        (("--ngram-sampling", "approx"), "unknown n-gram sampling rule 'approx'; choose one of exact, paper"),
    ],
)
def test_generate_refuses_bad_numbers_in_one_line(tiny_pair, capsys, extra, needle):
    refused(capsys, needle, *gen(tiny_pair, *extra))


@pytest.mark.parametrize(
    "extra, needle",
    [
        (("--seed", "-1"), "--seed must be an integer >= 0"),
        (("--guard-margin", "nan"), "--guard-margin must be a finite number"),
        (("--lr", "inf"), "--lr must be a finite number"),
        (("--distill-temperature", "nan"), "--distill-temperature must be a finite number"),
        (("--lora-rank", "0"), "--lora-rank must be >= 1"),
    ],
)
def test_adapt_refuses_bad_numbers_before_reading_anything(tiny_pair, tmp_path, capsys, extra, needle):
    d, t = tiny_pair
    refused(capsys, needle, "adapt", "--drafter", d, "--target", t, "--stream", "code", "--out", tmp_path / "o", *extra)
    assert not (tmp_path / "o").exists()


# -- 8. undecodable text and deep JSON -------------------------------------------------------------------


def test_an_undecodable_prompt_gets_one_line(tiny_pair, capsys):
    d, t = tiny_pair
    # What Python makes of argv bytes b"\xff\xfe" (PEP 383 surrogate escapes).
    argv = ("generate", "--drafter", d, "--target", t, "--prompt", b"\xff\xfe".decode("utf-8", "surrogateescape"))
    refused(capsys, "the prompt is not valid UTF-8 text (byte 0xff at character 0 is not UTF-8)", *argv)


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"\xff\xfe\x00binary", "is not UTF-8 text (byte 0xff at offset 0)"),
        (b'{"prompt": "\\ud800"}\n', "lone surrogate U+D800"),
        (b'{"prompt": "ok"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 2 nests JSON"),
        (b'{"prompt": ' + b"[" * 50 + b"]" * 50 + b"}\n", "line 1 nests JSON deeper than"),
        (b'{"prompt": "x", "id": [1]}\n', "field 'id' must be a string or an integer"),
    ],
)
def test_hostile_stream_files_get_one_line(tiny_pair, tmp_path, capsys, content, needle):
    d, t = tiny_pair
    stream = tmp_path / "s.jsonl"
    stream.write_bytes(content)
    refused(capsys, needle, "streams", "--file", stream)
    refused(capsys, needle, "adapt", "--drafter", d, "--target", t, "--stream", stream, "--out", tmp_path / "o")


def test_deeply_nested_manifest_and_cache_get_one_line(tiny_export, tiny_pair, tmp_path, capsys):
    _, export = tiny_export
    deep = spoiled(export, tmp_path / "e", lambda f: (f / "manifest.json").write_text("[" * 100_000 + "]" * 100_000))
    refused(capsys, "nests JSON too deeply", "generate", "--target", deep, "--mode", "target-only", "--prompt", "x")
    cache = tmp_path / "c.json"
    cache.write_text("[" * 100_000 + "]" * 100_000)
    refused(capsys, "nests JSON too deeply", *gen(tiny_pair, "--cache", cache))


# -- 9. forged manifests -----------------------------------------------------------------------------------

FORGED = [
    ({"inputs": 5}, "field 'inputs' must be a list"),
    ({"outputs": {"logits": 1}}, "field 'outputs' must be a list"),
    ({"parity": []}, "field 'parity' must be a JSON object"),
    ({"parity": {"batch_invariance": "x"}}, "field 'parity.batch_invariance' must be a JSON object"),
    ({"parity": {"batch_invariance": {"row_stable": "yes"}}}, "field 'parity.batch_invariance.row_stable'"),
    (
        {"pad_single_row": True, "parity": {"batch_invariance": {"row_stable": True, "single_row_padded": False}}},
        "field 'pad_single_row' must be what its row stability was measured with",
    ),
    ({"pad_single_row": "yes"}, "field 'pad_single_row' must be true or false"),
    ({"row_splits": [9, 5]}, "field 'row_splits' must be increasing positions below max_seq_len"),
    ({"row_splits": [10_000]}, "field 'row_splits' must be increasing positions below max_seq_len"),
    ({"row_splits": [0]}, "field 'row_splits' must be a list of integers"),
    (
        {"row_splits": [5], "parity": {"batch_invariance": {"row_stable": True, "row_splits": []}}},
        "field 'row_splits' must be the splits its row stability was measured with",
    ),
    ({"draft_vocab": "x"}, "field 'draft_vocab' must be a JSON object"),
    ({"draft_vocab": {"size": 5, "kept": [1]}}, "field 'draft_vocab.kept' must be a list of 5 token ids"),
    ({"vocab_size": "x"}, "field 'vocab_size' must be an integer in"),
    ({"vocab_size": 0}, "field 'vocab_size' must be an integer in"),
    ({"vocab_size": 37_000}, "ids 32000..36999 would vanish from the text"),
    ({"vocab_size": 16_000}, "has 32000 tokens but"),
    ({"vocab_size": 32_100}, "says vocab_size 32100 but the graph returns 32000 logits a row"),
    ({"eos_token_ids": [10**9]}, "field 'eos_token_ids' must be a list of integers in [0, 31999]"),
    ({"eos_token_ids": "2"}, "field 'eos_token_ids' must be a list"),
    ({"bos_token_id": -1}, "field 'bos_token_id' must be an integer in [0, 31999]"),
    ({"artifact_file": "../model.onnx"}, "field 'artifact_file' must be a file name inside the folder"),
    ({"tokenizer_file": "/etc/passwd"}, "field 'tokenizer_file' must be a file name inside the folder"),
    ({"artifact_sha256": "xyz"}, "field 'artifact_sha256' must be a sha256 digest"),
    ({"exporter_versions": []}, "field 'exporter_versions' must be a JSON object"),
    ({"exporter_versions": {"torch": 2}}, "field 'exporter_versions.torch' must be a version string"),
    ({"max_seq_len": 1.5}, "field 'max_seq_len' must be an integer in"),
    ({"num_layers": -1}, "field 'num_layers' must be an integer in"),
    ({"head_dim": True}, "field 'head_dim' must be an integer in"),
    ({"skipped_layers": "x"}, "field 'skipped_layers' must be a list"),
    ({"accept_head": []}, "field 'accept_head' must be a JSON object"),
    ({"format": "tflite"}, "field 'format' must be one of onnx, executorch"),
    ({"schema_version": "1"}, "field 'schema_version' must be an integer"),
]


@pytest.mark.parametrize("over, needle", FORGED, ids=[next(iter(o)) + f"-{n}" for n, (o, _) in enumerate(FORGED)])
def test_forged_manifest_fields_get_one_line(tiny_export, tmp_path, capsys, over, needle):
    _, export = tiny_export

    def forge(folder: Path) -> None:
        doc = json.loads((folder / "manifest.json").read_text())
        doc.update(over)
        (folder / "manifest.json").write_text(json.dumps(doc))

    forged = spoiled(export, tmp_path / "e", forge)
    refused(
        capsys, needle, "generate", "--target", forged, "--mode", "target-only", "--prompt", "x", "--max-new-tokens", 2
    )


def test_a_manifest_that_is_not_an_object_gets_one_line(tiny_export, tmp_path, capsys):
    _, export = tiny_export
    forged = spoiled(export, tmp_path / "e", lambda f: (f / "manifest.json").write_text("[1, 2]"))
    refused(
        capsys,
        "must be a JSON object (got list)",
        "generate",
        "--target",
        forged,
        "--mode",
        "target-only",
        "--prompt",
        "x",
    )


# -- 10. cache fields through the CLI --------------------------------------------------------------------


def test_a_fractional_cache_capacity_is_refused_and_the_file_kept(tiny_pair, tmp_path, capsys):
    cache = tmp_path / "c.json"
    assert cli(capsys, *gen(tiny_pair, "--cache", cache))[0] == 0
    doc = json.loads(cache.read_text())
    doc["capacity"] = 1.5
    cache.write_text(json.dumps(doc))
    before = cache.read_bytes()
    refused(capsys, "field 'capacity' must be an integer >= 1 (got 1.5)", *gen(tiny_pair, "--cache", cache))
    assert cache.read_bytes() == before


# -- 11. output folders checked before the work --------------------------------------------------------------


def test_adapt_refuses_an_unwritable_out_before_the_work(tiny_pair, tmp_path, capsys, monkeypatch):
    d, t = tiny_pair
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = ("adapt", "--drafter", d, "--target", t, "--stream", "code")
    refused(capsys, "exists and is not a folder", *argv, "--out", blocker)

    def read_only(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    refused(capsys, "cannot write", *argv, "--out", tmp_path / "o")
