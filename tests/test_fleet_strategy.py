"""Fleet aggregation without models: FedAvg of LoRA factors, the A/B-vs-BA gap, Krum, the probe
filter, and every refusal (another pair, wrong shape, NaN) keeping the last good adapter."""

from __future__ import annotations

import statistics

import pytest
import torch

from omnidraft.fleet.aggregate import check_adapter, fedavg, flat, krum_keep, merged_gap
from omnidraft.fleet.config import ServerConfig
from omnidraft.fleet.strategy import Reply, aggregate

IDENT = {
    "drafter_tokenizer": "d" * 64,
    "drafter_weights": "w" * 64,
    "target_tokenizer": "t" * 64,
    "target_weights": "u" * 64,
}
A, B = "m.q_proj.lora_A.weight", "m.q_proj.lora_B.weight"


def _adapter(seed: int, a: torch.Tensor | None = None, scale: float = 0.1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        A: a.clone() if a is not None else torch.randn(4, 16, generator=g),
        B: torch.randn(16, 4, generator=g) * scale,
    }


def _reply(client: int, adapter, weight: float = 10.0, identity=None) -> Reply:
    return Reply(client=client, adapter=adapter, weight=weight, identity=dict(identity or IDENT))


def test_fedavg_weights_each_tensor_by_verified_tokens():
    x, y = _adapter(1), _adapter(2)
    avg = fedavg([x, y], [3.0, 1.0])
    assert torch.allclose(avg[B], 0.75 * x[B] + 0.25 * y[B])
    assert torch.allclose(avg[A], 0.75 * x[A] + 0.25 * y[A])


def test_averaging_factors_is_exact_only_while_clients_share_A():
    shared = torch.randn(4, 16)
    same_a = [_adapter(s, a=shared) for s in range(4)]
    assert merged_gap(same_a, [1.0] * 4) < 1e-6  # B-bar A = mean(B_i A) when every A_i = A
    moved = [_adapter(s) for s in range(4)]
    assert merged_gap(moved, [1.0] * 4) > 0.3  # independent A_i: B-bar A-bar is far from mean(B_i A_i)


def test_check_adapter_names_the_problem():
    ref = _adapter(0)
    assert check_adapter(_adapter(1), ref) is None
    assert "shape" in check_adapter({A: torch.zeros(8, 16), B: ref[B]}, ref)
    assert "NaN" in check_adapter({A: ref[A], B: torch.full_like(ref[B], float("nan"))}, ref)
    assert "missing" in check_adapter({A: ref[A]}, ref)


def test_a_delta_for_another_target_is_refused_and_left_out():
    current = _adapter(0)
    other = dict(IDENT, target_weights="x" * 64)
    out = aggregate(
        [_reply(0, _adapter(1)), _reply(1, _adapter(2), identity=other)],
        identity=IDENT,
        current=current,
        cfg=ServerConfig(filter="none"),
    )
    assert list(out.excluded) == [1] and "another target" in out.excluded[1]
    assert "\n" not in out.excluded[1]
    assert torch.equal(out.adapter[B], _adapter(1)[B])


def test_nan_and_wrong_shape_deltas_leave_the_last_good_adapter():
    current = _adapter(0)
    nan = {A: current[A], B: torch.full_like(current[B], float("nan"))}
    wrong = {A: torch.zeros(8, 16), B: torch.zeros(16, 8)}
    out = aggregate(
        [_reply(0, nan), _reply(1, wrong)], identity=IDENT, current=current, cfg=ServerConfig(filter="none")
    )
    assert out.adapter is None  # nothing usable: the server keeps publishing the previous version
    assert sorted(out.excluded) == [0, 1]


def _poisoned_setup():
    shared = torch.randn(4, 16, generator=torch.Generator().manual_seed(9))
    current = {A: shared.clone(), B: torch.zeros(16, 4)}
    good_dir = torch.randn(16, 4, generator=torch.Generator().manual_seed(5))
    honest = [{A: shared.clone(), B: good_dir * 0.1 + 0.01 * torch.randn(16, 4)} for _ in range(5)]
    poisoned = {A: shared.clone(), B: -good_dir * 3.0}
    return current, good_dir, honest, poisoned


def test_probe_filter_drops_the_delta_that_lowers_agreement():
    current, good_dir, honest, poisoned = _poisoned_setup()

    def probe(adapter):  # agreement rises with movement along the honest direction
        return float(torch.sigmoid((adapter[B] * good_dir).sum()))

    replies = [_reply(i, a) for i, a in enumerate(honest)] + [_reply(5, poisoned)]
    out = aggregate(replies, identity=IDENT, current=current, cfg=ServerConfig(filter="probe"), probe=probe)
    assert sorted(out.excluded) == [5] and "probe" in out.excluded[5]
    assert probe(out.adapter) > probe(current)
    # Without the filter the poisoned delta drags the aggregate below where it started.
    plain = aggregate(replies, identity=IDENT, current=current, cfg=ServerConfig(filter="none"))
    assert probe(plain.adapter) < probe(current)


