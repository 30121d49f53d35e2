"""The device side: Flower's ClientApp around one online adaptation pass per round.

The train message carries the round's global adapter (``arrays``), the pair identity it belongs to
(``identity``) and the fleet configuration (``config``). The device resolves the pair from its own
model folders, refuses a global adapter of another pair, runs the pass on the next prompts of its
own shard, measures its local drafter on the streams it never sees, and replies with its adapter,
its identity, and ``num-examples`` = the verified target tokens it learned from.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import asdict

import torch

from omnidraft.errors import AdapterError

from . import data
from .config import FleetConfig, LocalConfig
from .learner import Learner
from .strategy import IDENTITY_KEYS


@functools.cache
def _learner(pair: str, local_json: str, seed: int) -> Learner:
    """One learner per process and pair: a client process serves many rounds (and in simulation
    many virtual clients), and the training program is lowered once."""
    from omnidraft.bench.engine import resolve_pair

    p = resolve_pair(pair)
    return Learner(drafter=p.drafter, target=p.target, local=LocalConfig(**json.loads(local_json)), seed=seed)


def learner_for(cfg: FleetConfig) -> Learner:
    return _learner(cfg.pair, json.dumps(asdict(cfg.local), sort_keys=True), cfg.seed)


def train(msg, context):
    """ClientApp train handler (registered in :func:`client_app`)."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    t0 = time.perf_counter()
    config = msg.content.config_records["config"]
    cfg = FleetConfig.from_json(str(config["fleet"]))
    rnd = int(config["server-round"])
    index = int(context.node_config.get("partition-id", 0))
    learner = learner_for(cfg)
    theirs = dict(msg.content.config_records.get("identity", {}))
    mine = learner.ident.metadata()
    if any(theirs.get(k) != mine[k] for k in IDENTITY_KEYS):
        raise AdapterError("the server's global adapter belongs to another drafter/target pair than this device's")
    global_adapter = {k: torch.from_numpy(v.numpy().copy()) for k, v in msg.content.array_records["arrays"].items()}
    prompts = data.client_prompts(
        index=index,
        clients=cfg.clients,
        streams=cfg.streams,
        round_=rnd,
        per_round=cfg.local.prompts_per_round,
        target=learner.target,
    )
    poisoned = index in cfg.poisoned
    res = learner.train(global_adapter, prompts, poisoned=poisoned)
    if poisoned:
        # Model replacement (Bagdasaryan et al., 2020): the attacker scales its change by the fleet
        # size so that it survives averaging; unscaled, one delta of N barely moves the global.
        res.adapter = {k: g + cfg.clients * (res.adapter[k] - g) for k, g in global_adapter.items()}
    unseen = data.unseen_streams(index, cfg.streams)
    metrics = {
        "partition-id": index,
        "num-examples": res.verified_tokens,
        "live-acceptance": res.live_acceptance,
        "rolled-back": int(res.rolled_back),
        "train-seconds": time.perf_counter() - t0,
    }
    if unseen:
        tests = data.test_prompts(tuple(unseen), cfg.eval.prompts_per_stream, learner.target)
        m = learner.acceptance(res.adapter, [p for s in unseen for p in tests[s]])
        metrics["local-unseen-acceptance"] = m.acceptance
    content = RecordDict(
        {
            "arrays": ArrayRecord(torch_state_dict=res.adapter),
            "metrics": MetricRecord(metrics),
            "identity": ConfigRecord(mine),
        }
    )
    return Message(content, reply_to=msg)


def client_app():
    from flwr.clientapp import ClientApp

    app = ClientApp()
    app.train()(train)
    return app
