"""Answer memory: continuation counts over earlier generations, eviction, its file, greedy exactness
when its proposals replace drafts, and `generate --lookup-memory`."""

from __future__ import annotations

import json

import pytest
from test_cli_generate import _refused, pair, run  # noqa: F401
from test_speculative import PAIRS, PROMPTS, models  # noqa: F401

from omnidraft.errors import CacheFileError, InvalidArgument
from omnidraft.runtime.answer_memory import AnswerMemory, MemoryConfig
from omnidraft.runtime.context_lookup import LookupConfig
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.loader import load_model
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder

TOK = "0" * 64


def test_the_most_frequent_continuation_of_the_longest_match_is_chained():
    m = AnswerMemory(TOK, MemoryConfig(min_ngram=2, max_ngram=3, min_count=1, min_share=0.5))
    m.add([1, 2, 3, 4, 5])
    m.add([9, 2, 3, 4, 6])
    m.add([8, 2, 3, 7])
    # "2 3" -> 4 twice, 7 once; then "2 3 4" -> 5 and 6 once each: a tie at half, proposed (first seen).
    assert m.propose([0, 2, 3], 8) == [4, 5]
    assert m.propose([0, 2, 3], 1) == [4]  # the caller's room caps the chain
    # The longest match decides: "8 2 3" was followed by 7 alone, though "2 3" mostly by 4.
    assert m.propose([8, 2, 3], 1) == [7]
    assert m.propose([5, 5], 4) == []  # never seen


def test_unsure_continuations_stop_the_chain():
    m = AnswerMemory(TOK, MemoryConfig(min_ngram=2, max_ngram=2, min_count=2, min_share=0.6))
    for tail in ([3, 4], [3, 4], [3, 5]):
        m.add([1, 2, *tail])
    assert m.propose([1, 2], 4) == [3, 4]  # 3 after "1 2" three times; 4 after "2 3" 2 of 3 (>= 0.6)
    m.add([1, 2, 3, 5])
    assert m.propose([1, 2], 4) == [3]  # now 4 and 5 split "2 3" evenly: below the share
    strict = AnswerMemory(TOK, MemoryConfig(min_ngram=2, max_ngram=2, min_count=3))
    strict.add([1, 2, 3])
    strict.add([1, 2, 3])
    assert strict.propose([1, 2], 4) == []  # seen twice, fewer than min_count


def test_the_oldest_generations_leave_past_capacity_and_their_counts_with_them():
    m = AnswerMemory(TOK, MemoryConfig(capacity=8, min_ngram=2, max_ngram=2, min_count=1))
    m.add([1, 2, 3, 4])
    m.add([5, 6, 7, 8])
    assert len(m) == 2 and m.tokens == 8 and m.propose([1, 2], 2) == [3, 4]
    m.add([9, 9, 9])  # 11 tokens: the first generation leaves
    assert len(m) == 2 and m.tokens == 7
    assert m.propose([1, 2], 2) == [] and m.propose([5, 6], 2) == [7, 8]
    assert all(m.counts.values()) and (1, 2) not in m.counts  # nothing left at zero
    m.add(list(range(20)))  # longer than capacity alone: its last 8 tokens are kept
    assert len(m) == 1 and m.tokens == 8 and m.propose([12, 13], 1) == [14] and m.propose([2, 3], 1) == []
    m.add([1, 2])  # too short to hold an n-gram and its continuation
    assert len(m) == 1


def test_bad_memory_settings_are_refused():
    for cfg in (
        MemoryConfig(capacity=0),
        MemoryConfig(min_ngram=3, max_ngram=2),
        MemoryConfig(min_count=0),
        MemoryConfig(min_share=1.5),
        MemoryConfig(min_share=float("nan")),
    ):
        with pytest.raises(InvalidArgument, match="answer memory"):
            AnswerMemory(TOK, cfg)


