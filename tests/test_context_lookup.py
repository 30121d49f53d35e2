"""Context lookup: the n-gram index, greedy exactness with copied drafts, and the sampling rule for a
proposal with all its mass on one token."""

from __future__ import annotations

import numpy as np
import pytest
from test_speculative import PAIRS, PROMPTS, _exact_target_joint, _sampling_pair, models  # noqa: F401

from omnidraft.errors import InvalidArgument
from omnidraft.runtime import speculative as spec_mod
from omnidraft.runtime.context_lookup import ContextIndex, LookupConfig, parse_ngram_range
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.loader import load_model
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder


def test_the_longest_latest_match_proposes_what_followed_it():
    idx = ContextIndex(LookupConfig(max_tokens=3, min_ngram=1, max_ngram=3), [5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7])
    # "6 7" occurred twice before; the latest one (followed by 9) wins over the first (followed by 8).
    assert idx.propose(10) == [9, 2, 6]
    assert idx.propose(2) == [9, 2]  # the caller's room caps the copy
    idx.extend([8])  # "6 7 8" occurred at the start: the 3-gram match beats the 1-gram "8"
    assert idx.propose(10) == [1, 6, 7]
    idx.extend([4])  # never seen: nothing to copy
    assert idx.propose(10) == []


def test_the_suffix_never_matches_itself_and_short_matches_wait_for_min_ngram():
    assert ContextIndex(LookupConfig(min_ngram=1, max_ngram=2), [1, 2, 3]).propose(4) == []
    idx = ContextIndex(LookupConfig(min_ngram=2, max_ngram=2), [1, 2, 3, 2])
    assert idx.propose(4) == []  # "3 2" is new; the lone "2" is shorter than min_ngram
    idx.extend([3])  # "2 3" followed by 2
    assert idx.propose(4) == [2, 3]
    # A run of one token copies itself: the overlap is what a repetition looks like.
    assert ContextIndex(LookupConfig(max_tokens=4, min_ngram=2, max_ngram=2), [7, 7, 7]).propose(8) == [7]


def test_bad_lookup_settings_are_refused_in_one_line():
    assert parse_ngram_range("2-4") == (2, 4) and parse_ngram_range("3") == (3, 3)
    for bad in ("4-2", "0-2", "a-b", "2-", "", "1-2-3"):
        with pytest.raises(InvalidArgument, match="MIN-MAX"):
            parse_ngram_range(bad)
    for cfg in (LookupConfig(max_tokens=0), LookupConfig(min_ngram=0), LookupConfig(min_ngram=3, max_ngram=2)):
        with pytest.raises(InvalidArgument):
            DecodeConfig(lookup=cfg).validate()


@pytest.mark.parametrize("target", [p[3] for p in PAIRS])
def test_greedy_output_with_copied_drafts_equals_target_only(models, target):  # noqa: F811
    d, t = models[target]
    tgt, drf = load_model(t), load_model(d)
    cache = NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size)
    dec = SpeculativeDecoder(tgt, drf, cache)
    copied = accepted = 0
    for k, prompt in enumerate(PROMPTS):
        ref = dec.generate(prompt, DecodeConfig(max_new_tokens=24, mode="target-only"))
        for mode in ("dm", "ngram"):
            lookup = LookupConfig(max_tokens=1 + k % 6, min_ngram=1 + k % 2, max_ngram=3)
            out = dec.generate(prompt, DecodeConfig(max_new_tokens=24, mode=mode, draft_len=1 + k % 3, lookup=lookup))
            assert out.token_ids == ref.token_ids, (mode, prompt)
            assert out.text == ref.text
            st = out.stats
            assert st.lookup_proposed <= st.proposed and st.lookup_accepted <= st.accepted
            copied += st.lookup_rounds
            accepted += st.lookup_accepted
    assert copied > 0 and accepted > 0  # random tiny models repeat themselves: the lookup is exercised


def _joint(dec, n, t_support, proposal):
    idx = {t: i for i, t in enumerate(t_support)}
    counts = np.zeros((len(t_support),) * 2)
    lookup = LookupConfig(max_tokens=2, min_ngram=1, max_ngram=1)
    for seed in range(n):
        cfg = DecodeConfig(max_new_tokens=2, temperature=1.0, mode="dm", seed=seed, draft_len=3, lookup=lookup)
        out = dec.generate("ab", cfg)
        counts[tuple(idx[t] for t in out.token_ids)] += 1
    return counts / n


def test_sampling_with_copied_drafts_follows_the_target_and_a_wrong_residual_fails(models, monkeypatch):  # noqa: F811
    tgt, drf, t_support = _sampling_pair(models)
    exact = _exact_target_joint(tgt, t_support, tgt.codec.encode("ab"))
    proposal = [t_support[0], t_support[3]]
    # Every round copies the same two tokens, whatever the context: only the accept rule decides.
    monkeypatch.setattr(spec_mod.ContextIndex, "propose", lambda self, limit: proposal[:limit])
    n = 2500
    spec = _joint(SpeculativeDecoder(tgt, drf), n, t_support, proposal)
    tv = 0.5 * np.abs(spec - exact).sum()
    # Sampling noise of a 49-cell histogram with n=2500 is ~0.04 TV (tests/test_speculative.py).
    assert tv < 0.075, f"copied drafts moved the sampled distribution: TV={tv:.3f}"
    # Negative control: a rejection that may redraw the rejected token over-weights the copied ones.
    monkeypatch.setattr(spec_mod, "residual", lambda p, q: p)
    wrong = _joint(SpeculativeDecoder(tgt, drf), n, t_support, proposal)
    assert 0.5 * np.abs(wrong - exact).sum() > 0.1
