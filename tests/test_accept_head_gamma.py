"""The per-stream gamma controller: deterministic hill climb on measured tokens/s (fake timings)."""

from __future__ import annotations

import pytest

from omnidraft.errors import InvalidArgument
from omnidraft.runtime.gamma import GammaController


def _rate(gamma: float, peak: float) -> float:
    return 100.0 - 200.0 * (gamma - peak) ** 2  # tokens/s, best at ``peak``


@pytest.mark.parametrize("peak", [0.3, 0.7, 0.9])
def test_climbs_towards_the_fastest_gamma(peak):
    c = GammaController(gamma=0.5, window=2)
    for _ in range(80):
        g = c.gamma
        c.observe(int(_rate(g, peak)), 1.0)
    tail = [h["gamma"] for h in c.history[-10:]]
    assert abs(sum(tail) / len(tail) - peak) < 0.12, (peak, tail)
    assert all(c.lo <= h["gamma"] <= c.hi for h in c.history)


def test_window_and_determinism():
    a, b = GammaController(window=3), GammaController(window=3)
    seq = [(40, 1.0), (50, 1.0), (45, 1.0), (10, 1.0), (12, 1.0), (11, 1.0), (60, 1.0)]
    ga = [a.observe(t, s) for t, s in seq]
    gb = [b.observe(t, s) for t, s in seq]
    assert ga == gb
    assert ga[0] == ga[1] == 0.5 and ga[2] > 0.5        # moves only after a full window, longer first
    assert ga[5] < ga[4]                                 # throughput fell: it turns around
    assert len(a.history) == 2


def test_bounds_and_bad_settings():
    c = GammaController(gamma=0.9, window=1, hi=0.95)
    for _ in range(10):
        c.observe(100, 1.0)                              # never slower: keeps pushing, stays bounded
    assert c.gamma <= 0.95
    for bad in (dict(gamma=0.0), dict(gamma=0.99), dict(window=0), dict(step=0.0)):
        with pytest.raises(InvalidArgument):
            GammaController(**bad)
