"""Shared vectors for the Android app's pure-Java core (android_demo/specdecode-core).

Two kinds, written as small JSON files that the Java tests replay and must match exactly:

* tokenizer vectors: encode/decode of a few hundred strings (code, math, unicode, emoji, CJK,
  whitespace runs, byte fallback, special tokens) with the two tokenizer families we ship, as the
  Python ``tokenizers`` library and ``runtime.tokenizer.TokenCodec`` produce them;
* loop vectors: full speculative-decoding runs of ``runtime.speculative`` call by call, on a
  scripted, deterministic drafter/target pair (``android_demo/vectors/loop.py``) and on the
  bundled pair with rows truncated to their top entries (``android_demo/vectors/pair.py``).
"""

from __future__ import annotations

import hashlib
import random
import tempfile
from pathlib import Path

from omnidraft.errors import TokenizerError

VECTOR_DIR = Path(__file__).resolve().parent.parent / "specdecode-core" / "src" / "test" / "resources" / "vectors"
TOKENIZERS = ("llama-spm", "gpt-2")

# Hand-picked strings; generated ones are appended below.
_BASE = [
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\n\n\n",
    " \n",
    "\n ",
    " \n ",
    "\t\t  \n",
    "\r\n",
    "a\r\nb",
    "Hello",
    "Hello world",
    " Hello world",
    "Hello  world",
    "Hello   world   ",
    "hello\nworld",
    "Hello, World!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm here; you're there. They'll see, we'd go, it's fine.",
    "don't DON'T Don't",
    "e.g. i.e. etc.",
    "U.S.A.",
    "Mr. O'Neil's café",
    "naïve façade coöperate Ångström",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n\tprint(i ** 2)\n",
    "if (x == 0) { return -1; } else { x--; }",
    '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); }',
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "SELECT * FROM users WHERE id = 7;",
    "ls -la | grep '\\.py$' > out.txt 2>&1",
    "x = [i*i for i in range(100) if i % 3 == 0]",
    "    indented four\n        indented eight",
    'class Foo(Bar):\n    """Doc."""\n    pass',
    "3.14159",
    "1,234,567.89",
    "2 + 2 = 4",
    "x^2 + y^2 = z^2",
    "1e-10",
    "0x1F",
    "100%",
    "$5.99",
    "∑_{i=1}^n i = n(n+1)/2",
    "∫_0^1 x² dx = 1/3",
    "√2 ≈ 1.41421356",
    "α + β = γ",
    "∀x ∃y: x < y",
    "½ ¼ ¾",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "48 / 2 = 24\n48 + 24 = 72\n#### 72",
    "中文",
    "你好，世界！",
    "日本語のテキストです。",
    "カタカナ ひらがな 漢字",
    "한국어 텍스트",
    "龘靐齉",
    "Привет, мир!",
    "Ελληνικά",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "Tiếng Việt có dấu",
    "👍",
    "👍🏽",
    "😀😃😄",
    "👨‍👩‍👧‍👦",
    "🇫🇷🇯🇵",
    "I ❤️ Unicode ✨",
    "emoji in text 🎉 here",
    "🦙 llama",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "𝕳𝖊𝖑𝖑𝖔",
    "\u00a0non-breaking\u00a0space",
    "ideographic\u3000space",
    "zero\u200bwidth",
    "tab\there",
    "trailing spaces    ",
    "    leading spaces",
    "mixed \t \n whitespace",
    "a\u2028b\u2029c",
    "control \x07 bell",
    "delete \x7f char",
    "\x01\x02\x03",
    "combining e\u0301 accent",
    "ﬁ ligature",
    "<s>",
    "</s>",
    "<unk>",
    "<s>Hello</s>",
    "a<s>b",
    " <s> ",
    "<|endoftext|>",
    "text<|endoftext|>more",
    "<|endoftext|><|endoftext|>",
    "<0x0A>",
    "▁",
    "▁▁",
    "a▁b ▁ c▁",
    "▁<s>▁",
    "<s><s>",
    "x</s>▁\n▁y",
    "Ġ",
    "ĠĠhello",
    "<<>>",
    "</",
    "<|",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ababababababababab",
    "................",
    "----------------------------------------",
    "================",
    "!!!???",
    "\"quoted\" 'single'",
    "https://example.com/path?query=1&x=2#frag",
    "user@example.com",
    "C:\\Users\\name\\file.txt",
    "CamelCaseIdentifier snake_case_identifier kebab-case-identifier",
    "ALLCAPS lowercase MiXeD",
    "The year 2024 had 366 days; 1999 had 365.",
    "12345678901234567890",
    "0.000001",
    "-42",
    "+7",
]

_PIECES = [
    "the",
    " the",
    "The",
    " cat",
    "  ",
    "\n",
    "\t",
    "ing",
    "tion",
    " 42",
    "3.5",
    "é",
    "ß",
    "中",
    "文",
    "日本",
    "😀",
    "👍🏽",
    "🇫🇷",
    " ",
    ".",
    ",",
    "!",
    "?",
    "'s",
    "'ll",
    "(",
    ")",
    "{",
    "}",
    "=",
    "==",
    " +",
    "->",
    "::",
    "__init__",
    "self",
    "return",
    "def",
    "λ",
    "∑",
    "²",
    "\u3000",
    "\u00a0",
    "𝔘",
    "<s>",
    "</s>",
    "<|endoftext|>",
    "ÿ",
    "\x00",
    "\x1b[0m",
    "abc",
    "XYZ",
    "0",
    "999",
]


