"""Direct mapping (DM) between a drafter and a target vocabulary.

Two tokens are directly mapped when they spell the same bytes (SentencePiece "▁" and byte-level "Ġ"
both spell a space). Special tokens and SentencePiece byte-fallback tokens (``<0xNN>``) are left out,
as in the paper's intersection counts; the n-gram cache can still learn them as 1-grams. The map is
built once per pair into arrays, so the speculative step only indexes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnidraft.runtime.tokenizer import TokenCodec


@dataclass(frozen=True)
class VocabMap:
    d2t: np.ndarray          # int64 [drafter width]: target id or -1
    t2d: np.ndarray          # int64 [target width]: drafter id or -1
    drafter_ids: np.ndarray  # int64 [n]: mapped drafter ids (ascending)
    target_ids: np.ndarray   # int64 [n]: their target ids, same order

    @property
    def size(self) -> int:
        return int(self.drafter_ids.size)

    @property
    def dm_mask(self) -> np.ndarray:
        return self.d2t >= 0

    def lift(self, q: np.ndarray, width: int) -> np.ndarray:
        """Scatter a drafter distribution onto the target vocabulary (DM tokens only)."""
        out = np.zeros(width, dtype=q.dtype)
        out[self.target_ids] = q[self.drafter_ids]
        return out


def build_vocab_map(drafter: TokenCodec, target: TokenCodec, drafter_width: int | None = None,
                    target_width: int | None = None) -> VocabMap:
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
    return VocabMap(d2t=d2t, t2d=t2d, drafter_ids=drafter_ids, target_ids=d2t[drafter_ids])


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
