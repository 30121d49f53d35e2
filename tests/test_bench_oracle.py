"""The math oracle bound (bench/oracle.py): rounds, tokens and costs counted by hand."""

from __future__ import annotations

import pytest

from omnidraft.bench.oracle import Oracle, score


def test_oracle_rounds_end_at_each_number():
    # " There are 3 * 10 = 72 left.\n" -> words run up to each number, which the target supplies.
    spelled = [b" There", b" are", b" 3", b" *", b" 10", b" =", b" 72", b" left", b".", b"\n"]
    o = Oracle()
    score(o, b"Question: 3 boxes of 10. Answer:", spelled, c=0.5, v=0.25)
    # rounds: [There are | 3] [* | 10] [= | 72] [left . \n] (the last run ends the answer, no number)
    assert (o.rounds, o.tokens, o.numbers) == (4, 10, 3)
    assert o.numbers_seen_before == 2  # 3 and 10 are in the question; 72 is new
    runs = [2, 1, 1, 3]
    assert o.cost == pytest.approx(sum(1 + 0.5 * (r + 1) + 0.25 * r for r in runs))
    assert o.tokens_per_call == pytest.approx(2.5)
    assert o.speedup == pytest.approx(10 / o.cost)


def test_oracle_consecutive_numbers_cost_a_round_each():
    o = Oracle()
    score(o, b"", [b" 1", b" 2"], c=0.1, v=0.1)
    assert (o.rounds, o.tokens, o.numbers, o.numbers_seen_before) == (2, 2, 2, 0)
    assert o.speedup == pytest.approx(2 / (2 * 1.1))


def test_numbers_are_matched_whole():
    o = Oracle()
    score(o, b"costs 172 dollars", [b" 72"], c=0.0, v=0.0)
    assert o.numbers_seen_before == 0  # "72" inside "172" is not the number 72


@pytest.mark.parametrize("args,expect", [(["--stream", "nope"], "nope"), (["--prompts", "0"], "--prompts 0")])
def test_bad_arguments_get_one_line_and_exit_1(capsys, args, expect):
    from omnidraft.bench.oracle import main

    assert main([*args, "--cost-ratio", "0.2", "--verify-cost", "0.2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("omnidraft.bench.oracle: error:") and expect in err
