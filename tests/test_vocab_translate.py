"""Direct map, translation, Eq. 2 and reverse translation on real tokenizers (no models needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.tokenizer import load_codec
from omnidraft.runtime.translate import DrafterContext, harvest_ngrams, proposal_prob, q_prime_full, translate
from omnidraft.runtime.vocab import build_vocab_map, string_intersection_size


@pytest.fixture(scope="module")
def spm(tokenizer_path):
    return load_codec(tokenizer_path("llama-spm"))


@pytest.fixture(scope="module")
def qwen(tokenizer_path):
    return load_codec(tokenizer_path("qwen2"))


@pytest.fixture(scope="module")
def pair(spm, qwen):
    return spm, qwen, build_vocab_map(spm, qwen)


@pytest.mark.parametrize("target,paper", [("qwen2", 22275), ("llama-bpe", 22416)])
def test_intersection_sizes_match_the_paper(tokenizer_path, spm, target, paper):
    tgt = load_codec(tokenizer_path(target))
    # The paper's string convention lands within 0.5 % of its Table 8 figure...
    assert abs(string_intersection_size(spm, tgt) - paper) / paper < 0.005
    # ...and the byte-exact map we use is a superset of its correct part (it adds multi-byte characters).
    vm = build_vocab_map(spm, tgt)
    assert paper * 0.98 < vm.size < paper * 1.25


def test_direct_map_pairs_spell_the_same_bytes(pair):
    spm, qwen, vm = pair
    assert np.all(vm.t2d[vm.target_ids] == vm.drafter_ids)
    for d, t in zip(vm.drafter_ids[::97], vm.target_ids[::97]):
        assert spm.token_bytes[d] == qwen.token_bytes[t] and spm.token_bytes[d]
    excluded = set(spm.byte_fallback) | set(spm.special)
    assert not excluded & set(vm.drafter_ids.tolist())
    assert spm.token_bytes[spm.encode("Hello")[0]] == b" Hello"  # "▁" normalised to a space


def _cache(spm, qwen, vm, capacity=None):
    return NgramCache(spm.sha256, qwen.sha256, len(vm.d2t), capacity)


def test_translate_prefers_longest_cached_ngram_then_direct_map(pair):
    spm, qwen, vm = pair
    d_fl, d_ake = spm.encode_continuation(" stamps")  # the paper's ('st', 'amps') -> 'stamps'
    (t_flake,) = qwen.encode(" stamps")
    cache = _cache(spm, qwen, vm)
    cache.observe((d_fl, d_ake), t_flake)
    d_the = spm.encode("the")[0]
    unmapped = next(iter(spm.byte_fallback))
    tr = translate([d_the, d_fl, d_ake, d_the, unmapped, d_the], vm, cache)
    assert tr.target_ids == [vm.d2t[d_the], t_flake, vm.d2t[d_the]]
    assert tr.spans == [(0, 1), (1, 3), (3, 4)]  # stops at the untranslatable byte-fallback token
    assert [k is not None for k in tr.keys] == [False, True, False]
    assert translate([d_the, d_fl, d_ake], vm, None).target_ids == [vm.d2t[d_the], vm.d2t[d_fl], vm.d2t[d_ake]]


def test_split_tokens_translate_to_the_target_tokens_spelling_them(spm, tokenizer_path):
    gpt2 = load_codec(tokenizer_path("gpt-2"))
    vm = build_vocab_map(spm, gpt2)
    (run8,) = [d for d in vm.splits if spm.token_bytes[d] == b" " * 8]
    assert vm.splits[run8] == (220,) * 8 and vm.d2t[run8] < 0 and vm.split_mask[run8]
    for d, tids in list(vm.splits.items())[::101]:
        assert gpt2.spell(list(tids)) == spm.token_bytes[d] and len(tids) >= 2 and vm.d2t[d] < 0
    d_if = spm.encode("if")[0]
    tr = translate([run8, d_if, run8], vm, None, splits=True)
    assert tr.target_ids == [220] * 8 + [vm.d2t[d_if]] + [220] * 8
    assert tr.spans == [(0, 1)] * 8 + [(1, 2)] + [(2, 3)] * 8 and not any(tr.keys)
    assert translate([run8, d_if], vm, None).target_ids == []  # without splits the proposal ends at once


def test_eq2_q_prime_keeps_the_mass_and_splits_the_prefix(pair):
    spm, qwen, vm = pair
    rng = np.random.default_rng(0)
    width_d, width_t = len(vm.d2t), len(vm.t2d)
    q_rows = [rng.dirichlet(np.ones(width_d) * 0.05) for _ in range(4)]
    d1, d2, d3 = spm.encode_continuation(" quizzes")  # ('qu', 'izz', 'es') -> 'quizzes'
    (t,) = qwen.encode(" quizzes")
    cache = _cache(spm, qwen, vm)
    cache.observe((d1, d2, d3), t)
    draft = [d1, d2, d3, spm.encode("the")[0]]
    tr = translate(draft, vm, cache)
    full = q_prime_full(0, tr, draft, q_rows, vm, width_t)
    mapped_mass = q_rows[0][vm.drafter_ids].sum()
    assert full.sum() == pytest.approx(mapped_mass, rel=1e-12)
    prod = q_rows[0][d1] * q_rows[1][d2] * q_rows[2][d3]
    assert full[t] == pytest.approx(prod + (q_rows[0][vm.t2d[t]] if vm.t2d[t] >= 0 else 0))
    assert full[vm.d2t[d1]] == pytest.approx(q_rows[0][d1] - prod)
    assert proposal_prob(0, tr, draft, q_rows, vm) == pytest.approx(full[t])
    # Direct-mapped positions carry the drafter probability unchanged.
    assert q_prime_full(1, tr, draft, q_rows, vm, width_t)[vm.d2t[draft[3]]] == pytest.approx(q_rows[3][draft[3]])


def test_harvest_aligns_boundaries_and_skips_straddles(pair):
    spm, qwen, vm = pair
    cache = _cache(spm, qwen, vm)
    window = [(1, 0, 2), (2, 2, 5), (3, 5, 6), (4, 6, 9)]
    targets = [(100, 0, 5), (101, 5, 7), (102, 7, 9)]  # 100 = tokens 1+2; 101 straddles; 102 ends inside 4
    assert harvest_ngrams(window, targets, vm, cache) == 1
    assert cache.get((1, 2)) == 100 and len(cache) == 1


# Any character, and often what the tokenizer does not spell as it is: a literal "▁" (U+2581), which
# SentencePiece's normalizer makes a space, and a special token's text ("<s>" encodes to the id 1).
TEXT = st.lists(
    st.one_of(st.characters(blacklist_categories=("Cs",)), st.sampled_from(["\u2581", " ", "a", "\n", "<s>", "</s>"])),
    min_size=1,
    max_size=30,
).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=TEXT, pieces=st.lists(TEXT, min_size=1, max_size=6), cut=st.integers(0, 3))
def test_reverse_translation_round_trips_text(spm, prompt, pieces, cut):
    """Appending target bytes in arbitrary chunks (even splitting UTF-8 characters) keeps the drafter
    context spelling exactly the accepted text, with consistent byte offsets."""
    ctx = DrafterContext(spm, prompt, lookbehind=4)
    data = "".join(pieces).encode("utf-8")
    chunks = [data[i : i + 1 + cut] for i in range(0, len(data), 1 + cut)]
    for ch in chunks:
        window = ctx.append(ch)
        for tid, a, b in window:
            assert ctx.text[a:b] == spm.token_bytes[tid][-(b - a) :] if b > a else True
    full = (prompt + "".join(pieces)).encode("utf-8")
    spelled = spm.spell(ctx.tokens)
    assert spelled in (full, b" " + full)  # SentencePiece spells its prepended "▁" as a space
    assert ctx.starts == sorted(ctx.starts)


def test_the_drafter_context_spells_literal_markers_and_special_token_text(spm):
    # The tokenizer spells a literal "▁" as a space and "<s>" as nothing; the context spells both as
    # they are (the same cut as the Android codec's, pinned by its vectors' "exact" encodings).
    prompt, pieces = "x\u2581y <s>", [" a\u2581", "\u2581b</s", "> c <s", ">\n\u2581 d"]
    ctx = DrafterContext(spm, prompt, lookbehind=4)
    for p in pieces:
        for tid, a, b in ctx.append(p.encode("utf-8")):
            assert ctx.text[a:b] == spm.token_bytes[tid][-(b - a) :] if b > a else True
    assert spm.spell(ctx.tokens) == b" " + (prompt + "".join(pieces)).encode("utf-8")
    assert 1 not in ctx.tokens and 2 not in ctx.tokens  # no <s> or </s> ids inside the text
