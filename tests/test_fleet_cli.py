"""`omnidraft fleet` bad input: one line, a non-zero exit, no traceback, nothing started."""

from __future__ import annotations

import pytest

from omnidraft.cli import main


@pytest.mark.parametrize(
    "argv, words",
    [
        (["fleet"], "simulate | serve | join"),
        (["fleet", "simulate", "--clients", "0", "--out", "{out}"], "--clients must be an integer >= 1"),
        (["fleet", "simulate", "--rounds", "-1", "--out", "{out}"], "--rounds must be an integer >= 1"),
        (["fleet", "simulate", "--streams", "code,poetry", "--out", "{out}"], "unknown stream 'poetry'"),
        (["fleet", "simulate", "--poison-clients", "9", "--out", "{out}"], "--poison-clients 9 is not a client id"),
        (["fleet", "simulate", "--poison-clients", "x", "--out", "{out}"], "comma-separated device ids"),
        (["fleet", "simulate", "--filter", "median", "--out", "{out}"], "unknown --filter 'median'"),
        (["fleet", "simulate", "--lr", "nan", "--out", "{out}"], "must be a finite number"),
        (["fleet", "simulate", "--engine", "tpu", "--out", "{out}"], "unknown --engine 'tpu'"),
        (["fleet", "simulate", "--pair", "no-such-model,other", "--out", "{out}"], "no-such-model"),
        (["fleet", "serve", "--port", "70000", "--out", "{out}"], "--port must be in 1..65535"),
        (["fleet", "join", "--device-id", "5", "--clients", "2"], "--device-id must be in 0..1"),
        (["fleet", "join", "--device-id", "0", "--clients", "2", "--superlink", "nohost"], "HOST:PORT"),
    ],
)
def test_bad_fleet_input_is_one_line(argv, words, tmp_path, capsys):
    argv = [a.replace("{out}", str(tmp_path / "out")) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "global").exists()


def test_an_unwritable_out_is_refused_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["fleet", "simulate", "--out", str(blocker / "sub")]) == 1
    assert "Traceback" not in capsys.readouterr().err
