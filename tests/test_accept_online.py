"""Per-drafted-token corrections of the acceptance head, learned online from verified rounds
(runtime/draft_length/calibration.py), and their hand-off to the loop through the gamma controller."""

from __future__ import annotations

import dataclasses
import math
import random
from types import SimpleNamespace

import pytest

from omnidraft.errors import InvalidArgument
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.decode_stats import RoundTrace
from omnidraft.runtime.draft_length.calibration import TokenCalibration
from omnidraft.runtime.draft_length.controller import GammaController


def _round(tokens, z, accepted, spans=None):
    spans = spans or [(i, i + 1) for i in range(len(tokens))]
    return RoundTrace(draft=list(tokens), spans=spans, accepted=accepted, accept_logits=list(z))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_offsets_converge_to_each_tokens_acceptance():
    """The head says 0.5 for every token; token 5 is accepted 90 % of the time, token 9 20 %, token 7
    (drafted third) never, and token 6 after it is never observed: its offset must not move."""
    rng = random.Random(0)
    cal = TokenCalibration()
    traj = {5: [], 9: []}
    for _ in range(400):  # one prompt per round; offsets apply from the next prompt, as in the loop
        z = [cal.offsets.get(t, 0.0) for t in (5, 9, 7, 6)]
        a5, a9 = rng.random() < 0.9, rng.random() < 0.2
        acc = 0 if not a5 else (1 if not a9 else 2)
        cal.observe([_round([5, 9, 7, 6], z, acc)])
        for t in traj:
            traj[t].append(cal.offsets.get(t, 0.0))
    mean = {t: sum(v[-200:]) / 200 for t, v in traj.items()}
    assert _sigmoid(mean[5]) == pytest.approx(0.9, abs=0.06)
    assert _sigmoid(mean[9]) == pytest.approx(0.2, abs=0.08)
    assert cal.offsets[7] < -2.0 and 6 not in cal.offsets
    assert cal.observed > 400


def test_a_merged_ngram_moves_all_its_sub_tokens_by_the_products_gradient():
    cal = TokenCalibration(lr=1.0)
    # one target token made of drafter tokens 3 and 4 (head: 0.8 each, product 0.64), rejected
    cal.observe([_round([3, 4], [math.log(4), math.log(4)], 0, spans=[(0, 2)])])
    p = 0.64
    expected = -p / (1 - p) * (1 - 0.8)
    assert cal.offsets[3] == pytest.approx(expected) and cal.offsets[4] == pytest.approx(expected)
    cal2 = TokenCalibration(lr=1.0)
    cal2.observe([_round([3, 4], [math.log(4), math.log(4)], 1, spans=[(0, 2)])])
    assert cal2.offsets[3] == pytest.approx(0.2) and cal2.offsets[4] == pytest.approx(0.2)


def test_a_split_token_is_one_observation_accepted_only_if_all_its_target_tokens_are():
    cal = TokenCalibration(lr=1.0)
    # drafter token 8 splits into three target tokens; the target accepted two of them
    cal.observe([_round([8], [0.0], 2, spans=[(0, 1)] * 3)])
    assert cal.observed == 1 and cal.offsets[8] == pytest.approx(-0.5)
    cal.observe([_round([8], [cal.offsets[8]], 3, spans=[(0, 1)] * 3)])
    assert cal.observed == 2 and cal.offsets[8] > -0.5


def test_offsets_are_bounded_and_can_be_turned_off():
    cal = TokenCalibration(lr=5.0, limit=3.0)
    for _ in range(50):
        cal.observe([_round([1, 2], [0.0, 0.0], 1)])  # 1 accepted, 2 rejected, every time
    assert cal.offsets[1] == pytest.approx(3.0) and cal.offsets[2] == pytest.approx(-3.0)
    off = TokenCalibration(lr=0.0)
    off.observe([_round([1], [0.0], 0)])
    assert off.offsets == {} and off.observed == 0
    for bad in ({"lr": -0.1}, {"limit": 0.0}):
        with pytest.raises(InvalidArgument, match="token calibration"):
            TokenCalibration(**bad)


def test_the_controller_hands_its_offsets_to_the_loop():
    def result(tok, acc):
        r = dataclasses.replace(
            _round([tok], [0.0], acc),
            target_ids=[tok],
            committed=[0] * (acc + 1),
            drafter_call_seconds=[1e-3],
            target_fed=2,
            target_seconds=2e-3,
        )
        return SimpleNamespace(rounds=[r], stats=SimpleNamespace(steps=1, decode_seconds=4e-3, new_tokens=acc + 1))

    ctl, cfg = GammaController(window=4), DecodeConfig(draft_len="auto")
    ctl.observe(result(11, 0))
    ctl.configure(cfg)
    assert cfg.accept_offsets == {11: pytest.approx(-0.25)}
    cfg.accept_offsets[11] = 5.0  # the config holds a copy
    assert ctl.calibration.offsets[11] == pytest.approx(-0.25)
    plain = GammaController(window=4, token_lr=0.0)
    plain.observe(result(11, 0))
    plain.configure(cfg)
    assert cfg.accept_offsets is None
