"""Real tokenizers, offline: convert llama.cpp's vocabulary GGUFs into HF fast tokenizers.

No model hub is reachable here, but the sdist of ``llama-cpp-python`` (on PyPI) vendors llama.cpp's
``models/ggml-vocab-*.gguf`` files together with ``.inp``/``.out`` test vectors. This module fetches
that sdist once, keeps only the vocabulary files in a cache, and builds ``tokenizer.json`` files with
the ``tokenizers`` library that reproduce llama.cpp's tokenization of every test vector.

Only GPT-2 and Phi-3 vocabularies (MIT) are committed to the repository; Llama-2/3 and Qwen carry
their models' licences, so they are converted here at build/test time into the cache instead.

    python -m omnidraft.models.gguf_tokenizers --all
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from omnidraft.atomic import write_text
from omnidraft.errors import TokenizerError

SDIST_VERSION = "0.3.36"
SDIST_SPEC = f"llama-cpp-python=={SDIST_VERSION}"
# Bump when the conversion changes, so cached tokenizer folders from an older converter are rebuilt.
CONVERTER_VERSION = 1
FIX_HINT = "run `python -m omnidraft.models.gguf_tokenizers --all` on a machine with access to PyPI"

# Name used by this project -> stem of the vocabulary file in llama.cpp's models/ folder.
VOCABS = {"llama-spm": "llama-spm", "llama-bpe": "llama-bpe", "qwen2": "qwen2", "gpt-2": "gpt-2", "phi-3": "phi-3"}

# Pre-tokenizer regexes keyed by the gguf's `tokenizer.ggml.pre`; taken from llama.cpp's
# llama-vocab.cpp and written the way the models' own HF tokenizer.json files write them.
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_PRE_REGEX = {
    "gpt-2": _GPT2_RE,
    "default": _GPT2_RE,
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}

# llama.cpp token types (gguf.TokenType): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4


def cache_dir() -> Path:
    """Root of omnidraft's cache: ``$OMNIDRAFT_CACHE`` or ``~/.cache/omnidraft``."""
    env = os.environ.get("OMNIDRAFT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "omnidraft"


def _vocab_dir() -> Path:
    return cache_dir() / "llama-vocab"


def fetch_sdist() -> Path:
    """Return the folder holding llama.cpp's ``ggml-vocab-*`` files, downloading the sdist if needed."""
    out = _vocab_dir()
    if any(out.glob("ggml-vocab-*.gguf")):
        return out
    sdist_dir = cache_dir() / "sdist"
    tarballs = sorted(sdist_dir.glob(f"llama_cpp_python-{SDIST_VERSION}.tar.gz"))
    if not tarballs:
        sdist_dir.mkdir(parents=True, exist_ok=True)
        print(f"downloading {SDIST_SPEC} sdist (~76 MB) into {sdist_dir}", file=sys.stderr)
        # pip prepares the sdist's metadata (installs scikit-build-core in an isolated env, ~1 min);
        # --no-build-isolation would skip that but then pip fails before saving the file.
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            SDIST_SPEC,
            "-d",
            str(sdist_dir),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        tarballs = sorted(sdist_dir.glob(f"llama_cpp_python-{SDIST_VERSION}.tar.gz"))
        if not tarballs:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise TokenizerError(
                f"could not download {SDIST_SPEC} ({' | '.join(tail)}); {FIX_HINT}, "
                f"or put llama_cpp_python-{SDIST_VERSION}.tar.gz into {sdist_dir}"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".llama-vocab-", dir=out.parent))
    try:
        with tarfile.open(tarballs[0]) as tar:
            for member in tar:
                name = Path(member.name).name
                # Only the vocabulary files and their test vectors; the rest of llama.cpp is not needed.
                if (
                    member.isfile()
                    and "/vendor/llama.cpp/models/" in member.name
                    and name.startswith("ggml-vocab-")
                    and name.endswith((".gguf", ".gguf.inp", ".gguf.out"))
                ):
                    src = tar.extractfile(member)
                    assert src is not None
                    (tmp / name).write_bytes(src.read())
        if not any(tmp.glob("ggml-vocab-*.gguf")):
            raise TokenizerError(
                f"{tarballs[0]} holds no vendor/llama.cpp/models/ggml-vocab-*.gguf; delete it and {FIX_HINT}"
            )
        try:
            os.replace(tmp, out)
        except OSError:
            if not any(out.glob("ggml-vocab-*.gguf")):  # another process won the race, else re-raise
                raise
    finally:
        if tmp.exists():
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    return out


