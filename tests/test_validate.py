"""omnidraft.validate: what is read from disk is bounded, depth-safe and typed, with one-line errors."""

from __future__ import annotations

import json
import os

import pytest

from omnidraft.errors import DataError, ManifestError, ModelFolderError, TokenizerError
from omnidraft.validate import (
    Fields,
    check_safetensors,
    check_text,
    check_vocab_fits,
    iter_lines,
    parse_json,
    read_bytes,
    read_json,
)

FIX = "fix it like this"


def test_special_and_oversized_files_are_refused_before_reading(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it would block forever
    with pytest.raises(DataError, match="FIFO"):
        read_bytes(fifo, error=DataError, what="x", fix=FIX)
    with pytest.raises(DataError, match="folder"):
        read_bytes(tmp_path, error=DataError, what="x", fix=FIX)
    with pytest.raises(DataError, match="does not exist"):
        read_bytes(tmp_path / "nope", error=DataError, what="x", fix=FIX)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(DataError, match="above its 1024 bytes limit; fix it"):
        read_bytes(big, error=DataError, what="x", fix=FIX, limit=1024)


@pytest.mark.parametrize(
    "text, match",
    [
        ("[" * 100_000 + "]" * 100_000, "nests JSON too deeply"),
        ("[" * 40 + "]" * 40, "deeper than 32 levels"),
        ('{"a": NaN}', "NaN is not a JSON number"),
        ('{"a": Infinity}', "Infinity is not a JSON number"),
        ('{"a": "\\ud800"}', "lone surrogate U\\+D800"),
        ('{"\\udcff": 1}', "a key in"),
        ("1" * 5000, "not valid JSON"),
        ("{", "not valid JSON"),
    ],
)
def test_hostile_json_gets_one_typed_error(text, match):
    with pytest.raises(ManifestError, match=match) as info:
        parse_json(text, error=ManifestError, where="m.json", fix=FIX)
    assert "\n" not in str(info.value) and str(info.value).endswith(FIX)


def test_binary_bytes_are_named_with_their_offset(tmp_path):
    p = tmp_path / "b.json"
    p.write_bytes(b'{"a": "\xff\xfe"}')
    with pytest.raises(ManifestError, match="not UTF-8 text \\(byte 0xff at offset 7\\)"):
        read_json(p, error=ManifestError, what="manifest", fix=FIX)


def test_fields_name_the_file_the_field_and_the_fix():
    f = Fields(
        {"n": 1.5, "b": 1, "s": 5, "l": [1, "x"], "h": "ab", "f": "../x", "o": []},
        where="w.json",
        error=ManifestError,
        fix=FIX,
    )
    cases = [
        (lambda: f.int("n", lo=1), "w.json: field 'n' must be an integer >= 1 \\(got 1.5\\); fix it"),
        (lambda: f.bool("b"), "field 'b' must be true or false \\(got 1\\)"),
        (lambda: f.str("s"), "field 's' must be a string \\(got 5\\)"),
        (lambda: f.int_list("l", lo=0, hi=9), "field 'l' must be a list of integers in \\[0, 9\\] \\(got \"x\"\\)"),
        (lambda: f.sha256("h"), "field 'h' must be a sha256 digest"),
        (lambda: f.filename("f"), "field 'f' must be a file name inside the folder"),
        (lambda: f.dict("o"), "field 'o' must be a JSON object"),
        (lambda: f.int("missing"), "required field 'missing' is missing"),
        (lambda: f.sub("o"), "field 'o' must be a JSON object"),
    ]
    for call, match in cases:
        with pytest.raises(ManifestError, match=match):
            call()
    assert f.int("absent", default=7) == 7 and f.bool("absent", default=False) is False
    assert Fields({"x": {"y": True}}, where="w", error=ManifestError, fix=FIX).sub("x").bool("y") is True
    with pytest.raises(ManifestError, match="field 'x.y' must be an integer"):
        Fields({"x": {"y": True}}, where="w", error=ManifestError, fix=FIX).sub("x").int("y")


def test_command_line_text_with_undecodable_bytes_names_the_byte():
    with pytest.raises(Exception, match="not valid UTF-8 text \\(byte 0xff at character 1 is not UTF-8\\)"):
        check_text("a\udcff", what="the prompt", fix=FIX)
    assert check_text("héllo 🙂", what="the prompt", fix=FIX) == "héllo 🙂"


def test_long_lines_are_refused_without_reading_them_whole(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_bytes(b"ok\n" + b"x" * 5000 + b"\nlast\n")
    it = iter_lines(p, error=DataError, what="stream file", fix=FIX, limit=100)
    assert next(it) == (1, b"ok\n")
    with pytest.raises(DataError, match="line 2 is longer than 100 bytes"):
        next(it)


def _safetensors(path, n=6):
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"w": np.arange(n, dtype=np.float32), "b": np.zeros(2, dtype=np.int64)}, str(path))
    return path


def test_truncated_or_padded_safetensors_are_refused_from_the_header(tmp_path):
    good = _safetensors(tmp_path / "model.safetensors")
    check_safetensors(good, error=ModelFolderError, fix=FIX)
    data = good.read_bytes()
    for cut, match in (
        (len(data) - 3, "truncated: its header describes"),
        (20, "truncated or not safetensors"),
        (5, "no complete header"),
    ):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        with pytest.raises(ModelFolderError, match=match):
            check_safetensors(bad, error=ModelFolderError, fix=FIX)
    padded = tmp_path / "padded.safetensors"
    padded.write_bytes(data + b"\0" * 8)
    with pytest.raises(ModelFolderError, match="is damaged"):
        check_safetensors(padded, error=ModelFolderError, fix=FIX)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header["w"]["shape"] = [7]  # 7 floats cannot fit in 24 bytes
    forged = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    (tmp_path / "forged.safetensors").write_bytes(data[:8] + forged + data[8 + n :])
    with pytest.raises(ModelFolderError, match="damaged header entry for tensor 'w'"):
        check_safetensors(tmp_path / "forged.safetensors", error=ModelFolderError, fix=FIX)


def test_tokenizer_and_model_widths_must_agree_up_to_padding():
    check_vocab_fits(tokenizer_size=151_665, model_width=151_936, tokenizer="t", model="m")  # Qwen2's padding
    check_vocab_fits(tokenizer_size=50_295, model_width=51_200, tokenizer="t", model="m")  # Phi-2's
    check_vocab_fits(tokenizer_size=32_000, model_width=32_000, tokenizer="t", model="m")
    with pytest.raises(TokenizerError, match="has 50257 tokens but m scores only 32000"):
        check_vocab_fits(tokenizer_size=50_257, model_width=32_000, tokenizer="t", model="m")
    with pytest.raises(TokenizerError, match="ids 32000..50256 would vanish from the text"):
        check_vocab_fits(tokenizer_size=32_000, model_width=50_257, tokenizer="t", model="m")
