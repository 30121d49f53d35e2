"""A device's round on a tiny pair, and greedy exactness of the averaged (global) drafter."""

from __future__ import annotations

import pytest
import torch

from omnidraft.fleet import data
from omnidraft.fleet.aggregate import check_adapter, fedavg
from omnidraft.fleet.config import LocalConfig
from omnidraft.fleet.learner import Learner

PROMPTS = [
    "def add(a, b):\n    return a + b\n\nprint(",
    "The quick brown fox jumps over",
    "for i in range(10):\n    print(",
    "Once upon a time, in a land far away,",
]


@pytest.fixture(scope="module")
def learner(tiny_pair):
    d, t = tiny_pair
    local = LocalConfig(prompts_per_round=2, max_new_tokens=10, rank=2, lr=3e-2, engine="eager", guard_margin=1.0)
    yield Learner(drafter=d, target=t, local=local)


def test_a_round_returns_an_adapter_of_the_same_layout_and_its_verified_tokens(learner):
    start = learner.initial
    res = learner.train(start, PROMPTS[:2])
    assert check_adapter(res.adapter, start) is None
    assert res.verified_tokens > 0 and res.updates == 1
    assert any(not torch.equal(res.adapter[k], start[k]) for k in start)


def test_a_poisoned_round_learns_something_else(learner):
    start = learner.initial
    honest = learner.train(start, PROMPTS[:2]).adapter
    poisoned = learner.train(start, PROMPTS[:2], poisoned=True).adapter
    assert any(not torch.allclose(honest[k], poisoned[k]) for k in start)


def test_greedy_output_with_the_global_drafter_is_target_only_output(learner):
    start = learner.initial
    deltas = [learner.train(start, PROMPTS[i : i + 2]).adapter for i in (0, 2)]
    glob = fedavg(deltas, [3.0, 1.0])
    assert any(not torch.equal(glob[k], start[k]) for k in start)
    spec = learner.acceptance(glob, PROMPTS)
    ref = learner.acceptance(glob, PROMPTS, mode="target-only")
    assert spec.proposed > 0 and spec.outputs == ref.outputs


def test_shards_are_disjoint_and_unseen_streams_are_the_rest():
    streams = ("code", "math", "text")
    assert data.client_streams(0, streams) == ["code"] and data.unseen_streams(0, streams) == ["math", "text"]
    assert data.client_streams(1, streams) == ["math", "text"] and data.unseen_streams(1, streams) == ["code"]
    target = None  # prompts as they are (no chat template)
    a = data.client_prompts(index=0, clients=6, streams=streams, round_=1, per_round=3, target=target)
    b = data.client_prompts(index=3, clients=6, streams=streams, round_=1, per_round=3, target=target)
    later = data.client_prompts(index=0, clients=6, streams=streams, round_=2, per_round=3, target=target)
    assert not set(a) & set(b) and not set(a) & set(later)
    probe = data.probe_prompts(streams, 2, target)
    assert not set(probe) & set(a + b + later)


def test_shards_probe_and_held_out_each_span_every_source_of_a_stream():
    # A split lists its sources one after another; each draw must mix them, or the server's guard
    # judges aggregates on other prompts than the held-out set scores.
    from omnidraft.models.streams import load_stream

    streams = ("code", "text")

    def kind(prompt_id: str) -> str:
        name = prompt_id.split("/")[1].split(":")[0]
        return name if name in ("HumanEval", "stdlib", "pydoc") else "literature"

    source = {p.prompt: kind(p.id) for s in streams for sp in ("train", "test") for p in load_stream(s, sp)}
    shard = [
        p
        for i in range(6)
        for r in (1, 2)
        for p in data.client_prompts(index=i, clients=6, streams=streams, round_=r, per_round=4, target=None)
    ]
    held = data.test_prompts(streams, 12, None)
    for s, sources in (("code", {"HumanEval", "stdlib"}), ("text", {"literature", "pydoc"})):
        probe = data.probe_prompts((s,), 16, None)
        assert {source[p] for p in probe} == sources
        assert {source[p] for p in held[s]} == sources
        assert {source[p] for p in shard if source[p] in sources} == sources
        assert len(set(held[s])) == 12
    assert data.test_prompts(("math",), 500, None)["math"] == data.test_prompts(("math",), 100, None)["math"]