def vocab_files(name: str) -> tuple[Path, Path, Path]:
    """(gguf, inp, out) paths of one vocabulary in the extracted cache."""
    if name not in VOCABS:
        raise TokenizerError(f"unknown vocabulary {name!r}; choose one of {', '.join(VOCABS)}")
    base = fetch_sdist() / f"ggml-vocab-{VOCABS[name]}.gguf"
    return base, Path(f"{base}.inp"), Path(f"{base}.out")


def read_test_vectors(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's test vectors: ``.inp`` texts and ``.out`` ids, each entry ends with a marker line."""
    _, inp, out = vocab_files(name)
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    ids = out.read_text(encoding="utf-8").split("\n")
    # Both files end with a terminator, so each split leaves one trailing empty piece (an empty test
    # text inside the file stays: it is a real vector whose id line is empty).
    if texts and texts[-1] == "":
        texts = texts[:-1]
    if ids and ids[-1] == "":
        ids = ids[:-1]
    if len(texts) != len(ids):
        raise TokenizerError(
            f"{inp.name}: {len(texts)} texts but {len(ids)} id lines; delete {inp.parent} and {FIX_HINT}"
        )
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, ids)]


def _read_gguf(path: Path) -> dict[str, Any]:
    import gguf  # optional dependency (extras `data`/`test`): only needed to convert

    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}


def _build(meta: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    kind = meta["tokenizer.ggml.model"]
    vocab = {t: i for i, t in enumerate(tokens)}
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")

    if kind == "llama":  # SentencePiece BPE: merges follow the pieces' scores, unknown bytes fall back
        from transformers.convert_slow_tokenizer import generate_merges

        scores = meta["tokenizer.ggml.scores"]
        pieces = {t: s for t, s, ty in zip(tokens, scores, types) if ty not in (_CONTROL, _UNKNOWN)}
        merges = generate_merges(vocab, pieces)
        unk = tokens[unk_id] if unk_id is not None else "<unk>"
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
        # Llama-2's legacy HF tokenizer: always prepend "▁" and map spaces to "▁" (llama.cpp does the
        # same with add_space_prefix); Metaspace(prepend_scheme="first") misses 15/46 vectors.
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    elif kind == "gpt2":  # byte-level BPE with explicit merges
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in _PRE_REGEX:
            raise TokenizerError(f"unsupported pre-tokenizer {pre!r}; supported: {', '.join(_PRE_REGEX)}")
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        # Llama-3 matches whole pre-tokens in the vocabulary before merging (1 vector differs without).
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=(pre == "llama-bpe")))
        if pre == "qwen2":
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_PRE_REGEX[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
    else:
        raise TokenizerError(
            f"unsupported tokenizer model {kind!r} in gguf; only 'llama' (SentencePiece) and 'gpt2' (BPE) convert"
        )

    # Control, unknown and user-defined tokens are matched whole (llama.cpp's parse_special); control
    # and unknown ones are special so decode(skip_special_tokens=True) drops them, as in the HF originals.
    added = [
        AddedToken(t, special=(ty in (_CONTROL, _UNKNOWN)), normalized=False)
        for t, ty in zip(tokens, types)
        if ty in (_CONTROL, _UNKNOWN, _USER_DEFINED)
    ]
    tok.add_tokens(added)

    # llama.cpp's defaults when the gguf is silent: SentencePiece and Llama-3 add BOS, other BPEs don't.
    pre = meta.get("tokenizer.ggml.pre")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama" or pre == "llama-bpe"))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    bos = tokens[bos_id] if bos_id is not None else None
    eos = tokens[eos_id] if eos_id is not None else None
    single, pair, specials = "$A:0", "$B:1", []
    if add_bos and bos is not None:
        single, pair = f"{bos}:0 {single}", f"{bos}:1 {pair}"
        specials.append((bos, bos_id))
    if add_eos and eos is not None:
        single, pair = f"{single} {eos}:0", f"{pair} {eos}:1"
        specials.append((eos, eos_id))
    if specials:
        tok.post_processor = processors.TemplateProcessing(
            single=single, pair=f"{single} {pair}", special_tokens=list(dict.fromkeys(specials))
        )
    info = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": tokens[unk_id] if unk_id is not None else None,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "model_max_length": 1 << 30,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "source": f"llama.cpp ggml-vocab via {SDIST_SPEC} sdist",
        "gguf_model": kind,
        "gguf_pre": pre,
        "omnidraft_converter_version": CONVERTER_VERSION,
    }
    return tok, info


