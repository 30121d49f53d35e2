"""A localhost deployment: `omnidraft fleet serve` starts a SuperLink, two `omnidraft fleet join`
SuperNodes connect, one round runs over Flower's transport, and the test stops everything."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

pytest.importorskip("flwr")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_superlink_and_two_supernodes_run_one_round_on_localhost(tiny_pair, tmp_path):
    d, t = tiny_pair
    link = _free_port()
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "device-home"), OMP_NUM_THREADS="1")
    cli = [sys.executable, "-m", "omnidraft.cli", "fleet"]
    serve_cmd = cli + [
        "serve",
        *("--pair", f"{d},{t}", "--streams", "code,text", "--clients", "2", "--rounds", "1"),
        *("--engine", "eager", "--prompts-per-round", "1", "--max-new-tokens", "8", "--lora-rank", "2"),
        *("--eval-prompts", "1", "--greedy-check", "0", "--filter", "none", "--timeout", "240", "--export", "none"),
        *("--probe-prompts", "1", "--no-server-guard"),
        *("--port", str(link), "--out", str(tmp_path / "out"), "--json"),
    ]
    procs = []
    try:
        server = subprocess.Popen(
            serve_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        procs.append(server)
        for i in range(2):
            join_cmd = cli + [
                *("join", "--superlink", f"127.0.0.1:{link}", "--device-id", str(i), "--clients", "2"),
                *("--port", str(_free_port())),
            ]
            procs.append(
                subprocess.Popen(
                    join_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
                )
            )
        out, err = server.communicate(timeout=420)
    finally:
        for p in procs:
            _stop(p)
    assert server.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    rep = json.loads(out)
    assert [r["round"] for r in rep["rounds"]] == [1]
    assert sorted(c["client"] for c in rep["rounds"][0]["clients"]) == [0, 1]
    assert json.loads((tmp_path / "out" / "global" / "latest.json").read_text())["version"] == 1
    # Nothing of the deployment is left listening.
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", link)) != 0
