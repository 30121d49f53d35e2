"""The server's strategy: Flower's FedAvg with omnidraft's checks in front of the average.

Each reply is checked in this order, and a refused one is left out of the round with one line:
its pair identity (a delta trained for another drafter or target), its layout (tensor names and
shapes), its values (NaN or infinite). The survivors are filtered for poisoning (``probe``: each
delta is scored alone on the server's probe set, as Zeno scores updates on a server-side batch, and
one whose agreement with the target falls more than the margin below both the round's median score
and the round's starting adapter is dropped; ``krum``: Multi-Krum's n - f picks), then averaged by verified tokens, A and B separately.
No survivor: the round publishes nothing and the last good global adapter stays.

Scoring each delta alone, not by how much the aggregate gains without it: averaging dilutes one
delta by its share of the verified tokens, so a leave-one-out gain shrinks with the fleet and with
the attacker's weight, while a delta that points away from the target scores low alone whatever its
weight. The median is the honest majority's; an honest delta that moved less than the others still
scores about where the round started, hence the lower of the two as the reference.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from .aggregate import Adapter, add_dp_noise, check_adapter, fedavg, flat, krum_keep
from .config import ServerConfig

IDENTITY_KEYS = ("drafter_tokenizer", "drafter_weights", "target_tokenizer", "target_weights")


@dataclass
class Reply:
    client: int  # the device's partition id
    adapter: Adapter
    weight: float  # verified tokens
    identity: dict
    metrics: dict = field(default_factory=dict)
    nbytes: int = 0


@dataclass
class RoundOutcome:
    adapter: Adapter | None
    kept: list[Reply]
    excluded: dict[int, str]  # client -> reason
    failed: int = 0  # error replies (a client that raised or dropped out mid-round)
    replies: list[Reply] = field(default_factory=list)  # every parsed reply, kept or not
    probe_alone: dict[int, float] = field(default_factory=dict)  # client -> its delta's own probe agreement


def check_reply(reply: Reply, identity: dict, reference: Adapter) -> str | None:
    for key in IDENTITY_KEYS:
        if reply.identity.get(key) != identity[key]:
            who = key.split("_")[0]
            return f"delta trained for another {who} ({key.split('_')[1]} differ); refused"
    why = check_adapter(reply.adapter, reference)
    return f"{why}; refused" if why else None


def aggregate(
    replies: list[Reply],
    *,
    identity: dict,
    current: Adapter,
    cfg: ServerConfig,
    probe: Callable[[Adapter], float] | None = None,
    generator: torch.Generator | None = None,
) -> RoundOutcome:
    excluded: dict[int, str] = {}
    scores: dict[int, float] = {}
    ok = []
    for r in replies:
        why = check_reply(r, identity, current)
        if why:
            excluded[r.client] = why
        else:
            ok.append(r)
    if cfg.filter == "krum" and len(ok) > 2:
        keep = set(krum_keep([flat(r.adapter, current) for r in ok], cfg.krum_byzantine))
        for i, r in enumerate(ok):
            if i not in keep:
                excluded[r.client] = "Krum: farthest from the other updates"
        ok = [r for i, r in enumerate(ok) if i in keep]
    elif cfg.filter == "probe" and probe is not None and len(ok) > 1:
        ok = _probe_filter(ok, probe, current=current, margin=cfg.probe_margin, excluded=excluded, scores=scores)
    if not ok:
        return RoundOutcome(None, [], excluded, replies=list(replies), probe_alone=scores)
    avg = fedavg([r.adapter for r in ok], [r.weight for r in ok])
    if cfg.dp_noise > 0:
        avg = add_dp_noise(
            avg, previous=current, std=cfg.dp_noise, generator=generator or torch.Generator().manual_seed(0)
        )
    return RoundOutcome(avg, ok, excluded, replies=list(replies), probe_alone=scores)


def _probe_filter(
    ok: list[Reply], probe: Callable[[Adapter], float], *, current: Adapter, margin: float, excluded: dict, scores: dict
) -> list[Reply]:
    """Drop the deltas whose own probe agreement falls more than ``margin`` below both the round's
    median and the round's starting adapter: a device whose pass moved little (or rolled back)
    scores about where the round started, and is kept however far the others moved."""
    for r in ok:
        scores[r.client] = probe(r.adapter)
    ref = min(statistics.median(scores[r.client] for r in ok), probe(current))
    kept = []
    for r in ok:
        if scores[r.client] < ref - margin:
            excluded[r.client] = (
                f"probe: its agreement with the target alone is {scores[r.client]:.3f}, "
                f"more than {margin} below {ref:.3f} (the round's median or starting agreement)"
            )
        else:
            kept.append(r)
    return kept


def _make_strategy_class():
    from flwr.serverapp.strategy import FedAvg

    class FleetStrategy(FedAvg):
        """FedAvg whose aggregate_train runs :func:`aggregate`; ``current`` is the round's global adapter."""

        def __init__(self, *, clients: int, identity: dict, cfg: ServerConfig, probe=None) -> None:
            super().__init__(min_train_nodes=clients, min_available_nodes=clients)
            self.identity, self.cfg, self.probe = identity, cfg, probe
            self.current: Adapter = {}
            self.outcome: RoundOutcome | None = None

        def summary(self) -> None:  # Flower logs its own summary; ours goes into the report
            return None

        def aggregate_train(self, server_round: int, replies: Iterable):
            valid, errors = self._check_and_log_replies(list(replies), is_train=True, validate=False)
            parsed = [from_message(m) for m in valid]
            out = aggregate(
                parsed,
                identity=self.identity,
                current=self.current,
                cfg=self.cfg,
                probe=self.probe,
                generator=torch.Generator().manual_seed(server_round),
            )
            out.failed = len(errors)
            for client, why in sorted(out.excluded.items()):
                print(f"fleet: round {server_round}: client {client}: {why}", file=sys.stderr)
            self.outcome = out
            if out.adapter is None:
                return None, None
            from flwr.app import ArrayRecord

            return ArrayRecord(torch_state_dict=out.adapter), None

    return FleetStrategy


def FleetStrategy(**kw):  # noqa: N802 - a class built on first use, so Flower stays an optional import
    return _make_strategy_class()(**kw)


def from_message(msg) -> Reply:
    """A client's reply as tensors and metrics (what it sent, unchecked)."""
    content = msg.content
    arrays = content.array_records.get("arrays")
    adapter = {k: torch.from_numpy(v.numpy().copy()) for k, v in arrays.items()} if arrays is not None else {}
    metrics = dict(content.metric_records.get("metrics", {}))
    identity = dict(content.config_records.get("identity", {}))
    return Reply(
        client=int(metrics.get("partition-id", -1)),
        adapter=adapter,
        weight=float(metrics.get("num-examples", 0)),
        identity=identity,
        metrics=metrics,
        nbytes=sum(int(v.numel() * v.element_size()) for v in adapter.values()),
    )
