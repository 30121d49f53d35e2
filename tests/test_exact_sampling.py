"""Sampling with merged n-grams reproduces the target's distribution (chi-square on two real
tokenizer pairs); the paper's Eq. 1-2 rule, the negative control, does not.

The models are tiny random ones over the real vocabularies: the next-token logits depend on the last
token only and put their mass on a few tokens, so the target's output is a Markov chain whose
transition probabilities are known exactly. Long sampled runs are then tested transition by
transition (Anderson-Goodman chi-square). The cache holds n-grams the exact rule merges (through
drafter tokens with no direct mapping) and one adversarial n-gram it must not (its first sub-token
is direct-mapped and the n-gram spells a token the drafter favours, which Eq. 2 mis-scores).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.loader import LoadedModel
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder
from omnidraft.runtime.tokenizer import load_codec
from omnidraft.runtime.vocab import build_vocab_map

PAIRS = [("llama-spm", "gpt-2"), ("llama-spm", "qwen2")]
PROMPT = "ab"
SEEDS, NEW_TOKENS = 3, 300


class RandomModel:
    """A random next-token model over a real vocabulary: its logits put mass on ``support`` only,
    from a row chosen by the last token (one row per support token, one for every other token)."""

    name = "random"

    def __init__(self, width: int, support: list[int], seed: int) -> None:
        self.vocab_size, self.max_seq_len = width, 8192
        self.support = np.asarray(support)
        self.row = {t: i for i, t in enumerate(support)}
        self.table = np.random.default_rng(seed).normal(0.0, 1.0, size=(len(support) + 1, len(support)))
        self._len = 0

    @property
    def cached_len(self) -> int:
        return self._len

    def forward(self, ids, start):
        rows = np.full((len(ids), self.vocab_size), -1e9, dtype=np.float32)
        rows[:, self.support] = self.table[[self.row.get(t, len(self.support)) for t in ids]]
        self._len = start + len(ids)
        return rows

    def rollback(self, n):
        self._len = n

    def reset(self):
        self._len = 0

    def next_probs(self, token: int) -> np.ndarray:
        z = self.table[self.row.get(token, len(self.support))]
        p = np.exp(z - z.max())
        return p / p.sum()


def _text(b: bytes) -> bool:
    try:
        return bool(b.decode("utf-8").strip())
    except UnicodeDecodeError:
        return False


def _build(drafter_codec, target_codec):
    """Target: 3 direct-mapped tokens + 3 the drafter spells only through n-grams. Drafter: their 3
    direct counterparts, 2 heads without a direct mapping (byte-fallback pieces), and one more
    byte-fallback token that translates to nothing (drafted, then masked out)."""
    vm = build_vocab_map(drafter_codec, target_codec)
    t_dm = vm.target_ids[1000:1003].tolist()
    unmapped = [t for t in range(5000, 9000) if vm.t2d[t] < 0 and _text(target_codec.token_bytes[t])]
    t_ng = unmapped[:3]
    d_dm = vm.t2d[t_dm].tolist()
    fallback = sorted(drafter_codec.byte_fallback)
    heads, stray = fallback[40:42], fallback[50]
    t_support, d_support = t_dm + t_ng, d_dm + heads + [stray]
    tgt = LoadedModel(RandomModel(target_codec.vocab_size, t_support, 1), target_codec, frozenset(), Path("."), "t")
    drf = LoadedModel(RandomModel(drafter_codec.vocab_size, d_support, 2), drafter_codec, frozenset(), Path("."), "d")
    # Where Eq. 2 goes wrong: the drafter favours the adversarial n-gram (its direct-mapped first
    # sub-token anywhere, its second right after it) and a token the target rarely accepts, and the
    # target writes the n-gram's token often. A rejection's residual then ignores the n-gram's mass
    # whenever it was not drafted this round, and over-samples its token.
    drf.backend.table[:, [0, 1]] += 2.0
    drf.backend.table[:, 5] -= 1.0
    drf.backend.table[0, 5] += 5.0
    tgt.backend.table[:, 5] += 2.0
    tgt.backend.table[:, 1] -= 2.0
    keys = {(heads[0], d_dm[1]): t_ng[0], (heads[1],): t_ng[1]}
    # Adversarial: a direct-mapped first sub-token, and the drafter likes the pair it spells.
    adversarial = {(d_dm[0], stray): t_ng[2]}
    return tgt, drf, t_support, keys, adversarial


@pytest.fixture(scope="module", params=PAIRS, ids=lambda p: f"{p[0]}->{p[1]}")
def pair(request, tokenizer_path):
    d, t = request.param
    return _build(load_codec(tokenizer_path(d)), load_codec(tokenizer_path(t)))


def _cache(drf, tgt, entries):
    cache = NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size)
    for key, t in entries.items():
        cache.observe(key, t)
    return cache


def _transitions(dec, t_support, rule):
    """Counts [from, to] over consecutive support tokens of several long sampled runs."""
    idx = {t: i for i, t in enumerate(t_support)}
    counts = np.zeros((len(t_support), len(t_support)))
    merged = 0
    for seed in range(SEEDS):
        cfg = DecodeConfig(
            max_new_tokens=NEW_TOKENS, temperature=1.0, mode="ngram", draft_len=3, seed=seed, ngram_sampling=rule
        )
        out = dec.generate(PROMPT, cfg)
        merged += out.stats.ngram_proposed
        for a, b in zip(out.token_ids, out.token_ids[1:]):
            counts[idx[a], idx[b]] += 1
    return counts, merged


def _chi_square_p(counts, tgt, t_support):
    """p-value of the transition counts under the target's own transition probabilities (cells
    expecting fewer than 5 are pooled per row; Wilson-Hilferty approximation of the chi-square tail)."""
    stat, df = 0.0, 0
    for i, t in enumerate(t_support):
        n = counts[i].sum()
        if n == 0:
            continue
        expect = n * tgt.backend.next_probs(t)
        small = expect < 5
        obs = np.append(counts[i][~small], counts[i][small].sum())
        exp = np.append(expect[~small], expect[small].sum())
        keep = exp > 0
        stat += float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
        df += int(keep.sum()) - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2)), stat, df


def test_exact_sampling_matches_the_target_and_the_paper_rule_does_not(pair):
    tgt, drf, t_support, keys, adversarial = pair
    exact_dec = SpeculativeDecoder(tgt, drf, _cache(drf, tgt, keys | adversarial))
    counts, merged = _transitions(exact_dec, t_support, "exact")
    p, stat, df = _chi_square_p(counts, tgt, t_support)
    print(f"exact: chi2 {stat:.1f} on {df} df, p = {p:.3g}, {counts.sum():.0f} transitions, {merged} merged")
    assert merged > 50, "the exact rule must still merge the n-grams it can score"
    assert p > 1e-3, f"exact sampling drifted from the target: chi2 {stat:.1f} on {df} df (p = {p:.2g})"
    paper_dec = SpeculativeDecoder(tgt, drf, _cache(drf, tgt, keys | adversarial))
    counts, _ = _transitions(paper_dec, t_support, "paper")
    p, stat, df = _chi_square_p(counts, tgt, t_support)
    print(f"paper: chi2 {stat:.1f} on {df} df, p = {p:.3g}")
    assert p < 1e-5, f"the negative control passed: chi2 {stat:.1f} on {df} df (p = {p:.2g})"


def test_the_exact_proposal_is_a_distribution_over_target_tokens(pair):
    """q' lifts every draftable drafter token onto exactly one target token: it sums to the drafter's
    mass, agrees with the per-token score, and never merges through a direct-mapped first sub-token."""
    from omnidraft.runtime.exact_proposal import exact_ngrams
    from omnidraft.runtime.sampling import softmax

    tgt, drf, t_support, keys, adversarial = pair
    dec = SpeculativeDecoder(tgt, drf, _cache(drf, tgt, keys | adversarial))
    ex = exact_ngrams(dec.vocab, dec.cache)
    assert set(ex.key) == {k[0] for k in keys}  # the adversarial n-gram starts with a mapped token
    q = softmax(drf.backend.forward([5], 0)[0], 1.0, ex.mask)
    full = ex.lift(dec.vocab, q, tgt.backend.vocab_size)
    assert abs(full.sum() - 1.0) < 1e-9
    for t in t_support:
        assert abs(ex.prob(dec.vocab, q, t) - full[t]) < 1e-12
    assert full[t_support[3]] == q[next(iter(keys))[0]] and full[t_support[5]] == 0.0
