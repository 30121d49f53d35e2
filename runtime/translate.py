"""Translation between drafter and target token spaces (paper §2).

* ``translate``: a drafted run of drafter tokens -> target tokens, by greedy longest match of cached
  n-grams left to right, else the direct map, else (greedy decoding only) the token's split into
  several target tokens; stops at the first drafter token that has none.
* ``q_prime_full``: the drafter's proposal distribution lifted onto the target vocabulary, with the
  paper's Eq. 2 correction for a merged n-gram (its prefix sub-token gives up the n-gram's mass).
* ``DrafterContext``: reverse translation. Accepted target text is re-tokenized into drafter tokens
  over a short look-behind window (never the whole context), and target tokens whose bytes are spelled
  exactly by several drafter tokens become n-gram cache entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.tokenizer import TokenCodec
from omnidraft.runtime.vocab import VocabMap


@dataclass
class Translation:
    target_ids: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)  # drafter positions [i, j) of each target token
    keys: list[tuple[int, ...] | None] = field(default_factory=list)  # cache key when merged, else None

    def __len__(self) -> int:
        return len(self.target_ids)


def translate(draft: list[int], vocab: VocabMap, cache: NgramCache | None, splits: bool = False) -> Translation:
    """Map drafter tokens to target tokens (greedy longest cached match first, then the direct map,
    then, with ``splits``, the several target tokens spelling an unmapped drafter token; each of
    those carries the drafter token's span)."""
    out = Translation()
    i, k = 0, len(draft)
    d2t = vocab.d2t
    while i < k:
        hit = None
        if cache is not None and len(cache):
            for n in range(min(cache.max_len, k - i), 0, -1):
                key = tuple(draft[i : i + n])
                t = cache.get(key)
                if t is not None:
                    hit = (n, t, key)
                    break
        if hit is not None:
            n, t, key = hit
            out.target_ids.append(t)
            out.spans.append((i, i + n))
            out.keys.append(key)
            i += n
        elif d2t[draft[i]] >= 0:
            out.target_ids.append(int(d2t[draft[i]]))
            out.spans.append((i, i + 1))
            out.keys.append(None)
            i += 1
        elif splits and draft[i] in vocab.splits:
            for t in vocab.splits[draft[i]]:
                out.target_ids.append(t)
                out.spans.append((i, i + 1))
                out.keys.append(None)
            i += 1
        else:
            break  # untranslatable: the proposal ends here
    return out


def proposal_prob(j: int, tr: Translation, draft: list[int], q_rows: list[np.ndarray], vocab: VocabMap) -> float:
    """q'(t_j): drafter probability of proposing target token j (Eq. 1).

    DM token: q(d). Merged n-gram: prod q(d_i) over its sub-tokens, plus q of a drafter token that
    maps to the same target token directly, since both paths propose it.
    """
    i0, i1 = tr.spans[j]
    if tr.keys[j] is None:
        return float(q_rows[i0][draft[i0]])
    prod = 1.0
    for i in range(i0, i1):
        prod *= float(q_rows[i][draft[i]])
    alias = vocab.t2d[tr.target_ids[j]]
    return prod + (float(q_rows[i0][alias]) if alias >= 0 and alias != draft[i0] else 0.0)


def q_prime_full(
    j: int, tr: Translation, draft: list[int], q_rows: list[np.ndarray], vocab: VocabMap, target_width: int
) -> np.ndarray:
    """q' over the whole target vocabulary at translated position j (Eq. 2).

    Direct-mapped tokens carry their drafter probability, unmapped target tokens 0. For a merged
    n-gram t = [d1..dn] drafted this round: q'(t) = prod q(d_i) (+ a direct alias), and the prefix
    sub-token d1 keeps q(d1) - prod q(d_i), so the total mass equals q's mass on the mapped support.
    Only the n-gram drafted this round is accounted for (the paper's approximation).
    """
    i0, _ = tr.spans[j]
    q = q_rows[i0]
    full = vocab.lift(q, target_width)
    if tr.keys[j] is not None:
        t = tr.target_ids[j]
        prod = proposal_prob(j, tr, draft, q_rows, vocab) - (
            full[t] if vocab.t2d[t] >= 0 and vocab.t2d[t] != draft[i0] else 0.0
        )
        full[t] += prod
        prefix_t = vocab.d2t[draft[i0]]
        if prefix_t >= 0:
            full[prefix_t] = max(0.0, full[prefix_t] - prod)
    return full


class DrafterContext:
    """The drafter's token context, kept equal to a re-tokenization of the target's accepted text."""

    def __init__(self, codec: TokenCodec, text: str, lookbehind: int = 8) -> None:
        self.codec = codec
        self.lookbehind = lookbehind
        self.prefix = list(codec.start_ids)
        self.text = bytearray(text.encode("utf-8"))
        self.valid_end = len(self.text)  # bytes that form complete UTF-8 characters
        self.tokens, self.starts = self._encode_from_start(text)

    @property
    def ids(self) -> list[int]:
        return self.prefix + self.tokens

    def _starts(self, ids: list[int], at: int, virtual: int = 0) -> list[int]:
        """Byte offset of each token; ``virtual`` leading bytes of the first token are not in the text."""
        starts, pos = [], at - virtual
        for i in ids:
            starts.append(max(pos, at))
            pos += len(self.codec.token_bytes[i])
        return starts

    def _encode_from_start(self, text: str) -> tuple[list[int], list[int]]:
        ids = self.codec.encode_exact(text, continuation=False)
        if ids is None:  # a piece beside a literal found no exact encoding: the tokenizer's own
            ids = self.codec.encode(text)  # encoding, whose offsets drift after the literal
        spelled, want = self.codec.spell(ids), text.encode("utf-8")
        virtual = 1 if spelled != want and spelled == b" " + want else 0  # SentencePiece's prepended "▁"
        return ids, self._starts(ids, 0, virtual)

    def _at_char_start(self, n: int) -> bool:
        """Token n starts a UTF-8 character (byte-fallback tokens can split one)."""
        return n >= len(self.starts) or not 0x80 <= self.text[self.starts[n]] < 0xC0

    def _char_boundary(self, n: int) -> int:
        while n > 0 and not self._at_char_start(n):
            n -= 1
        return n

    def append(self, new_bytes: bytes) -> list[tuple[int, int, int]]:
        """Add accepted target bytes; re-tokenize the tail. Returns drafter (id, start, end) of the window."""
        self.text += new_bytes
        end = len(self.text)
        while end > self.valid_end:
            try:
                self.text[self.valid_end : end].decode("utf-8")
                break
            except UnicodeDecodeError:
                end -= 1  # an unfinished multi-byte character waits for the next tokens
        if end <= self.valid_end:
            return []
        tb = self.codec.token_bytes
        w = self._char_boundary(max(0, len(self.tokens) - self.lookbehind))
        # Prefer a window starting at a word or line boundary: re-tokenization is stable there.
        for cand in range(w, max(-1, w - 3 * self.lookbehind), -1):
            if cand == 0 or (
                self._at_char_start(cand)
                and (tb[self.tokens[cand]][:1] in (b" ", b"\n") or tb[self.tokens[cand - 1]][-1:] == b"\n")
            ):
                w = cand
                break
        while True:
            start = self.starts[w] if w < len(self.starts) else self.valid_end
            piece = self.text[start:end].decode("utf-8")
            if w == 0:
                ids, starts = self._encode_from_start(piece)
                break
            ids = self.codec.encode_exact(piece, continuation=True)
            if ids is not None:
                starts = self._starts(ids, start)
                break
            w = self._char_boundary(max(0, w - self.lookbehind))
        self.tokens = self.tokens[:w] + ids
        self.starts = self.starts[:w] + starts
        self.valid_end = end
        ends = self.starts[1:] + [end]
        return [(self.tokens[i], self.starts[i], ends[i]) for i in range(w, len(self.tokens))]


def harvest_ngrams(
    window: list[tuple[int, int, int]], target_spans: list[tuple[int, int, int]], vocab: VocabMap, cache: NgramCache
) -> int:
    """Insert (drafter sub-tokens -> target token) for target tokens spelled exactly by drafter tokens.

    ``window``: drafter (id, start, end) byte spans; ``target_spans``: accepted target (id, start, end).
    A target token covered by >= 2 drafter tokens with matching boundaries is an n-gram; one covered by
    a single drafter token that has no direct mapping to it is a 1-gram (e.g. "<0x0A>" -> "\\n").
    Spans whose boundaries do not align are skipped. Returns the number of new entries.
    """
    by_start = {s: n for n, (_, s, _) in enumerate(window)}
    added = 0
    for t, a, b in target_spans:
        n = by_start.get(a)
        if n is None or a == b:
            continue
        m = n
        while m < len(window) and window[m][2] < b:
            m += 1
        if m >= len(window) or window[m][2] != b:
            continue
        key = tuple(window[i][0] for i in range(n, m + 1))
        if len(key) == 1 and vocab.d2t[key[0]] == t:
            continue
        if len(key) == 1 and vocab.d2t[key[0]] >= 0:
            continue  # a direct-mapped drafter token must keep its own meaning
        added += cache.observe(key, t)
    return added
