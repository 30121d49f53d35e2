"""The server side: Flower's ServerApp running the rounds, publishing and measuring each one.

Every round: send the global adapter (with its pair identity and the fleet configuration) to every
client, aggregate the replies with :class:`fleet.strategy.FleetStrategy`, publish the new version
(atomically, then ``latest.json``), fold it into the global drafter, and measure it on the
held-out prompts of every stream. A server started again over the same ``--out`` resumes after the
last published version; the report keeps the rounds already run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from . import data
from .aggregate import fedavg, merged_gap
from .client import learner_for
from .config import FleetConfig
from .report import write_report
from .store import GlobalStore
from .strategy import FleetStrategy


def _acceptance_by_stream(learner, adapter, tests: dict[str, list[str]]) -> dict[str, dict]:
    out = {}
    for s, prompts in tests.items():
        m = learner.acceptance(adapter, prompts)
        out[s] = {"accepted": m.accepted, "proposed": m.proposed, "acceptance": round(m.acceptance, 4)}
    return out


def _pooled(by_stream: dict[str, dict], streams) -> float:
    acc = sum(by_stream[s]["accepted"] for s in streams)
    prop = sum(by_stream[s]["proposed"] for s in streams)
    return round(acc / prop, 4) if prop else 0.0


def _ab_vs_merged(learner, kept, records) -> dict | None:
    """A/B averaged separately vs the exact mean of the merged updates B_i A_i, on this round's deltas."""
    if len(kept) < 2:
        return None
    adapters, weights = [r.adapter for r in kept], [r.weight for r in kept]
    ab = learner.agreement(fedavg(adapters, weights), records)
    learner.set_adapter(adapters[0])
    with learner.dense_update(adapters, weights):
        exact = learner.agreement(None, records)
    return {
        "relative_gap": round(merged_gap(adapters, weights), 5),
        "probe_ab": round(ab, 4),
        "probe_merged": round(exact, 4),
    }