def test_the_file_round_trips_and_bad_files_are_refused_in_one_line(tmp_path):
    m = AnswerMemory(TOK, MemoryConfig(capacity=100, min_count=1))
    m.add([1, 2, 3, 4, 5, 6])
    m.add([7, 2, 3, 4, 9])
    path = tmp_path / "memory.json"
    m.save(path)
    back = AnswerMemory.load(path, TOK, 10)
    assert back.cfg == m.cfg and list(back.sequences) == list(m.sequences) and back.counts == m.counts
    good = json.loads(path.read_text())

    def refused(doc_or_bytes, needle, *, tokenizer=TOK, width=10):
        bad = tmp_path / "bad.json"
        bad.write_bytes(doc_or_bytes if isinstance(doc_or_bytes, bytes) else json.dumps(doc_or_bytes).encode())
        with pytest.raises(CacheFileError, match=needle) as e:
            AnswerMemory.load(bad, tokenizer, width)
        assert "\n" not in str(e.value) and "delete it" in str(e.value)

    refused(path.read_bytes(), "another target tokenizer", tokenizer="1" * 64)
    refused(path.read_bytes(), r"token ids in \[0, 8\)", width=8)
    refused(path.read_bytes()[:-9], "not valid JSON")
    refused({**good, "format": "omnidraft-ngram-cache"}, "not an omnidraft answer memory")
    refused({**good, "sequences": [[1, 2, "3"]]}, "sequence 0")
    refused({**good, "sequences": {"0": [1, 2]}}, "'sequences' must be a list")
    refused({**good, "config": {**good["config"], "max_ngram": 1}}, "longest")
    refused({**good, "config": {**good["config"], "min_share": 2}}, "min_share")
    with pytest.raises(CacheFileError, match="not a regular file"):
        AnswerMemory.load(tmp_path, TOK, 10)


@pytest.mark.parametrize("target", [p[3] for p in PAIRS])
def test_greedy_output_with_remembered_drafts_equals_target_only(models, target):  # noqa: F811
    d, t = models[target]
    tgt, drf = load_model(t), load_model(d)
    memory = AnswerMemory(tgt.codec.sha256, MemoryConfig(min_count=1, min_share=0.0))
    cache = NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size)
    dec = SpeculativeDecoder(tgt, drf, cache, memory=memory)
    plain = SpeculativeDecoder(tgt)
    remembered = accepted = 0
    for k, prompt in enumerate(PROMPTS):
        ref = plain.generate(prompt, DecodeConfig(max_new_tokens=24, mode="target-only"))
        # The memory learns every generation: by the second round of prompts it has seen each answer.
        for mode in ("dm", "ngram", "ngram"):
            lookup = LookupConfig(max_tokens=1 + k % 6, min_ngram=3, max_ngram=4)
            out = dec.generate(prompt, DecodeConfig(max_new_tokens=24, mode=mode, draft_len=1 + k % 3, lookup=lookup))
            assert out.token_ids == ref.token_ids, (mode, prompt)
            st = out.stats
            assert st.memory_proposed <= st.lookup_proposed and st.memory_accepted <= st.lookup_accepted
            remembered += st.memory_rounds
            accepted += st.memory_accepted
    assert remembered > 0 and accepted > 0
    assert len(memory) == 3 * len(PROMPTS)


def test_generate_keeps_the_memory_across_runs_and_refuses_a_bad_one(pair, capsys, tmp_path):  # noqa: F811
    d, t = pair
    mem = tmp_path / "memory.json"
    argv = ["--drafter", d, "--target", t, "--prompt", "def f(x):", "--max-new-tokens", 12, "--json"]
    code, out, _ = run(capsys, *argv, "--lookup-memory", mem)
    assert code == 0 and json.loads(out)["memory_generations"] == 1
    first = json.loads(out)["token_ids"]
    code, out, _ = run(capsys, *argv, "--lookup-memory", mem)
    doc = json.loads(out)
    assert code == 0 and doc["memory_generations"] == 2 and doc["token_ids"] == first
    assert doc["memory_rounds"] > 0  # the same prompt again: the memory knows the answer
    saved = mem.read_bytes()
    mem.write_bytes(saved[:-5])
    _refused(capsys, [*argv, "--lookup-memory", mem], "answer memory")
    assert mem.read_bytes() == saved[:-5]  # a refused file is left as it was
