"""A tokenizer seen as bytes: every token id spells a fixed byte string.

Cross-vocabulary decoding compares what two tokenizers *spell*, so this wraps an HF ``tokenizer.json``
(via the ``tokenizers`` library) with a per-id byte table. Detokenizing is then concatenation, and
byte offsets of tokens are exact, which the n-gram alignment relies on. Two families are handled:
byte-level BPE (GPT-2, Llama-3, Qwen2: token strings are bytes mapped to printable characters) and
SentencePiece-style BPE (Llama-2: "▁" for a space, ``<0xNN>`` byte-fallback tokens, a "▁" prepended
to the first word of the input).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

from omnidraft.errors import TokenizerError
from omnidraft.validate import MiB, check_tree, parse_json, read_bytes

SPM_SPACE = "\u2581"
# A newline is a byte-fallback token in SentencePiece vocabularies and no merge crosses it, so text
# encoded after it tokenizes as it would mid-document (see TokenCodec.encode_continuation).
_ANCHOR = "\n"
MAX_TOKENIZER_BYTES = 256 * MiB  # the largest real ones (Gemma 3's 262k tokens) are ~33 MiB


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode table (the printable stand-ins of byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _has_component(node: object, kind: str) -> bool:
    if isinstance(node, dict):
        if node.get("type") == kind:
            return True
        return any(_has_component(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_has_component(v, kind) for v in node)
    return False


@dataclass
class TokenCodec:
    """Token ids <-> bytes for one tokenizer.json."""

    path: Path
    tokenizer: Tokenizer
    kind: str  # "byte-level" | "sentencepiece"
    token_bytes: list[bytes]  # spelling of each id; b"" for special tokens
    special: frozenset[int]
    byte_fallback: frozenset[int]  # SentencePiece <0xNN> ids
    prepends_space: bool  # encode("x") spells " x" (Llama-2 legacy behaviour)
    sha256: str
    start_ids: tuple[int, ...] = ()  # special ids the tokenizer's template puts before a document (e.g. <s>)
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    marker_ids: tuple[int, ...] = ()  # byte-fallback ids spelling a literal "▁" (SentencePiece with fallback)
    special_text: tuple[str, ...] = ()  # what the special tokens look like in text ("<s>")

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    # -- encoding -----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Tokens of ``text`` at the start of a document, without special tokens."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_continuation(self, text: str) -> list[int] | None:
        """Tokens of ``text`` as it tokenizes when it follows a token boundary mid-document.

        Returns None when no exact encoding could be found (the caller then widens its window).
        Works without re-tokenizing anything before ``text``.
        """
        if not text:
            return []
        want = text.encode("utf-8")
        if not self.prepends_space:
            ids = self.encode(text)
            return ids if self.spell(ids) == want else None
        if text[0] == " ":
            # The prepended "▁" plays the role of the leading space.
            ids = self.encode(text[1:])
            if self.spell(ids) == want:
                return ids
        ids = self.encode(_ANCHOR + text)
        head = b" " + _ANCHOR.encode()
        spelled = 0
        for i, tid in enumerate(ids):
            if spelled == len(head):
                rest = ids[i:]
                return rest if self.spell(rest) == want else None
            spelled += len(self.token_bytes[tid])
            if spelled > len(head):
                return None
        return None

    def encode_exact(self, text: str, *, continuation: bool) -> list[int] | None:
        """Tokens spelling exactly the bytes of ``text`` (after a virtual leading space at the start of
        a document), as :meth:`encode` or :meth:`encode_continuation` would for most text.

        The tokenizer does not spell two things as they are: a special token's text ("<s>" becomes
        the id 1, which spells nothing) and, under a SentencePiece normalizer that turns spaces into
        "▁", a literal "▁" (spelled back as a space). Either would shift every byte offset after it.
        Here the text is cut after the first character of each special token's text, so no piece
        holds one whole, and a literal "▁" is spelled by its byte-fallback tokens.
        """
        pieces = self._literal_pieces(text)
        if pieces is None:
            return self.encode_continuation(text) if continuation else self.encode(text)
        out: list[int] = []
        for k, piece in enumerate(pieces):
            if piece is None:
                out += self.marker_ids
                continue
            ids = self.encode(piece) if k == 0 and not continuation else self.encode_continuation(piece)
            if ids is None:
                return None
            out += ids
        return out

    def _literal_pieces(self, text: str) -> list[str | None] | None:
        """``text`` cut as :meth:`encode_exact` encodes it (None: a literal "▁"), or None if uncut."""
        hits = {i for sp in self.special_text for i in _occurrences(text, sp)}
        markers = set(_occurrences(text, SPM_SPACE)) if self.marker_ids else set()
        if not hits and not markers:
            return None
        pieces: list[str | None] = []
        last = 0
        for i in sorted(hits | markers):
            pieces += [text[last:i], None] if i in markers else [text[last : i + 1]]
            last = i + 1
        pieces.append(text[last:])
        return [p for p in pieces if p != ""]

    def spell(self, ids: list[int]) -> bytes:
        tb, n = self.token_bytes, len(self.token_bytes)
        return b"".join(tb[i] if i < n else b"" for i in ids)  # ids past the vocab: padded logits rows

    def decode(self, ids: list[int]) -> str:
        return self.spell(ids).decode("utf-8", errors="replace")


def _token_bytes_table(tok: Tokenizer, spec: dict) -> tuple[list[bytes], set[int], set[int], str]:
    vocab = tok.get_vocab(with_added_tokens=True)
    size = max(vocab.values()) + 1
    special = {int(i) for i, t in tok.get_added_tokens_decoder().items() if t.special}
    model = spec.get("model", {})
    byte_level = _has_component(spec.get("pre_tokenizer"), "ByteLevel") or _has_component(
        spec.get("decoder"), "ByteLevel"
    )
    kind = "byte-level" if byte_level else "sentencepiece"
    if model.get("type") != "BPE":
        raise TokenizerError(
            f"unsupported tokenizer model {model.get('type')!r}: omnidraft handles BPE tokenizers "
            "(byte-level like GPT-2/Llama-3/Qwen2, or SentencePiece-BPE like Llama-2)"
        )
    table = [b""] * size
    fallback: set[int] = set()
    dec = _byte_decoder()
    for token, i in vocab.items():
        if i in special:
            continue
        if byte_level:
            try:
                table[i] = bytes(dec[c] for c in token)
            except KeyError:
                table[i] = token.encode("utf-8")  # added non-special tokens are stored as plain text
        elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            table[i] = bytes([int(token[3:5], 16)])
            fallback.add(i)
        else:
            table[i] = token.replace(SPM_SPACE, " ").encode("utf-8")
    return table, special, fallback, kind


def _occurrences(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i >= 0:
        out.append(i)
        i = text.find(sub, i + 1)
    return out


def _special_id(tok: Tokenizer, names: tuple[str, ...]) -> int | None:
    for name in names:
        i = tok.token_to_id(name)
        if i is not None:
            return i
    return None


@lru_cache(maxsize=16)
def _load_cached(path: str, mtime_ns: int) -> TokenCodec:
    p = Path(path)
    fix = "re-copy it from the model's source"
    raw = read_bytes(p, error=TokenizerError, what="tokenizer", fix=fix, limit=MAX_TOKENIZER_BYTES)
    spec = parse_json(raw, error=TokenizerError, where=f"tokenizer {p}", fix=fix, depth=None)
    if not isinstance(spec, dict):
        raise TokenizerError(f"{p} is not a tokenizer.json (no JSON object); {fix}")
    for part in ("pre_tokenizer", "decoder"):  # walked recursively below
        check_tree(spec.get(part), error=TokenizerError, where=f"{p} ({part})", fix=fix)
    try:
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise TokenizerError(f"{p} is not a valid tokenizer.json ({exc}); {fix}") from None
    table, special, fallback, kind = _token_bytes_table(tok, spec)
    probe = tok.encode("x", add_special_tokens=False).ids
    prepends = b"".join(table[i] for i in probe) == b" x"
    with_template = tok.encode("x", add_special_tokens=True).ids
    start = (
        tuple(with_template[: max(0, len(with_template) - len(probe))]) if with_template[-len(probe) :] == probe else ()
    )
    eos = {
        i
        for i in (
            _special_id(tok, (n,)) for n in ("</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<|eot_id|>")
        )
        if i is not None
    }
    by_byte = {table[i][0]: i for i in fallback}
    marker = tuple(by_byte.get(b, -1) for b in SPM_SPACE.encode("utf-8")) if kind == "sentencepiece" else ()
    return TokenCodec(
        path=p,
        tokenizer=tok,
        kind=kind,
        token_bytes=table,
        special=frozenset(special),
        byte_fallback=frozenset(fallback),
        prepends_space=prepends,
        sha256=hashlib.sha256(raw).hexdigest(),
        start_ids=start,
        eos_ids=frozenset(eos),
        marker_ids=marker if -1 not in marker else (),
        special_text=tuple(
            sorted({t.content for t in tok.get_added_tokens_decoder().values() if t.special and t.content})
        ),
    )


def load_codec(path: str | Path) -> TokenCodec:
    """Load a tokenizer.json (or a folder holding one) as a TokenCodec."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise TokenizerError(f"no tokenizer at {p}: put the model's tokenizer.json next to its config.json")
    return _load_cached(str(p.resolve()), p.stat().st_mtime_ns)