def serve_rounds(grid, cfg: FleetConfig, out: Path) -> dict:
    """Run rounds until ``cfg.rounds`` are published; returns the report."""
    from flwr.app import ArrayRecord, ConfigRecord

    t_start = time.perf_counter()
    out = Path(out)
    learner = learner_for(cfg)
    identity = learner.ident.metadata()
    store = GlobalStore(out / "global", learner.ident, cfg.local.rank)
    initial = learner.initial
    tests = data.test_prompts(cfg.streams, cfg.eval.prompts_per_stream, learner.target)
    previous = _read_previous(out)
    resumed = store.latest(initial)
    if resumed is None:
        version, adapter = 0, initial
        store.publish(0, adapter, {"round": 0})
        learner.write_drafter(adapter, store.root / "drafter", {"round": 0, "fleet": True})
        previous = None
    else:
        version, adapter, _ = resumed
        print(f"fleet: resuming after published version {version} in {store.root}", file=sys.stderr)
    report = previous or {
        "pair": cfg.pair,
        "config": json.loads(cfg.to_json()),
        "target_id": learner.ident.target_id,
        "untrained": _acceptance_by_stream(learner, initial, tests),
        "rounds": [],
    }
    report["rounds"] = [r for r in report["rounds"] if r["round"] <= version]
    for key in ("seconds", "greedy_identical"):  # a resumed run's totals are measured again at its end
        report.pop(key, None)
    report["resumed_from"] = version if resumed else None
    untrained = report["untrained"]
    probe_prompts = data.probe_prompts(cfg.streams, cfg.server.probe_prompts, learner.target)
    probe_records = []
    if cfg.server.filter == "probe":  # the target's distributions on the probe prompts, decoded once
        probe_records = learner.probe_records(initial, probe_prompts)
    strategy = FleetStrategy(
        clients=cfg.clients,
        identity=identity,
        cfg=cfg.server,
        probe=(lambda a: learner.agreement(a, probe_records)) if probe_records else None,
    )
    guard = cfg.server.guard
    # The devices' drift guard, lifted to the server, and stricter: a published version ships to
    # every device, so an aggregate must beat the published adapter's acceptance on the probe
    # prompts to be published; a tie or a drop keeps the published one (the next round tries again).
    held = learner.acceptance(adapter, probe_prompts).acceptance if guard else None
    published = version
    for rnd in range(version + 1, cfg.rounds + 1):
        t0 = time.perf_counter()
        strategy.current = adapter
        messages = list(
            strategy.configure_train(
                rnd, ArrayRecord(torch_state_dict=adapter), ConfigRecord({"fleet": cfg.to_json()}), grid
            )
        )
        for m in messages:
            m.content["identity"] = ConfigRecord(identity)
        replies = list(grid.send_and_receive(messages=messages, timeout=cfg.server.timeout_s))
        strategy.aggregate_train(rnd, replies)
        outcome = strategy.outcome
        gap = _ab_vs_merged(learner, outcome.kept, probe_records)
        guard_row = None
        if outcome.adapter is None:
            print(
                f"fleet: round {rnd}: no usable delta; the global adapter stays at version {published}", file=sys.stderr
            )
        elif guard:
            cand = learner.acceptance(outcome.adapter, probe_prompts).acceptance
            guard_row = {"probe_acceptance": round(cand, 4), "previous": round(held, 4)}
            if cand <= held - cfg.server.guard_margin:
                guard_row["action"] = "kept-previous"
                print(
                    f"fleet: round {rnd}: the aggregate's probe acceptance {cand:.4f} does not beat the "
                    f"published {held:.4f}; the global adapter stays at version {published}",
                    file=sys.stderr,
                )
                outcome.adapter = None
            else:
                guard_row["action"] = "published"
                adapter, held = outcome.adapter, cand
        else:
            adapter = outcome.adapter
        by_stream = _acceptance_by_stream(learner, adapter, tests)
        clients = _client_rows(outcome, replies_expected=len(messages))
        honest = [c for c in clients if c["client"] not in outcome.excluded and "unseen_acceptance" in c]
        entry = {
            "round": rnd,
            "global_acceptance": _pooled(by_stream, cfg.streams),
            "global_by_stream": by_stream,
            "client_acceptance": [c.get("unseen_acceptance") for c in clients],
            "clients": clients,
            "excluded_clients": sorted(outcome.excluded),
            "excluded_reasons": {str(k): v for k, v in sorted(outcome.excluded.items())},
            "failed_clients": len(messages) - len(replies) + outcome.failed,
            "local_unseen_mean": _mean([c["unseen_acceptance"] for c in honest]),
            "global_on_unseen_mean": _mean(
                [_pooled(by_stream, data.unseen_streams(c["client"], cfg.streams)) for c in honest]
            ),
            "probe_agreement": round(learner.agreement(adapter, probe_records), 4) if probe_records else None,
            "bytes_per_client": int(_mean([c["bytes"] for c in clients]) or 0),
            "bytes_down_per_client": sum(int(v.numel() * v.element_size()) for v in adapter.values()),
            "ab_vs_merged": gap,
            "server_guard": guard_row,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if outcome.adapter is not None:
            store.publish(rnd, adapter, {"round": rnd, "global_acceptance": entry["global_acceptance"]})
            learner.write_drafter(adapter, store.root / "drafter", {"round": rnd, "fleet": True})
            published = rnd
        entry["version"] = published  # what devices receive next round: unchanged after a refused round
        report["rounds"].append(entry)
        report["untrained_acceptance"] = _pooled(untrained, cfg.streams)
        write_report(out, report)
        print(
            f"fleet: round {rnd}/{cfg.rounds}: global acceptance {entry['global_acceptance']:.3f}, "
            f"excluded {entry['excluded_clients'] or 'none'} ({entry['seconds']} s)",
            file=sys.stderr,
        )
    if cfg.exports:  # the final global drafter through the export pipeline (parity gate included)
        from omnidraft.adapt.delta import export_merged

        report["exports"] = {
            fmt: str(export_merged(store.root / "drafter", fmt, store.root / f"drafter-{fmt}", 512))
            for fmt in cfg.exports
        }
    if cfg.eval.greedy_check:
        report["greedy_identical"] = _greedy_check(learner, adapter, tests, cfg.eval.greedy_check)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    write_report(out, report)
    return report


def _greedy_check(learner, adapter, tests: dict[str, list[str]], n: int) -> dict:
    prompts = [p for ps in tests.values() for p in ps[:n]]
    ref = learner.acceptance(adapter, prompts, mode="target-only")
    spec = learner.acceptance(adapter, prompts)
    same = sum(a == b for a, b in zip(spec.outputs, ref.outputs))
    return {"checked": len(ref.outputs), "same": same}


def _client_rows(outcome, replies_expected: int) -> list[dict]:
    rows = []
    for r in sorted(outcome.replies, key=lambda r: r.client):
        row = {
            "client": r.client,
            "verified_tokens": int(r.weight),
            "bytes": r.nbytes,
            "live_acceptance": round(float(r.metrics.get("live-acceptance", 0.0)), 4),
            "rolled_back": bool(r.metrics.get("rolled-back", 0)),
        }
        if r.client in outcome.probe_alone:
            row["probe_alone"] = round(outcome.probe_alone[r.client], 4)
        if "local-unseen-acceptance" in r.metrics:
            row["unseen_acceptance"] = round(float(r.metrics["local-unseen-acceptance"]), 4)
        rows.append(row)
    return rows


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def _read_previous(out: Path) -> dict | None:
    try:
        return json.loads((out / "fleet.json").read_text())
    except (OSError, ValueError):
        return None


def server_app(cfg: FleetConfig | None = None, out: Path | None = None):
    """A ServerApp running :func:`serve_rounds`; without arguments (a deployment through `flwr run`)
    the configuration and output folder come from the run config (``fleet-config``, ``out``)."""
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        c = cfg or FleetConfig.from_json(str(context.run_config["fleet-config"]))
        o = out or Path(str(context.run_config["out"]))
        serve_rounds(grid, c, o)

    return app
