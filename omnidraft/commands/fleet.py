"""`omnidraft fleet`: federated learning of the drafter's LoRA adapter over many devices (Flower)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "fleet learning on Flower: simulate N devices, or serve / join a real deployment over gRPC"


def _fleet_options(p: argparse.ArgumentParser) -> None:
    from omnidraft.fleet.config import EvalConfig, FleetConfig, LocalConfig, ServerConfig

    fleet, local, server, ev = FleetConfig(), LocalConfig(), ServerConfig(), EvalConfig()  # the defaults, once
    p.add_argument("--pair", default=fleet.pair, help="'tiny' (the bundled pair) or DRAFTER,TARGET")
    p.add_argument("--streams", default="code,math,text", help="streams the devices' shards are drawn from")
    p.add_argument("--rounds", type=int, default=fleet.rounds)
    p.add_argument("--out", type=Path, required=True, help="folder for fleet.json, fleet.md, fleet.png, global/")
    p.add_argument(
        "--prompts-per-round", type=int, default=local.prompts_per_round, help="prompts each device adapts on per round"
    )
    p.add_argument("--max-new-tokens", type=int, default=local.max_new_tokens)
    p.add_argument("--lora-rank", type=int, default=local.rank)
    p.add_argument("--lr", type=float, default=local.lr)
    p.add_argument(
        "--local-steps", type=int, default=local.local_steps, help="AdamW steps per local update (local epochs)"
    )
    p.add_argument("--engine", default=local.engine, help="LoRA gradients: executorch (training program) | eager")
    p.add_argument(
        "--filter", default=server.filter, help="poisoned-delta filter: probe (server probe set) | krum | none"
    )
    p.add_argument(
        "--probe-margin",
        type=float,
        default=server.probe_margin,
        help="a delta whose probe agreement alone is this far below the round's median is dropped",
    )
    p.add_argument(
        "--probe-prompts",
        type=int,
        default=server.probe_prompts,
        help="probe prompts per stream (held-back train prompts)",
    )
    p.add_argument(
        "--no-server-guard",
        action="store_true",
        help="publish every aggregate (default: only one whose probe-prompt acceptance beats the published one's)",
    )
    p.add_argument(
        "--dp-noise", type=float, default=server.dp_noise, help="Gaussian noise on the aggregate (relative std)"
    )
    p.add_argument("--eval-prompts", type=int, default=ev.prompts_per_stream, help="held-out prompts per stream")
    p.add_argument(
        "--greedy-check",
        type=int,
        default=ev.greedy_check,
        help="held-out prompts per stream decoded target-only and with the final global drafter",
    )
    p.add_argument("--timeout", type=float, default=server.timeout_s, help="seconds to wait for the devices each round")
    p.add_argument("--seed", type=int, default=fleet.seed)
    p.add_argument(
        "--export", default="onnx", help="re-lower the final global drafter: onnx and/or executorch, or none"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="fleet_command", metavar="{simulate,serve,join}")
    sim = sub.add_parser("simulate", help="N virtual devices on Flower's simulation engine")
    _fleet_options(sim)
    sim.add_argument("--clients", type=int, default=8)
    sim.add_argument(
        "--poison-clients",
        default="last",
        metavar="IDS",
        help="comma-separated device ids whose deltas are poisoned (random targets, scaled by the fleet size); "
        "default: the last device, so a simulation shows the filter at work; none: an all-honest fleet",
    )
    sim.add_argument("--workers", type=int, help="devices trained at once (default: one per usable CPU)")
    srv = sub.add_parser("serve", help="start a SuperLink on this machine and run the rounds through it")
    _fleet_options(srv)
    srv.add_argument("--clients", type=int, default=2, help="devices to wait for each round")
    srv.add_argument("--address", default="127.0.0.1", help="address the SuperLink listens on")
    srv.add_argument("--port", type=int, default=9092, help="Fleet API port (devices connect here)")
    join = sub.add_parser("join", help="run this device as a SuperNode of a fleet")
    join.add_argument("--superlink", default="127.0.0.1:9092", help="the server's Fleet API address")
    join.add_argument("--device-id", type=int, required=True, help="this device's shard (0 .. clients-1)")
    join.add_argument("--clients", type=int, required=True, help="devices in the fleet")
    join.add_argument("--port", type=int, default=9094, help="local ClientAppIo port (one per device on a host)")


def _config(args: argparse.Namespace, poisoned: tuple[int, ...] = ()):
    from omnidraft.errors import InvalidArgument
    from omnidraft.fleet.config import EvalConfig, FleetConfig, LocalConfig, ServerConfig

    streams = tuple(s.strip() for s in args.streams.split(",") if s.strip())
    if args.engine not in ("executorch", "eager"):
        raise InvalidArgument(f"unknown --engine {args.engine!r}; use executorch or eager")
    return FleetConfig(
        pair=args.pair,
        streams=streams,
        clients=args.clients,
        rounds=args.rounds,
        poisoned=poisoned,
        exports=tuple(f.strip() for f in args.export.split(",") if f.strip() and f.strip() != "none"),
        seed=args.seed,
        local=LocalConfig(
            prompts_per_round=args.prompts_per_round,
            max_new_tokens=args.max_new_tokens,
            rank=args.lora_rank,
            lr=args.lr,
            local_steps=args.local_steps,
            engine=args.engine,
        ),
        server=ServerConfig(
            filter=args.filter,
            probe_prompts=args.probe_prompts,
            probe_margin=args.probe_margin,
            dp_noise=args.dp_noise,
            guard=not args.no_server_guard,
            timeout_s=args.timeout,
        ),
        eval=EvalConfig(prompts_per_stream=args.eval_prompts, greedy_check=args.greedy_check),
    ).validate()


def _ids(text: str, clients: int) -> tuple[int, ...]:
    from omnidraft.errors import InvalidArgument

    if text == "none":
        return ()
    if text == "last":
        return (clients - 1,) if clients > 2 else ()  # two devices cannot outvote a poisoned one
    try:
        return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise InvalidArgument(f"--poison-clients must be comma-separated device ids (got {text!r})") from None


def _check_pair(spec: str) -> None:
    from omnidraft.bench.engine import resolve_pair

    resolve_pair(spec)  # a bad pair is one line here, not an error inside a worker process


def run(args: argparse.Namespace) -> int:
    from omnidraft.errors import InvalidArgument

    if not args.fleet_command:
        raise InvalidArgument("choose one of: omnidraft fleet simulate | serve | join (see --help)")
    if args.fleet_command == "join":
        from omnidraft.fleet.deploy import join

        if not 1 <= args.port <= 65535:
            raise InvalidArgument(f"--port must be in 1..65535 (got {args.port})")
        return join(superlink=args.superlink, device_id=args.device_id, clients=args.clients, port=args.port)
    if args.fleet_command == "simulate":
        if args.workers is not None and args.workers < 1:
            raise InvalidArgument(f"--workers must be >= 1 (got {args.workers})")
        cfg = _config(args, _ids(args.poison_clients, args.clients))
        _check_pair(cfg.pair)
        from omnidraft.fleet.simulate import simulate

        report = simulate(cfg, args.out, workers=args.workers)
    else:
        cfg = _config(args)
        _check_pair(cfg.pair)
        from omnidraft.fleet.deploy import serve

        report = serve(cfg, args.out, address=args.address, port=args.port)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        from omnidraft.fleet.report import markdown

        sys.stdout.write(markdown(report))
    return 0
