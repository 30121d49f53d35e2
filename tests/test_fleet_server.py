"""The ServerApp's rounds on a tiny pair through an in-process grid: the report, refusals of bad
deltas (another pair, NaN, wrong shape, a device that never answers) without losing the last good
adapter, a restarted server resuming from its last published version, and greedy exactness of the
global drafter."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402

from omnidraft.adapt import delta  # noqa: E402
from omnidraft.errors import AdapterError  # noqa: E402
from omnidraft.fleet import client as fleet_client  # noqa: E402
from omnidraft.fleet.config import EvalConfig, FleetConfig, LocalConfig, ServerConfig  # noqa: E402
from omnidraft.fleet.server import serve_rounds  # noqa: E402
from omnidraft.fleet.store import GlobalStore  # noqa: E402


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_node_id", "_task_id"):  # what a running ServerApp process has set
        monkeypatch.setattr(TaskIdentity, name, 1)


class FakeGrid:
    """Delivers each message to the ClientApp's train handler in this process; ``faults`` maps a
    device id to what goes wrong with its reply."""

    def __init__(self, clients: int, faults: dict[int, str] | None = None) -> None:
        self.clients, self.faults = clients, faults or {}

    def get_node_ids(self):
        return list(range(1, self.clients + 1))

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for m in messages:
            device = m.metadata.dst_node_id - 1
            fault = self.faults.get(device)
            if fault == "disconnect":
                continue  # never answers: the round goes on without it
            ctx = Context(1, m.metadata.dst_node_id, {"partition-id": device}, RecordDict(), {})
            reply = fleet_client.train(m, ctx)
            arrays = reply.content["arrays"]
            if fault == "nan":
                name = next(iter(arrays))
                t = arrays.to_torch_state_dict()
                t[name] = torch.full_like(t[name], float("nan"))
                reply.content["arrays"] = type(arrays)(torch_state_dict=t)
            elif fault == "other-target":
                reply.content["identity"] = ConfigRecord(
                    {**dict(reply.content["identity"]), "target_weights": "0" * 64}
                )
            elif fault == "echo":  # sends back the global adapter it was given, unchanged
                reply.content["arrays"] = m.content["arrays"]
            elif fault == "shape":
                t = {k: v[..., :1].clone() for k, v in arrays.to_torch_state_dict().items()}
                reply.content["arrays"] = type(arrays)(torch_state_dict=t)
            replies.append(reply)
        return replies


def _cfg(tiny_pair, **kw) -> FleetConfig:
    d, t = tiny_pair
    base = dict(
        pair=f"{d},{t}",
        streams=("code", "text"),
        clients=3,
        rounds=1,
        local=LocalConfig(prompts_per_round=2, max_new_tokens=8, rank=2, engine="eager", guard_window=2),
        server=ServerConfig(filter="none", probe_prompts=1, guard=False),
        eval=EvalConfig(prompts_per_stream=1, greedy_check=0),
    )
    return FleetConfig(**{**base, **kw}).validate()


def test_a_round_reports_every_client_and_refuses_bad_deltas(tiny_pair, tmp_path, capsys):
    cfg = _cfg(tiny_pair, clients=4, eval=EvalConfig(prompts_per_stream=1, greedy_check=1))
    grid = FakeGrid(4, {1: "nan", 2: "other-target", 3: "disconnect"})
    rep = serve_rounds(grid, cfg, tmp_path)
    r = rep["rounds"][0]
    assert r["excluded_clients"] == [1, 2] and r["failed_clients"] == 1
    assert "NaN" in r["excluded_reasons"]["1"] and "another target" in r["excluded_reasons"]["2"]
    assert {"round", "global_acceptance", "client_acceptance", "excluded_clients", "bytes_per_client"} <= set(r)
    assert r["bytes_per_client"] > 0 and len(r["client_acceptance"]) == 3
    err = capsys.readouterr().err
    assert "client 2: delta trained for another target" in err and "Traceback" not in err
    for f in ("fleet.json", "fleet.md", "fleet.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert rep["greedy_identical"]["same"] == rep["greedy_identical"]["checked"] > 0


def test_no_usable_delta_keeps_the_last_good_global_adapter(tiny_pair, tmp_path):
    cfg = _cfg(tiny_pair, clients=2)
    serve_rounds(FakeGrid(2), cfg, tmp_path)
    learner = fleet_client.learner_for(cfg)
    store = GlobalStore(tmp_path / "global", learner.ident, cfg.local.rank)
    good = store.latest(learner.initial)
    cfg2 = _cfg(tiny_pair, clients=2, rounds=2)
    rep = serve_rounds(FakeGrid(2, {0: "nan", 1: "shape"}), cfg2, tmp_path)
    assert rep["rounds"][-1]["excluded_clients"] == [0, 1] and rep["rounds"][-1]["version"] == 1
    version, tensors, _ = store.latest(learner.initial)
    assert version == good[0] == 1 and all(torch.equal(tensors[k], good[1][k]) for k in tensors)


def test_a_restarted_server_resumes_after_its_last_published_round(tiny_pair, tmp_path, capsys):
    from crash import killed_at

    cfg = _cfg(tiny_pair, clients=2, rounds=1)
    serve_rounds(FakeGrid(2), cfg, tmp_path)
    learner = fleet_client.learner_for(cfg)
    store = GlobalStore(tmp_path / "global", learner.ident, cfg.local.rank)
    v1 = store.latest(learner.initial)
    # A server killed while publishing version 2 leaves version 1 as the one to resume from.
    bumped = {k: v + 1 for k, v in v1[1].items()}
    killed_at("dir:staged", lambda: store.publish(2, bumped, {"round": 2}))
    assert store.latest(learner.initial)[0] == 1
    rep = serve_rounds(FakeGrid(2), _cfg(tiny_pair, clients=2, rounds=2), tmp_path)
    assert rep["resumed_from"] == 1 and [r["round"] for r in rep["rounds"]] == [1, 2]
    assert "resuming after published version 1" in capsys.readouterr().err
    assert json.loads((tmp_path / "global" / "latest.json").read_text())["version"] == 2


def test_the_store_refuses_an_adapter_of_another_pair(tiny_pair, tmp_path):
    cfg = _cfg(tiny_pair)
    learner = fleet_client.learner_for(cfg)
    ident = learner.ident
    wrong = delta.PairIdentity(ident.drafter_tokenizer, ident.drafter_weights, ident.target_tokenizer, "0" * 64)
    GlobalStore(tmp_path, wrong, cfg.local.rank).publish(0, learner.adapter(), {"round": 0})
    with pytest.raises(AdapterError, match="another target"):
        GlobalStore(tmp_path, ident, cfg.local.rank).latest(learner.adapter())


def test_the_server_guard_keeps_the_published_adapter_when_the_aggregate_drops(tiny_pair, tmp_path, capsys):
    # A margin of -1 makes every aggregate "drop": the guard must keep version 0 and say so.
    cfg = _cfg(tiny_pair, clients=2, server=ServerConfig(filter="none", probe_prompts=1, guard_margin=-1.0))
    rep = serve_rounds(FakeGrid(2), cfg, tmp_path)
    r = rep["rounds"][0]
    assert r["server_guard"]["action"] == "kept-previous" and r["version"] == 0
    assert json.loads((tmp_path / "global" / "latest.json").read_text())["version"] == 0
    assert "the global adapter stays at version 0" in capsys.readouterr().err


def test_the_server_guard_does_not_republish_an_aggregate_that_only_ties(tiny_pair, tmp_path, capsys):
    # Devices that send back what they were given average to the published adapter itself: its probe
    # acceptance ties, and a tie is not worth a download to every device.
    cfg = _cfg(tiny_pair, clients=2, server=ServerConfig(filter="none", probe_prompts=1))
    rep = serve_rounds(FakeGrid(2, {0: "echo", 1: "echo"}), cfg, tmp_path)
    guard = rep["rounds"][0]["server_guard"]
    assert guard["probe_acceptance"] == guard["previous"] and guard["action"] == "kept-previous"
    assert rep["rounds"][0]["version"] == 0
    assert "does not beat the published" in capsys.readouterr().err
