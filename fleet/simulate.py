"""`omnidraft fleet simulate`: N virtual devices on Flower's simulation engine (ray), on this machine."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from omnidraft.errors import FleetError, InvalidArgument

from .config import FleetConfig


def require_flower() -> None:
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise InvalidArgument(
            "fleet learning needs Flower; install it with: .venv/bin/pip install -e '.[fleet]'"
        ) from None


def quiet() -> None:
    """Flower logs every round at INFO and ray prints its dashboard and deprecation notes; none of
    it is something a user of this command can act on (our own lines say what happened)."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    # Tiny models: one intra-op thread per process; several threads per actor only spin on 2 cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("flwr", "ray", "filelock"):
        logging.getLogger(name).setLevel(logging.ERROR)


def simulate(cfg: FleetConfig, out: Path, *, workers: int | None = None) -> dict:
    """Run ``cfg.rounds`` rounds with ``cfg.clients`` virtual clients; returns the report."""
    cfg.validate()
    require_flower()
    quiet()
    from omnidraft.atomic import check_writable

    check_writable(out, folder=True)
    from flwr.simulation import run_simulation

    from .client import client_app
    from .server import _read_previous, server_app

    cpus = workers or max(1, min(cfg.clients, len(os.sched_getaffinity(0))))
    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": cpus, "logging_level": logging.ERROR, "log_to_driver": False},
    }
    run_simulation(
        server_app=server_app(cfg, out),
        client_app=client_app(),
        num_supernodes=cfg.clients,
        backend_config=backend,
    )
    report = _read_previous(Path(out))
    if report is None or len(report.get("rounds", [])) < cfg.rounds:
        raise FleetError(f"the simulation stopped before its last round; see {out} for what it published")
    return report