def test_probe_filter_drops_a_poisoned_delta_however_little_weight_it_carries():
    # Diluted by its small share of verified tokens, the poisoned delta moves the aggregate less than
    # the margin (a leave-one-out test would keep it), yet alone it scores far below the rest.
    current, good_dir, honest, poisoned = _poisoned_setup()

    def probe(adapter):
        return float(torch.sigmoid((adapter[B] * good_dir).sum() / 10))

    replies = [_reply(i, a, weight=10.0) for i, a in enumerate(honest)] + [_reply(5, poisoned, weight=0.2)]
    with_it = probe(fedavg([r.adapter for r in replies], [r.weight for r in replies]))
    without = probe(fedavg(honest, [10.0] * len(honest)))
    assert 0 < without - with_it < ServerConfig().probe_margin
    out = aggregate(replies, identity=IDENT, current=current, cfg=ServerConfig(filter="probe"), probe=probe)
    assert sorted(out.excluded) == [5] and "alone" in out.excluded[5]
    assert out.probe_alone[5] < 0.01 < min(out.probe_alone[i] for i in range(5))
    assert probe(out.adapter) == pytest.approx(without)


def test_probe_filter_keeps_honest_deltas_that_moved_less_than_the_rest():
    # Honest devices move by different amounts (a rolled-back one not at all): the slow ones score
    # well below the round's median but not below where the round started, so none is dropped.
    current, good_dir, _, _ = _poisoned_setup()

    def probe(adapter):
        return float(torch.sigmoid((adapter[B] * good_dir).sum() / 10))

    honest = [{A: current[A].clone(), B: good_dir * k} for k in (0.0, 0.05, 0.1, 0.15, 0.2)]
    out = aggregate(
        [_reply(i, a) for i, a in enumerate(honest)],
        identity=IDENT,
        current=current,
        cfg=ServerConfig(filter="probe"),
        probe=probe,
    )
    assert statistics.median(out.probe_alone.values()) - out.probe_alone[0] > ServerConfig().probe_margin
    assert out.excluded == {} and len(out.kept) == 5


def test_krum_keeps_the_cluster_and_drops_the_outlier():
    current, _, honest, poisoned = _poisoned_setup()
    vecs = [flat(a, current) for a in honest + [poisoned]]
    assert 5 not in krum_keep(vecs, byzantine=1)
    replies = [_reply(i, a) for i, a in enumerate(honest)] + [_reply(5, poisoned)]
    out = aggregate(replies, identity=IDENT, current=current, cfg=ServerConfig(filter="krum"))
    assert 5 in out.excluded and len(out.kept) == 5


def test_dp_noise_moves_the_aggregate_but_not_the_refusals():
    current, _, honest, _ = _poisoned_setup()
    replies = [_reply(i, a) for i, a in enumerate(honest)]
    clean = aggregate(replies, identity=IDENT, current=current, cfg=ServerConfig(filter="none"))
    noisy = aggregate(replies, identity=IDENT, current=current, cfg=ServerConfig(filter="none", dp_noise=0.5))
    assert not torch.equal(clean.adapter[B], noisy.adapter[B]) and not noisy.excluded


def test_flower_strategy_counts_an_error_reply_as_failed_and_aggregates_the_rest(monkeypatch):
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_node_id", "_task_id"):  # what a running ServerApp process has set
        monkeypatch.setattr(TaskIdentity, name, 1)
    from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

    from omnidraft.fleet.strategy import FleetStrategy

    current = _adapter(0)
    s = FleetStrategy(clients=2, identity=IDENT, cfg=ServerConfig(filter="none"))
    s.current = current
    sent = Message(RecordDict({"config": ConfigRecord({"x": 1})}), dst_node_id=1, message_type="train")
    ok = Message(
        RecordDict(
            {
                "arrays": ArrayRecord(torch_state_dict=_adapter(1)),
                "metrics": MetricRecord({"partition-id": 0, "num-examples": 12}),
                "identity": ConfigRecord(IDENT),
            }
        ),
        reply_to=sent,
    )
    dropped = Message(Error(code=1, reason="node went away"), reply_to=sent)
    arrays, _ = s.aggregate_train(1, [ok, dropped])
    assert s.outcome.failed == 1 and [r.client for r in s.outcome.kept] == [0]
    assert torch.allclose(arrays.to_torch_state_dict()[B], _adapter(1)[B])
