"""`omnidraft fleet serve` / `join`: a real Flower deployment (SuperLink + SuperNodes).

``serve`` starts a SuperLink, writes a Flower App folder whose components are this package's
ServerApp and ClientApp (the fleet configuration travels as its run config), submits it with
``flwr run`` and waits for the last round's report. ``join`` runs one SuperNode for one device.
Flower 1.42 carries the Fleet and Control APIs over HTTP (its gRPC Fleet API is deprecated);
``--insecure`` because a localhost deployment has no certificates: put TLS in front of a real one.
The Flower home (connection settings, installed app bundles) is private to the run's ``--out``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from omnidraft import atomic
from omnidraft.errors import FleetError, InvalidArgument

from .config import FleetConfig
from .simulate import quiet, require_flower

APP_MODULE = '''"""Components of the omnidraft fleet app (written by `omnidraft fleet serve`)."""

from omnidraft.fleet.client import client_app
from omnidraft.fleet.server import server_app

client = client_app()
server = server_app()
'''


def _bin(name: str) -> str:
    """Flower's executables beside this interpreter (they spawn each other by name, so PATH too)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def _env(home: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GRPC_VERBOSITY", "ERROR")
    if home is not None:
        env["FLWR_HOME"] = str(home)
    return env


def _wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise FleetError(f"the SuperLink exited at start (code {proc.returncode}); is port {port} taken?")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.3)
    raise FleetError(f"the SuperLink did not open {host}:{port} within {timeout:.0f} s")


def _port_free(host: str, port: int) -> bool:
    try:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex((host, port)) != 0
    except (OSError, UnicodeError):
        raise InvalidArgument(f"--address {host!r} is not an address this machine can listen on") from None


def stop(proc: subprocess.Popen | None) -> None:
    """Stop a process this module started, with the helpers it spawned (its own process group)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def write_app(folder: Path, cfg: FleetConfig, out: Path) -> Path:
    """A Flower App folder: pyproject (components, run config) and the module naming our apps."""
    folder.mkdir(parents=True, exist_ok=True)
    pyproject = f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "omnidraft-fleet"
version = "1.0.0"
description = "omnidraft fleet learning: the drafter's LoRA adapter averaged over devices"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "omnidraft"

[tool.flwr.app.components]
serverapp = "fleet_app:server"
clientapp = "fleet_app:client"

[tool.flwr.app.config]
fleet-config = {json.dumps(cfg.to_json())}
out = {json.dumps(str(Path(out).resolve()))}
"""
    atomic.write_text(folder / "pyproject.toml", pyproject)
    atomic.write_text(folder / "fleet_app.py", APP_MODULE)
    return folder


def serve(cfg: FleetConfig, out: Path, *, address: str = "127.0.0.1", port: int = 9092) -> dict:
    """Start a SuperLink, run the fleet's rounds on whichever SuperNodes join, stop the SuperLink."""
    cfg.validate()
    if not 1 <= port <= 65535:
        raise InvalidArgument(f"--port must be in 1..65535 (got {port})")
    require_flower()
    quiet()
    out = Path(out)
    atomic.check_writable(out, folder=True)
    if not _port_free(address, port):
        raise FleetError(f"{address}:{port} is already in use; pass another --port (devices join with the same one)")
    work = out / "deploy"
    home = work / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    atomic.write_text(
        home / "config.toml",
        f'[superlink]\ndefault = "omnidraft"\n\n[superlink.omnidraft]\naddress = "{address}:{port}"\ninsecure = true\n',
    )
    app = write_app(work / "app", cfg, out)
    log = open(work / "superlink.log", "wb")  # noqa: SIM115 - closed in finally, outlives the with-less Popen
    link = subprocess.Popen(
        [
            _bin("flower-superlink"),
            "--insecure",
            "--host",
            address,
            "--port",
            str(port),
            "--disable-runtime-dependency-installation",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_env(home),
        start_new_session=True,
    )
    try:
        _wait_port(address, port, 60, link)
        before = _rounds_done(out)
        started = subprocess.run(
            [_bin("flwr"), "run", str(app), "omnidraft", "--format", "json"],
            capture_output=True,
            text=True,
            env=_env(home),
            timeout=120,
        )
        if started.returncode != 0:
            raise FleetError(f"flwr run could not submit the fleet app: {_last_line(started)}")
        print(
            f"fleet: SuperLink on {address}:{port}; devices join with: "
            f"omnidraft fleet join --superlink {address}:{port} --clients {cfg.clients} --device-id I",
            file=sys.stderr,
        )
        return _wait_report(out, cfg, before, link)
    finally:
        stop(link)
        log.close()


def _last_line(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stdout or "") + (proc.stderr or "")
    try:
        return str(json.loads(proc.stdout).get("error", text.strip().splitlines()[-1]))
    except (ValueError, AttributeError, IndexError):
        lines = [ln.strip(" │╭╮╰╯─") for ln in text.splitlines() if ln.strip(" │╭╮╰╯─")]
        return lines[-1] if lines else "no output"


def _rounds_done(out: Path) -> tuple[int, float | None]:
    try:
        rep = json.loads((out / "fleet.json").read_text())
        return len(rep.get("rounds", [])), rep.get("seconds")
    except (OSError, ValueError):
        return 0, None


def _wait_report(out: Path, cfg: FleetConfig, before: tuple, link: subprocess.Popen) -> dict:
    """Until the ServerApp writes its final report (it adds ``seconds`` after the last round)."""
    deadline = time.monotonic() + cfg.rounds * cfg.server.timeout_s + 300
    while time.monotonic() < deadline:
        if link.poll() is not None:
            raise FleetError(f"the SuperLink stopped (code {link.returncode}); see {out / 'deploy' / 'superlink.log'}")
        rep = _final(out)
        if rep is not None and (rep.get("seconds"), len(rep["rounds"])) != (before[1], before[0]):
            return rep
        time.sleep(1.0)
    raise FleetError(f"no final report in {out} after the rounds' timeout; the devices may not have joined")


def _final(out: Path) -> dict | None:
    try:
        rep = json.loads((out / "fleet.json").read_text())
    except (OSError, ValueError):
        return None
    return rep if rep.get("seconds") is not None else None


def join(*, superlink: str, device_id: int, clients: int, port: int = 9094) -> int:
    """Run this device's SuperNode until it is stopped (Ctrl-C)."""
    if clients < 1 or not 0 <= device_id < clients:
        raise InvalidArgument(f"--device-id must be in 0..{clients - 1} (got {device_id}) and --clients >= 1")
    host, _, p = superlink.rpartition(":")
    if not host or not p.isdigit():
        raise InvalidArgument(f"--superlink must be HOST:PORT (got {superlink!r})")
    require_flower()
    cmd = [
        _bin("flower-supernode"),
        "--insecure",
        "--superlink",
        superlink,
        "--port",
        str(port),
        "--node-config",
        f"partition-id={device_id} num-partitions={clients}",
    ]
    from omnidraft.models.data import cache_dir

    # Flower logs every message it relays; that goes to a file, the terminal gets one line.
    log_path = cache_dir().parent / "fleet" / f"supernode-{device_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115 - closed in the finally below
    print(f"fleet: device {device_id} joined {superlink} (SuperNode log: {log_path}); Ctrl-C leaves", file=sys.stderr)
    # Same process group as this command: a Ctrl-C in the terminal reaches the SuperNode too.
    proc = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT)

    def _terminated(signum, frame):
        raise SystemExit(128 + signum)  # run the finally below: no SuperNode outlives its join

    signal.signal(signal.SIGTERM, _terminated)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        log.close()
