"""The server's strategy: Flower's FedAvg with omnidraft's checks in front of the average.

Each reply is checked in this order, and a refused one is left out of the round with one line:
its pair identity (a delta trained for another drafter or target), its layout (tensor names and
shapes), its values (NaN or infinite). The survivors are filtered for poisoning (``probe``:
leave-one-out on the server's probe set, the delta whose removal raises the aggregate's agreement
with the target by more than the margin is dropped, repeatedly; ``krum``: Multi-Krum's n - f
picks), then averaged by verified tokens, A and B separately. No survivor: the round publishes
nothing and the last good global adapter stays.
"""

from __future__ import annotations

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
        ok = _probe_filter(ok, probe, cfg.probe_margin, excluded)
    if not ok:
        return RoundOutcome(None, [], excluded, replies=list(replies))
    avg = fedavg([r.adapter for r in ok], [r.weight for r in ok])
    if cfg.dp_noise > 0:
        avg = add_dp_noise(
            avg, previous=current, std=cfg.dp_noise, generator=generator or torch.Generator().manual_seed(0)
        )
    return RoundOutcome(avg, ok, excluded, replies=list(replies))


def _probe_filter(
    ok: list[Reply], probe: Callable[[Adapter], float], margin: float, excluded: dict[int, str]
) -> list[Reply]:
    """Drop, one at a time, the delta whose removal raises the aggregate's probe agreement most,
    while that gain exceeds ``margin`` (a poisoned delta drags the whole average down)."""
    while len(ok) > 1:
        full = probe(fedavg([r.adapter for r in ok], [r.weight for r in ok]))
        without = []
        for i in range(len(ok)):
            rest = ok[:i] + ok[i + 1 :]
            without.append(probe(fedavg([r.adapter for r in rest], [r.weight for r in rest])))
        worst = max(range(len(ok)), key=lambda i: without[i])
        if without[worst] <= full + margin:
            break
        excluded[ok[worst].client] = (
            f"probe: the aggregate's agreement rises {full:.3f} -> {without[worst]:.3f} without this delta"
        )
        ok = ok[:worst] + ok[worst + 1 :]
    return ok


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
