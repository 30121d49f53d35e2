"""Bundled-pair loop vectors (android_demo/vectors/pair.py) that the Java core replays.

Torch's CPU numerics are not bit-reproducible across machines and thread counts, so the committed
file is not compared with a fresh recording; instead the stored rows are run through the current
Python loop (which must reproduce every recorded call and the whole trace), the weights' hashes
must be those of models/bundled/, and the stored entries must be the models' top logits.
If one fails after retraining the pair or changing runtime/, run `omnidraft android-vectors --only pair`
and then `bash android_demo/ci/test_core.sh`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from tiny_models import make_tiny_model

from omnidraft.android import pair as apv
from omnidraft.android import vectors as av
from omnidraft.runtime.sampling import softmax
from omnidraft.runtime.tokenizer import load_codec

COMMITTED = av.VECTOR_DIR / av.PAIR_FILE


@pytest.fixture(scope="module")
def committed():
    assert COMMITTED.is_file(), f"{COMMITTED} missing: run `omnidraft android-vectors --only pair`"
    return json.loads(COMMITTED.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def codecs(tokenizer_path):
    return load_codec(tokenizer_path("llama-spm")), load_codec(apv.BUNDLED / "target" / "tokenizer.json")


def test_committed_runs_replay_through_the_current_loop(committed, codecs):
    dc, tc = codecs
    assert (committed["drafter_tokenizer"], committed["target_tokenizer"]) == (dc.sha256, tc.sha256)
    for run in committed["runs"]:
        want = {k: v for k, v in run.items() if k != "kept_mass"}
        assert apv.replay_run(run, dc, tc) == want, (
            f"{run['name']} is stale: run `omnidraft android-vectors --only pair`"
        )


def test_committed_runs_are_of_the_bundled_weights(committed):
    for side in ("drafter", "target"):
        assert committed[f"{side}_weights_sha256"] == apv.weights_sha256(apv.BUNDLED / side), (
            f"models/bundled/{side} changed since the pair vectors were written: run `omnidraft android-vectors --only pair`"
        )


def test_stored_entries_are_the_models_top_logits(committed):
    """The first drafter and target rows the first run read, recomputed with the bundled models."""
    from omnidraft.runtime.loader import load_model

    run = committed["runs"][0]
    for side in ("drafter", "target"):
        calls = [c for c in run["calls"] if c["m"] == side and c["op"] == "forward"]
        # the target's prompt pass reads no rows; take the first call that did, with what came before it
        n = next(i for i, c in enumerate(calls) if any(r["i"] for r in c["rows"]))
        assert all(c["start"] == sum(len(p["tokens"]) for p in calls[:i]) for i, c in enumerate(calls[: n + 1]))
        call, tokens = calls[n], [t for c in calls[: n + 1] for t in c["tokens"]]
        row = next(r for r in reversed(call["rows"]) if r["i"])
        at = len(tokens) - len(call["tokens"]) + call["rows"].index(row)
        logits = load_model(apv.BUNDLED / side).backend.forward(tokens, 0)[at]
        top = np.argsort(-logits, kind="stable")[: committed["top_n"]]
        assert set(top.tolist()) == set(row["i"]), (
            f"{side}: the stored entries are not the model's top {committed['top_n']}"
        )
        np.testing.assert_allclose(logits[row["i"]], row["v"], atol=1e-4)


def test_vectors_show_cache_growth_hits_and_sampled_rejections(committed):
    runs = committed["runs"]
    assert sum(r["stats"]["ngram_added"] for r in runs) > 0
    assert sum(r["stats"]["ngram_hits"] for r in runs) > 0
    sampling = [r for r in runs if r["config"]["temperature"] > 0 and r["config"]["mode"] != "target-only"]
    assert sampling and all(r["uniforms"] for r in sampling)
    assert any(rd["accepted"] < len(rd["target_ids"]) for r in sampling for rd in r["rounds"])
    assert {r["config"]["mode"] for r in runs} == {"ngram", "dm", "target-only"}
    size = sum(p.stat().st_size for p in av.VECTOR_DIR.glob("*.json"))
    assert size < 2_000_000, (
        f"the vector files total {size} bytes; lower TOP_N or max_new_tokens in android_pair_vectors"
    )


class _Fixed:
    """A backend whose rows are given (row r at position p: base[p])."""

    name, vocab_size, max_seq_len = "fixed", 6, 16

    def __init__(self, base: np.ndarray) -> None:
        self.base, self.cached_len = base, 0

    def forward(self, token_ids, start_pos):
        self.cached_len = start_pos + len(token_ids)
        return self.base[start_pos : self.cached_len].copy()

    def rollback(self, length):
        self.cached_len = length

    def reset(self):
        self.cached_len = 0


def test_top_n_backend_keeps_the_top_entries_of_the_rows_the_loop_reads():
    base = np.array([[3, 1, 2, 0, -1, 5], [0, 0, 4, 4, 1, 2], [1, 2, 3, 4, 5, 6]], dtype=np.float32)
    last = apv.TopNBackend(_Fixed(base), top_n=2)
    rows = last.forward([7, 8, 9], 0)
    assert (rows[:2] == apv.FLOOR).all()  # the drafter's loop reads only the last row
    assert rows[2].tolist() == [apv.FLOOR] * 4 + [5, 6]
    from_pos = apv.TopNBackend(_Fixed(base), top_n=2, reads_from=1)
    rows = from_pos.forward([7, 8, 9], 0)
    assert (rows[0] == apv.FLOOR).all()
    assert rows[1].tolist() == [apv.FLOOR, apv.FLOOR, 4, 4, apv.FLOOR, apv.FLOOR]  # a tie kept by index order
    assert len(from_pos.kept_mass) == 2 and all(0 < m <= 1 for m in from_pos.kept_mass)
    # Off the kept entries softmax is exactly 0 at every temperature the vectors use.
    for temp in (0.5, 1.0, 1.3):
        p = softmax(rows[2], temp)
        assert p[:4].sum() == 0.0 and p[4:].sum() == pytest.approx(1.0)
    with pytest.raises(AssertionError, match="floor"):
        apv.TopNBackend(_Fixed(np.full((1, 6), -2e4, np.float32)), top_n=2).forward([1], 0)


def test_tiny_pair_vectors_replay_and_a_changed_row_is_noticed(tmp_path, tokenizer_path):
    """End to end on random-weight models: record, write, replay; then perturb one stored logit."""
    d = make_tiny_model(tmp_path / "d", "llama", tokenizer_path("llama-spm"), seed=1, max_pos=256)
    t = make_tiny_model(tmp_path / "t", "qwen2", tokenizer_path("gpt-2"), seed=2, max_pos=256)
    runs = [
        (
            "tiny-sample-ngram",
            "def f(x):",
            dict(temperature=1.0, draft_len=3, mode="ngram", max_new_tokens=10, seed=1),
            None,
        ),
        ("tiny-greedy-dm", "def f(x):", dict(temperature=0.0, draft_len=3, mode="dm", max_new_tokens=8), "chain"),
    ]
    data = apv.pair_vectors(d, t, top_n=8, runs=runs, progress=False)
    assert data["top_n"] == 8 and data["drafter_weights_sha256"] == apv.weights_sha256(d)
    dc, tc = load_codec(d / "tokenizer.json"), load_codec(t / "tokenizer.json")
    data = json.loads(json.dumps(data))  # through JSON, as the Java side reads it
    for run in data["runs"]:
        rows = [row for c in run["calls"] if c["op"] == "forward" for row in c["rows"] if row["i"]]
        assert rows and all(len(row["i"]) <= 8 for row in rows)
        assert apv.replay_run(run, dc, tc) == {k: v for k, v in run.items() if k != "kept_mass"}
    # The draws depend on the stored values: swapping the top two logits of every target row the
    # sampling run read changes its trace (or the calls it makes).
    run = data["runs"][0]
    for c in run["calls"]:
        if c["m"] == "target" and c["op"] == "forward":
            for row in c["rows"]:
                if len(row["v"]) >= 2:
                    row["v"][0], row["v"][-1] = row["v"][-1], row["v"][0]
    try:
        changed = apv.replay_run(run, dc, tc) != {k: v for k, v in run.items() if k != "kept_mass"}
    except AssertionError:
        changed = True
    assert changed


def test_command_refuses_a_bad_top_n(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnidraft.cli",
            "android-vectors",
            "--only",
            "pair",
            "--top-n",
            "0",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert "--top-n" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())
