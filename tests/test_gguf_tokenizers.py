"""Converted llama.cpp vocabularies reproduce llama.cpp's own tokenizer test vectors."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from omnidraft.errors import TokenizerError
from omnidraft.models import gguf_tokenizers as gt

VOCAB_SIZES = {"llama-spm": 32000, "llama-bpe": 128256, "qwen2": 151936, "gpt-2": 50257, "phi-3": 32064}
# What each original HF tokenizer puts in front of a plain encode.
BOS = {"llama-spm": "<s>", "llama-bpe": "<|begin_of_text|>", "qwen2": None, "gpt-2": None, "phi-3": "<s>"}


def _load(folder: Path) -> Tokenizer:
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def _check_vectors(tok: Tokenizer, name: str) -> None:
    vectors = gt.read_test_vectors(name)
    assert len(vectors) == 46
    bad_enc = [
        (t, ids, tok.encode(t, add_special_tokens=False).ids)
        for t, ids in vectors
        if tok.encode(t, add_special_tokens=False).ids != ids
    ]
    assert not bad_enc, f"{name}: {len(bad_enc)}/46 vectors differ, first: {bad_enc[0]}"
    bad_dec = [
        (t, tok.decode(ids, skip_special_tokens=False))
        for t, ids in vectors
        if tok.decode(ids, skip_special_tokens=False) != t
    ]
    assert not bad_dec, f"{name}: {len(bad_dec)}/46 do not decode back, first: {bad_dec[0]}"


@pytest.mark.parametrize("name", list(gt.VOCABS))
def test_vectors_and_vocab_size(real_tokenizer_dirs: dict[str, Path], name: str) -> None:
    tok = _load(real_tokenizer_dirs[name])
    assert tok.get_vocab_size() == VOCAB_SIZES[name]
    _check_vectors(tok, name)


@pytest.mark.parametrize("name", list(gt.VOCABS))
def test_special_tokens(real_tokenizer_dirs: dict[str, Path], name: str) -> None:
    folder = real_tokenizer_dirs[name]
    tok = _load(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    enc = tok.encode("Hello world")
    if BOS[name] is None:
        assert config["add_bos_token"] is False and enc.tokens[0] != config["bos_token"]
    else:
        assert enc.tokens[0] == BOS[name] == config["bos_token"]
    assert enc.tokens[-1] not in (config["eos_token"],)
    # The eos token text is matched whole and dropped by skip_special_tokens.
    ids = tok.encode(f"Hi{config['eos_token']}", add_special_tokens=False).ids
    assert ids[-1] == tok.token_to_id(config["eos_token"])
    assert tok.decode(ids, skip_special_tokens=True) == "Hi"


@pytest.mark.parametrize("name", list(gt.COMMITTED))
def test_committed_files_match_conversion(real_tokenizer_dirs: dict[str, Path], name: str) -> None:
    committed = gt.committed_tokenizer_dir(name)
    assert (committed / "tokenizer.json").read_bytes() == (real_tokenizer_dirs[name] / "tokenizer.json").read_bytes()
    _check_vectors(_load(committed), name)


def test_llama_spm_matches_llama2_legacy_behaviour(tokenizer_path) -> None:
    tok = _load(tokenizer_path("llama-spm"))
    # Llama-2's ids for "Hello world" and a byte-fallback character (U+1F999 -> 4 byte tokens).
    assert tok.encode("Hello world").ids == [1, 15043, 3186]
    assert tok.encode("🦙", add_special_tokens=False).tokens == ["▁", "<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]


def test_get_tokenizer_dir_is_cached(tokenizer_path) -> None:
    folder = tokenizer_path("gpt-2")
    mtime = (folder / "tokenizer.json").stat().st_mtime_ns
    assert gt.get_tokenizer_dir("gpt-2") == folder
    assert (folder / "tokenizer.json").stat().st_mtime_ns == mtime


def test_unknown_name_and_uncommitted_raise() -> None:
    with pytest.raises(TokenizerError, match="unknown vocabulary"):
        gt.vocab_files("llama-4")
    with pytest.raises(TokenizerError, match="not committed"):
        gt.committed_tokenizer_dir("llama-spm")


def _fake_sdist(cache: Path, gguf_bytes: bytes) -> None:
    sdist = cache / "sdist"
    sdist.mkdir(parents=True)
    root = f"llama_cpp_python-{gt.SDIST_VERSION}"
    files = {
        f"{root}/vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf": gguf_bytes,
        f"{root}/vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf.inp": b"a\n__ggml_vocab_test__\n",
        f"{root}/vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf.out": b" 64\n",
        f"{root}/vendor/llama.cpp/src/llama.cpp": b"int main;",
        f"{root}/vendor/llama.cpp/models/templates/x.jinja": b"{{ x }}",
    }
    with tarfile.open(sdist / f"{root}.tar.gz", "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_fetch_extracts_only_vocab_files_and_bad_gguf_raises(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path))
    assert gt.cache_dir() == tmp_path
    _fake_sdist(tmp_path, b"not a gguf file")
    folder = gt.fetch_sdist()
    assert folder == tmp_path / "llama-vocab"
    assert sorted(p.name for p in folder.iterdir()) == [
        "ggml-vocab-gpt-2.gguf",
        "ggml-vocab-gpt-2.gguf.inp",
        "ggml-vocab-gpt-2.gguf.out",
    ]
    assert gt.read_test_vectors("gpt-2") == [("a", [64])]
    with pytest.raises(TokenizerError, match="cannot read"):
        gt.get_tokenizer_dir("gpt-2")
    assert not (tmp_path / "tokenizers" / "gpt-2" / "tokenizer.json").exists()