def _generated(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        k = rng.randint(1, 12)
        out.append("".join(rng.choice(_PIECES) for _ in range(k)))
    return out


def _stdlib_lines(rng: random.Random, n: int) -> list[str]:
    """Real code: random lines of a few stdlib modules (any Python's stdlib will do; vectors are committed)."""
    import inspect
    import json as _json
    import textwrap

    lines: list[str] = []
    for mod in (_json, textwrap, random, tempfile):
        try:
            lines += [ln for ln in inspect.getsource(mod).splitlines() if ln.strip()]
        except (OSError, TypeError):
            continue
    rng.shuffle(lines)
    out = []
    for i in range(0, min(len(lines), 3 * n), 3):
        out.append("\n".join(lines[i : i + rng.randint(1, 3)]))
    return out[:n]


def vector_strings(seed: int = 8) -> list[str]:
    rng = random.Random(seed)
    strings = list(_BASE) + _generated(rng, 140) + _stdlib_lines(rng, 60)
    seen, out = set(), []
    for s in strings:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def tokenizer_path(name: str) -> Path:
    from omnidraft.models import gguf_tokenizers

    return gguf_tokenizers.get_tokenizer_dir(name) / "tokenizer.json"


def _table_digest(codec) -> str:
    h = hashlib.sha256()
    for b in codec.token_bytes:
        h.update(len(b).to_bytes(4, "little"))
        h.update(b)
    return h.hexdigest()


def tokenizer_vectors(name: str, path: Path | None = None, seed: int = 8) -> dict:
    """Encode/decode vectors of one tokenizer, as Python's ``tokenizers`` and TokenCodec produce them."""
    from omnidraft.runtime.tokenizer import load_codec

    path = Path(path) if path is not None else tokenizer_path(name)
    codec = load_codec(path)
    tok = codec.tokenizer
    cases = []
    for text in vector_strings(seed):
        ids = tok.encode(text, add_special_tokens=False).ids
        cont = codec.encode_continuation(text)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_special": tok.encode(text, add_special_tokens=True).ids,
                "decode": tok.decode(ids, skip_special_tokens=False),
                "decode_skip": tok.decode(ids, skip_special_tokens=True),
                "spell_hex": codec.spell(ids).hex(),
                "continuation": cont,
                "exact": codec.encode_exact(text, continuation=False),
                "exact_continuation": codec.encode_exact(text, continuation=True),
            }
        )
    # Decoding arbitrary id runs: split multi-byte characters, lone byte-fallback tokens, specials.
    rng = random.Random(seed + 1)
    width = codec.vocab_size
    interesting = sorted(codec.special | codec.byte_fallback)[:300]
    decode_cases = []
    for _ in range(120):
        k = rng.randint(1, 8)
        ids = [
            rng.choice(interesting) if interesting and rng.random() < 0.4 else rng.randrange(width) for _ in range(k)
        ]
        decode_cases.append(
            {
                "ids": ids,
                "decode": tok.decode(ids, skip_special_tokens=False),
                "decode_skip": tok.decode(ids, skip_special_tokens=True),
                "codec_decode": codec.decode(ids),
            }
        )
    return {
        "tokenizer": name,
        "sha256": codec.sha256,
        "kind": codec.kind,
        "vocab_size": codec.vocab_size,
        "prepends_space": codec.prepends_space,
        "start_ids": list(codec.start_ids),
        "eos_ids": sorted(codec.eos_ids),
        "special": sorted(codec.special),
        "byte_fallback_count": len(codec.byte_fallback),
        "token_bytes_sha256": _table_digest(codec),
        "cases": cases,
        "decode_cases": decode_cases,
    }


def write_json_atomic(path: Path, obj: object) -> None:
    from omnidraft.atomic import write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, obj, compact=True)  # ASCII-only, compact: small files that diff as one line each


def write_tokenizer_vectors(out_dir: Path = VECTOR_DIR, names: tuple[str, ...] = TOKENIZERS) -> list[Path]:
    written = []
    for name in names:
        if name not in TOKENIZERS:
            raise TokenizerError(f"no tokenizer vectors for {name!r}; the Android core ships {', '.join(TOKENIZERS)}")
        path = Path(out_dir) / f"tokenizer-{name}.json"
        write_json_atomic(path, tokenizer_vectors(name))
        written.append(path)
    return written


def write_loop_vectors(out_dir: Path = VECTOR_DIR) -> Path:
    """Whole speculative runs (llama-spm drafter, gpt-2 target) on the scripted pair, call by call."""
    from omnidraft.android.loop import loop_vectors, qprime_vectors
    from omnidraft.runtime.tokenizer import load_codec

    drafter, target = load_codec(tokenizer_path("llama-spm")), load_codec(tokenizer_path("gpt-2"))
    data = loop_vectors(drafter, target)
    data["qprime_cases"] = qprime_vectors(drafter, target)
    path = Path(out_dir) / "loop-llama-spm-gpt-2.json"
    write_json_atomic(path, data)
    return path


PAIR_FILE = "loop-bundled-pair.json"


def write_pair_vectors(
    out_dir: Path = VECTOR_DIR, drafter: Path | None = None, target: Path | None = None, top_n: int | None = None
) -> Path:
    """Whole speculative runs on the bundled pair (or the given HF folders), rows kept to their top entries."""
    from omnidraft.android import pair as apv

    data = apv.pair_vectors(drafter or apv.BUNDLED / "drafter", target or apv.BUNDLED / "target", top_n or apv.TOP_N)
    path = Path(out_dir) / PAIR_FILE
    write_json_atomic(path, data)
    return path
