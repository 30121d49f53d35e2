"""Acceptance by token class: the classes, the tally of traced rounds, and `omnidraft exactness`
reporting it on a tiny pair with totals that add up to the check's own counts."""

from __future__ import annotations

import json

import pytest

from omnidraft.bench.token_classes import ClassCounts, classify, table, tally
from omnidraft.cli import main
from omnidraft.runtime.decode_stats import RoundTrace


@pytest.mark.parametrize(
    "text, cls",
    [
        ("", "special"),
        ("\n    ", "whitespace"),
        (" return", "word"),
        ("x_1", "word"),
        ("3.14", "number"),
        ("):\n", "punctuation"),
        (" +=", "punctuation"),
        ("(x", "mixed"),
        ("1st", "mixed"),
    ],
)
def test_classes(text, cls):
    assert classify(text) == cls


def test_a_round_counts_its_accepted_proposals_and_the_targets_own_token():
    spell = {1: " def", 2: " f", 3: "(", 4: "\n", 5: ""}
    rounds = [
        RoundTrace(target_ids=[1, 2, 4], accepted=2, extra=3, committed=[1, 2, 3]),  # " def f" then "(" wanted
        RoundTrace(target_ids=[], accepted=0, extra=5, committed=[5]),  # nothing drafted
    ]
    counts: dict[str, ClassCounts] = {}
    tally(rounds, lambda ids: "".join(spell[i] for i in ids), counts)
    assert vars(counts["word"]) == {"proposed": 2, "accepted": 2, "written": 2, "covered": 2}
    assert vars(counts["whitespace"]) == {"proposed": 1, "accepted": 0, "written": 0, "covered": 0}
    assert vars(counts["punctuation"]) == {"proposed": 0, "accepted": 0, "written": 1, "covered": 0}
    assert vars(counts["special"]) == {"proposed": 0, "accepted": 0, "written": 1, "covered": 0}
    md = table({"code (ngram)": counts})
    assert "| code (ngram) | word | 2 | 50.0% | 2 | 1.000 | 1.000 |" in md
    assert "| code (ngram) | whitespace | 0 | 0.0% | 1 | 0.000 | – |" in md


def test_exactness_reports_acceptance_by_class(make_tiny_pair, tmp_path, capsys):
    d, t = make_tiny_pair(512)
    out = tmp_path / "exact.json"
    argv = ["exactness", "--drafter", str(d), "--target", str(t), "--streams", "code,math", "--prompts", "2"]
    code = main([*argv, "--max-new-tokens", "12", "--draft-len", "3", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "Acceptance by token class" in capsys.readouterr().out
    for row in json.loads(out.read_text())["streams"]:
        by = row["by_class"].values()
        assert sum(c["proposed"] for c in by) == row["proposed"] and sum(c["accepted"] for c in by) == row["accepted"]
        assert sum(c["written"] for c in by) == row["tokens"]
        assert all(c["covered"] <= c["written"] and c["accepted"] <= c["proposed"] for c in by)


def test_exactness_checks_the_pair_with_copied_drafts_too(make_tiny_pair, tmp_path, capsys):
    d, t = make_tiny_pair(512)
    out = tmp_path / "exact.json"
    argv = ["exactness", "--drafter", str(d), "--target", str(t), "--streams", "code", "--prompts", "3"]
    code = main([*argv, "--max-new-tokens", "24", "--lookup", "4", "--lookup-ngram", "1-3", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = json.loads(out.read_text())["streams"]
    assert rows and all(r["identical"] == r["prompts"] == 3 for r in rows)
    assert sum(r["copied_rounds"] for r in rows) > 0
