"""Exact speculative sampling with merged n-grams: a proposal scored for every target token.

Speculative sampling reproduces the target's distribution only when the verifier knows q'(t), the
probability that the drafter proposes target token t, for every t: the acceptance test uses q'(t)
of the proposed token, the residual after a rejection uses all of q'. The paper's Eq. 1-2 know it
for the n-gram drafted this round only (an n-gram's probability needs the drafter's distribution
after its first sub-token, which exists only where that sub-token was drawn), hence its gap.

Here an n-gram is merged only through a drafter token with no direct mapping, its *head* (a
byte-fallback piece, a sub-word the target's vocabulary lacks). Once the drafter samples a head,
the rest of that n-gram is fed to it, not sampled; a head with several cached n-grams stands for
the most used one. Every draftable drafter token then stands for exactly one target token, so q' is
q pushed through that map and known in full. A direct-mapped token always means itself: an n-gram
that starts with one is merged only by the paper's rule (``DecodeConfig.ngram_sampling="paper"``).
Greedy decoding needs no q' and merges every cached n-gram.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnidraft.runtime.ngram_cache import Key, NgramCache
from omnidraft.runtime.vocab import VocabMap

# The acceptance head's logit given to fed (not sampled) sub-tokens: sigmoid(30) = 1 - 1e-13, so
# the stopping rule's product over a merged n-gram is its head's prediction.
FED_LOGIT = 30.0


@dataclass(frozen=True)
class ExactNgrams:
    mask: np.ndarray  # drafter ids that may be sampled: direct-mapped tokens and heads
    key: dict[int, Key]  # head -> the n-gram it stands for
    target: dict[int, int]  # head -> that n-gram's target token
    heads: np.ndarray  # int64 head ids
    head_targets: np.ndarray  # int64 their target ids, same order

    def rest(self, head: int) -> tuple[int, ...]:
        """Sub-tokens fed after ``head`` (empty for a direct-mapped token or a 1-gram)."""
        k = self.key.get(head)
        return k[1:] if k else ()

    def prob(self, vocab: VocabMap, q: np.ndarray, t: int) -> float:
        """q'(t): the drafter mass of every token that stands for target token ``t``."""
        d = vocab.t2d[t] if t < vocab.t2d.size else -1
        return float((q[d] if d >= 0 else 0.0) + q[self.heads[self.head_targets == t]].sum())

    def lift(self, vocab: VocabMap, q: np.ndarray, width: int) -> np.ndarray:
        """q' over the whole target vocabulary."""
        full = vocab.lift(q, width)
        np.add.at(full, self.head_targets, q[self.heads])
        return full


def exact_ngrams(vocab: VocabMap, cache: NgramCache | None) -> ExactNgrams:
    best: dict[int, tuple[int, Key, int]] = {}
    for key, t, seen, hits in cache.items() if cache is not None else ():
        h = key[0]
        if vocab.d2t[h] >= 0:
            continue
        score = seen + hits
        old = best.get(h)
        if old is None or score > old[0] or (score == old[0] and key < old[1]):
            best[h] = (score, key, t)
    heads = np.fromiter(sorted(best), dtype=np.int64, count=len(best))
    mask = vocab.dm_mask.copy()
    mask[heads] = True
    return ExactNgrams(
        mask=mask,
        key={h: best[h][1] for h in best},
        target={h: best[h][2] for h in best},
        heads=heads,
        head_targets=np.array([best[int(h)][2] for h in heads], dtype=np.int64),
    )
