"""`omnidraft bench-adaptive` on tiny random models: the table per stream (fixed K vs adaptive,
joint and interleaved), identical greedy output, calibration plot, checks; one-line refusals."""

from __future__ import annotations

import json

import pytest

from omnidraft.cli import main


@pytest.fixture(scope="module")
def pair(make_tiny_pair):
    return make_tiny_pair(512)


def _argv(pair, out, *extra):
    d, t = pair
    return [
        "bench-adaptive",
        "--pair",
        f"{d},{t}",
        "--streams",
        "math",
        "--prompts",
        "2",
        "--train-prompts",
        "4",
        "--max-new-tokens",
        "8",
        "--draft-lens",
        "1,3",
        "--every",
        "2",
        "--max-draft-len",
        "6",
        "--threads",
        "1",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_table_per_stream(pair, tmp_path, capsys, backend):
    out = tmp_path / "out"
    always = ["--always-draft"] if backend == "ort" else []
    assert main(_argv(pair, out, "--backend", backend, *always)) == 0
    doc = json.loads((out / "adaptive.json").read_text())
    assert doc["schema"] == "omnidraft.bench_adaptive" and doc["interrupted"] is False
    (st,) = doc["streams"]
    assert [r["method"] for r in st["rows"]] == [
        "target-only",
        "K=1",
        "K=3",
        "adaptive (joint)",
        "adaptive (interleaved)",
    ]
    assert all(r["outputs_match_target_only"] for r in st["rows"])
    for r in st["rows"][1:]:
        assert r["tokens_per_step"] >= 1.0 and r["acceptance_rate"] is not None and r["tokens_per_s"] > 0
    ad = [r for r in st["rows"] if r["method"].startswith("adaptive")]
    assert all("vs_best_fixed" in r and 0.05 <= r["gamma_final"] <= 0.95 and r["calibration"] for r in ad)
    assert all(r["drafter_calls_per_step"] <= 6 for r in ad)  # K <= K_max
    if always:  # K in [1, K_max]: drafting never turned off
        assert all(r["drafter_calls_per_step"] >= 1.0 and r["prompts_without_drafting"] == 0 for r in ad)
    assert all(0 <= r["prompts_without_drafting"] <= r["prompts"] for r in ad)
    assert set(st["passes"]) == {"joint", "interleaved"} and all(p["head_updates"] > 0 for p in st["passes"].values())
    assert {c["variant"] for c in doc["checks"]} == {"joint", "interleaved"}
    assert "calibration.png" in doc["plots"] and (out / "calibration.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "adaptive.md").read_text()
    assert "## math" in md and "vs best fixed K" in md and "## Checks" in md
    assert "adaptive (interleaved)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--backend", "executorch"], "do not carry an acceptance head"),
        (["--gamma", "1"], "--gamma must be within (0, 1)"),
        (["--gamma", "0.01"], "--gamma must be within [0.05, 0.95] when it is tuned online"),
        (["--variants", "both"], "unknown head variant"),
        (["--draft-lens", "0,2"], "must be >= 1"),
        (["--streams", "poetry"], "unknown stream"),
    ],
)
def test_bad_inputs(pair, tmp_path, capsys, extra, needle):
    assert main(_argv(pair, tmp_path / "o", *extra)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_bench_hybrid_adaptive_row(pair, tmp_path, monkeypatch):
    """`omnidraft bench`'s hybrid+adaptive row, with a real (tiny) adaptation pass that trains the
    head; the other adapted rows are left out to keep the test short."""
    from omnidraft.bench import adapted_rows

    monkeypatch.setattr(adapted_rows, "METHODS", {"hybrid+adaptive": adapted_rows.METHODS["hybrid+adaptive"]})
    from omnidraft.bench import peer_section

    monkeypatch.setattr(peer_section, "best_method", lambda bench, st, backend=None: "hybrid+adaptive")
    d, t = pair
    out = tmp_path / "bench"
    argv = [
        "bench",
        "--pair",
        f"{d},{t}",
        "--backend",
        "torch",
        "--streams",
        "math",
        "--prompts",
        "2",
        "--max-new-tokens",
        "8",
        "--draft-lens",
        "2",
        "--train-prompts",
        "0",
        "--adapt-prompts",
        "3",
        "--peers",
        "torch",
        "--no-eviction",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    doc = json.loads((out / "bench.json").read_text())
    row = next(r for r in doc["rows"] if r["method"] == "hybrid+adaptive")
    assert row["status"] == "ok", row["status"]
    assert row["draft_len"] == "auto" and row["outputs_match_target_only"] and row["bound"] > 0
    assert row["adaptation"]["train_head"] is True and 0.05 <= row["adaptation"]["gamma_after"] <= 0.95
    (peer,) = [p for p in doc["peers"] if p["name"] == "omnidraft-torch"]
    assert peer["status"] == "ok" and peer["outputs_match_target_only"]
    assert peer["method"] == "hybrid+adaptive" and peer["draft_len"] == "auto"


def test_executorch_peer_replays_the_fastest_method_it_can_run():
    """A .pte drafter has no acceptance head: the ExecuTorch peer takes the fastest fixed-K method."""
    from types import SimpleNamespace

    from omnidraft.bench.peer_section import best_method

    rows = [
        {"stream": "code", "method": m, "status": "ok", "tokens_per_s": t}
        for m, t in (
            ("target-only", 100.0),
            ("spd-dm", 80.0),
            ("hybrid", 130.0),
            ("hybrid+lora", 140.0),
            ("hybrid+adaptive", 150.0),
        )
    ]
    bench, st = SimpleNamespace(report={"rows": rows}), SimpleNamespace(name="code")
    assert best_method(bench, st, "ort") == best_method(bench, st, "torch") == "hybrid+adaptive"
    assert best_method(bench, st, "executorch") == "hybrid+lora"


@pytest.fixture()
def fake_bundled(tmp_path, pair, monkeypatch):
    import shutil

    from omnidraft.bench import bundled

    for role, src in zip(("drafter", "target"), pair):
        shutil.copytree(src, tmp_path / role)
    monkeypatch.setattr(bundled, "BUNDLED", tmp_path)
    monkeypatch.setattr(bundled.check_bundled, "__defaults__", (tmp_path,))
    return tmp_path


def test_demo_with_adaptive_drafting(fake_bundled, tmp_path, capsys):
    out = tmp_path / "report"
    assert (
        main(
            [
                "demo",
                "--pair",
                "tiny",
                "--backend",
                "torch",
                "--streams",
                "math",
                "--prompts",
                "2",
                "--max-new-tokens",
                "8",
                "--adapt-prompts",
                "3",
                "--adapt-engine",
                "eager",
                "--draft-len",
                "auto",
                "--gamma",
                "0.4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "| bundled target | math | adapted + adaptive K |" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert [r["phase"] for r in report["rows"]] == ["as shipped", "adapted + adaptive K"]
    assert report["rows"][1]["draft_len"] == "auto" and all(r["identical_to_target_only"] for r in report["rows"])
    assert 0.05 <= report["adaptation"]["bundled target/math"]["gamma"] <= 0.95


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--backend", "executorch"], "ExecuTorch drafters do not carry an acceptance head"),
        (["--adapt-prompts", "0"], "--adapt-prompts N >= 1"),
        (["--gamma", "2"], "--gamma must be within (0, 1)"),
    ],
)
def test_demo_auto_refusals(fake_bundled, capsys, extra, needle):
    assert main(["demo", "--pair", "tiny", "--streams", "math", "--draft-len", "auto", *extra]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_hybrid_loss_distils_the_drafter_of_each_pass(pair, tmp_path):
    """--loss hybrid: each variant's pass fine-tunes the drafter (its fixed-K rows then run on it), with
    the bench's short-stream settings, and greedy output still equals target-only on every row."""
    import numpy as np
    from safetensors.numpy import load_file

    out = tmp_path / "out"
    assert main(_argv(pair, out, "--backend", "torch", "--loss", "hybrid", "--variants", "joint")) == 0
    doc = json.loads((out / "adaptive.json").read_text())
    (st,) = doc["streams"]
    assert all(r["outputs_match_target_only"] for r in st["rows"])
    dt = st["passes"]["joint"]["drafter_training"]
    assert dt["loss"] == "hybrid" and dt["updates"] > 0 and dt["lr"] == 1e-3 and dt["steps_per_update"] == 8
    base = load_file(str(pair[0] / "model.safetensors"))
    (tuned_file,) = (out / "state" / "math.joint").glob("*/drafter/model.safetensors")
    tuned = load_file(str(tuned_file))
    assert any(not np.array_equal(base[k], tuned[k]) for k in base if k in tuned)