def tokenizer_dir(name: str) -> Path:
    """Where ``convert(name)`` writes (whether or not it exists yet)."""
    return cache_dir() / "tokenizers" / name


def convert(name: str) -> Path:
    """Convert one llama.cpp vocabulary to ``<cache>/tokenizers/<name>/tokenizer.json``; returns the folder."""
    gguf_path, _, _ = vocab_files(name)
    try:
        meta = _read_gguf(gguf_path)
    except ImportError as e:
        raise TokenizerError(f"converting {name} needs the `gguf` package ({e}); pip install 'gguf>=0.17'") from e
    except Exception as e:  # a truncated or foreign file: the reader raises assorted errors
        raise TokenizerError(f"cannot read {gguf_path} ({e}); delete {gguf_path.parent} and {FIX_HINT}") from e
    tok, info = _build(meta)
    out = tokenizer_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    # Config first, tokenizer.json last: its presence marks a complete conversion.
    write_text(out / "tokenizer_config.json", json.dumps(info, indent=2) + "\n")
    write_text(out / "tokenizer.json", tok.to_str(pretty=False))
    return out


def get_tokenizer_dir(name: str) -> Path:
    """Folder with ``tokenizer.json`` for ``name``, converting (and downloading) only if missing."""
    out = tokenizer_dir(name)
    try:
        config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
        if (out / "tokenizer.json").is_file() and config.get("omnidraft_converter_version") == CONVERTER_VERSION:
            return out
    except (OSError, ValueError):
        pass  # missing or half-written: convert again
    return convert(name)


# MIT-licensed vocabularies are also committed next to this module (models/tokenizers/<folder>/).
COMMITTED = {"gpt-2": "gpt2", "phi-3": "phi3"}


def committed_tokenizer_dir(name: str) -> Path:
    """The folder of a tokenizer committed to the repository (gpt-2, phi-3); needs no download."""
    if name not in COMMITTED:
        raise TokenizerError(
            f"{name!r} is not committed (licence); only {', '.join(COMMITTED)} are. "
            f"Use get_tokenizer_dir({name!r}) to convert it into the cache"
        )
    out = Path(__file__).resolve().parent / "tokenizers" / COMMITTED[name]
    if not (out / "tokenizer.json").is_file():
        raise TokenizerError(f"{out / 'tokenizer.json'} is missing; restore it from git or {FIX_HINT}")
    return out


def load_tokenizer(name: str):
    """The converted ``tokenizers.Tokenizer`` for ``name``."""
    from tokenizers import Tokenizer

    path = get_tokenizer_dir(name) / "tokenizer.json"
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise TokenizerError(f"{path} is unreadable ({e}); delete {path.parent} and {FIX_HINT}") from e


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m omnidraft.models.gguf_tokenizers", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help=f"vocabularies: {', '.join(VOCABS)}")
    p.add_argument("--all", action="store_true", help="convert every vocabulary")
    p.add_argument("--force", action="store_true", help="convert again even if cached")
    args = p.parse_args(argv)
    names = list(VOCABS) if args.all or not args.names else args.names
    try:
        for name in names:
            t0 = time.perf_counter()
            folder = convert(name) if args.force else get_tokenizer_dir(name)
            tok = load_tokenizer(name)
            print(f"{name}\t{folder}\tvocab={tok.get_vocab_size()}\t{time.perf_counter() - t0:.1f}s")
    except TokenizerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
