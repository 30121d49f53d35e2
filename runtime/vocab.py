"""Direct mapping (DM) between a drafter and a target vocabulary.

Two tokens are directly mapped when they spell the same bytes (SentencePiece "▁" and byte-level "Ġ"
both spell a space). Special tokens and SentencePiece byte-fallback tokens (``<0xNN>``) are left out,
as in the paper's intersection counts; the n-gram cache can still learn them as 1-grams. The map is
built once per pair into arrays, so the speculative step only indexes.

Splits (our extension; the paper only merges several drafter tokens into one target token): a drafter
token with no direct map whose bytes the target tokenizer spells exactly with several tokens, e.g. a
run of 8 spaces that a byte-level BPE target without whitespace-run tokens writes as 8 x " ". Such
a token is otherwise undraftable, and on code those runs are most of what the target emits. Splits
are proposed under greedy verification only (see runtime/speculative.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from omnidraft.runtime.tokenizer import TokenCodec


@dataclass(frozen=True)
class VocabMap:
    d2t: np.ndarray  # int64 [drafter width]: target id or -1
    t2d: np.ndarray  # int64 [target width]: drafter id or -1
    drafter_ids: np.ndarray  # int64 [n]: mapped drafter ids (ascending)
    target_ids: np.ndarray  # int64 [n]: their target ids, same order
    splits: dict[int, tuple[int, ...]] = field(default_factory=dict)  # unmapped drafter id -> >= 2 target ids

    @property
    def size(self) -> int:
        return int(self.drafter_ids.size)

    @property
    def dm_mask(self) -> np.ndarray:
        return self.d2t >= 0

    @cached_property  # the draft mask is rebuilt whenever the n-gram cache grows: build this once
    def split_mask(self) -> np.ndarray:
        mask = np.zeros(self.d2t.size, dtype=bool)
        mask[list(self.splits)] = True
        return mask

    def lift(self, q: np.ndarray, width: int) -> np.ndarray:
        """Scatter a drafter distribution onto the target vocabulary (DM tokens only)."""
        out = np.zeros(width, dtype=q.dtype)
        out[self.target_ids] = q[self.drafter_ids]
        return out


def build_vocab_map(
    drafter: TokenCodec, target: TokenCodec, drafter_width: int | None = None, target_width: int | None = None
) -> VocabMap:
    """Intersection of two vocabularies on their spelled bytes.

    ``*_width`` is the model's logits width, which may exceed the tokenizer's vocabulary (padding rows).
    """
    dw = max(drafter_width or 0, drafter.vocab_size)
    tw = max(target_width or 0, target.vocab_size)
    by_bytes: dict[bytes, int] = {}
    for tid, b in enumerate(target.token_bytes):
        if b and tid not in target.special and tid not in target.byte_fallback:
            by_bytes.setdefault(b, tid)
    d2t = np.full(dw, -1, dtype=np.int64)
    t2d = np.full(tw, -1, dtype=np.int64)
    for did, b in enumerate(drafter.token_bytes):
        if not b or did in drafter.special or did in drafter.byte_fallback:
            continue
        tid = by_bytes.get(b)
        if tid is not None and t2d[tid] < 0:
            d2t[did] = tid
            t2d[tid] = did
    drafter_ids = np.flatnonzero(d2t >= 0)
    return VocabMap(
        d2t=d2t, t2d=t2d, drafter_ids=drafter_ids, target_ids=d2t[drafter_ids], splits=_splits(drafter, target, d2t)
    )


def _splits(drafter: TokenCodec, target: TokenCodec, d2t: np.ndarray) -> dict[int, tuple[int, ...]]:
    """Unmapped drafter tokens -> the target tokens that spell exactly their bytes (>= 2 of them).

    Each is encoded as it tokenizes mid-document (``encode_continuation``); in context the target may
    cut the same bytes differently, which costs acceptance, never exactness (verification decides)."""
    ids, texts = [], []
    for did, b in enumerate(drafter.token_bytes):
        if d2t[did] >= 0 or not b or did in drafter.special or did in drafter.byte_fallback:
            continue
        try:
            texts.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            continue  # a partial character: no target spelling on its own
        ids.append(did)
    if target.prepends_space:
        encoded = [target.encode_continuation(t) for t in texts]
    else:  # byte-level BPE: mid-document and start-of-document encodings agree; batch it
        encoded = [e.ids for e in target.tokenizer.encode_batch(texts, add_special_tokens=False)]
    out = {}
    for did, text, tids in zip(ids, texts, encoded):
        if tids is not None and len(tids) >= 2 and target.spell(tids) == text.encode("utf-8"):
            out[did] = tuple(int(t) for t in tids)
    return out


def string_intersection_size(drafter: TokenCodec, target: TokenCodec) -> int:
    """The paper's convention for its Table 8 counts, for comparison only: raw token strings with the
    space markers normalised ("▁" -> "Ġ"). It misses multi-byte characters (byte-level vocabularies
    store them as byte stand-ins) and wrongly pairs Latin-1 look-alikes, so the runtime uses the
    byte-exact ``build_vocab_map`` instead."""

    def strings(codec: TokenCodec) -> set[str]:
        vocab = codec.tokenizer.get_vocab(with_added_tokens=False)
        out = set()
        for tok, i in vocab.items():
            if i in codec.special or i in codec.byte_fallback:
                continue
            out.add(tok.replace("\u2581", "\u0120") if codec.kind == "sentencepiece" else tok)
        return out

    return len(strings(drafter) & strings(target))
