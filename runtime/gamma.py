"""Online tuning of the stopping threshold gamma, one controller per stream (paper §4.1: gamma 0.3
suits text, 0.7 code/math, "choose it per task, then adjust it from online performance").

A bounded hill climb on measured throughput: gamma is held for ``window`` prompts, their tokens/s
(total tokens / total seconds) is compared with the previous window's, and gamma moves one step in
logit space in the same direction if throughput did not drop, else turns around with half the step
(down to ``min_step``, which keeps it probing as the drafter and head keep training). Logit space
makes a step near 0.9 small in probability, where 1 - prod(P) is most sensitive. Deterministic
given the timings; no clock is read here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from omnidraft.errors import InvalidArgument


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


@dataclass
class GammaController:
    gamma: float = 0.5
    window: int = 4             # prompts per measurement
    step: float = 0.5           # logit-space step
    min_step: float = 0.125
    lo: float = 0.05
    hi: float = 0.95
    direction: int = 1          # +1 drafts longer first
    history: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.lo <= self.gamma <= self.hi < 1:
            raise InvalidArgument(f"gamma {self.gamma} must lie within [{self.lo}, {self.hi}] for online tuning")
        if self.window < 1 or not self.step > 0 or not 0 < self.min_step <= self.step:
            raise InvalidArgument("gamma tuning needs window >= 1 and 0 < min_step <= step")
        self._tokens, self._seconds, self._n = 0, 0.0, 0
        self._last_rate: float | None = None

    def observe(self, tokens: int, seconds: float) -> float:
        """Record one decoded prompt; returns the gamma to use for the next one."""
        self._tokens += tokens
        self._seconds += seconds
        self._n += 1
        if self._n < self.window:
            return self.gamma
        rate = self._tokens / self._seconds if self._seconds > 0 else 0.0
        self._tokens, self._seconds, self._n = 0, 0.0, 0
        if self._last_rate is not None and rate < self._last_rate:
            self.direction = -self.direction
            self.step = max(self.min_step, self.step / 2)
        self._last_rate = rate
        old = self.gamma
        z = _logit(self.gamma) + self.direction * self.step
        self.gamma = min(self.hi, max(self.lo, 1.0 / (1.0 + math.exp(-z))))
        if self.gamma in (self.lo, self.hi) and self.gamma == old:
            self.direction = -self.direction  # pinned at a bound: probe back inwards next time
        self.history.append({"tokens_per_s": round(rate, 3), "gamma_was": round(old, 4), "gamma": round(self.gamma, 4)})
        return self.gamma
