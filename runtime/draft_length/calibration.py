"""Online correction of the acceptance head per drafted token, from verifications already run.

The head is trained on a stream while the drafter is distilled on it, so what it learned about a
token describes the drafter of a few updates ago: tokens it rated near even odds can be accepted
almost always, because the drafter has learned them since (docs/decisions.md). Every verification tells us, for free, whether each drafted token was
accepted, so the runtime keeps a logit offset per drafted token and moves it by one step of
online logistic regression per observation, on the same loss the head was trained with (BCE on
the target token's acceptance, the product over its drafter sub-tokens). Offsets only move where
drafting stops, never which tokens are emitted. Pure Python: the torch-free ONNX Runtime path runs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from omnidraft.errors import InvalidArgument
from omnidraft.runtime.draft_length.policy import log_sigmoid, observed_targets

if TYPE_CHECKING:
    from omnidraft.runtime.decode_stats import RoundTrace


@dataclass
class TokenCalibration:
    lr: float = 0.5  # logit step per observation (a token is right again within a few rounds)
    limit: float = 8.0  # |offset| cap: sigmoid(8) = 0.9997, beyond that nothing changes
    offsets: dict[int, float] = field(default_factory=dict)
    observed: int = 0  # target tokens observed so far

    def __post_init__(self) -> None:
        if not (self.lr >= 0 and self.limit > 0):
            raise InvalidArgument(f"token calibration needs lr >= 0 and limit > 0 (got {self.lr}, {self.limit})")

    def observe(self, rounds: list[RoundTrace]) -> None:
        """Update from one prompt's traced rounds, decoded with the current offsets."""
        if not self.lr:
            return
        start = dict(self.offsets)
        for r in rounds:
            z, draft = r.accept_logits, r.draft
            for _, _, a, b, ok in observed_targets(r.spans, r.accepted):
                if len(z) >= b:
                    self._step(draft[a:b], z[a:b], ok, start)

    def _step(self, tokens: list[int], z: list[float], accepted: bool, start: dict[int, float]) -> None:
        # Logits as they would be now: the recorded ones carry the offsets the prompt decoded with.
        now = [zi + self.offsets.get(t, 0.0) - start.get(t, 0.0) for t, zi in zip(tokens, z)]
        logp = sum(log_sigmoid(x) for x in now)
        # d/dz_i of log P (accepted) or log(1 - P) (rejected), P = prod sigmoid(z_i)
        scale = 1.0 if accepted else -math.exp(logp) / max(-math.expm1(logp), 1e-9)
        for t, x in zip(tokens, now):
            grad = scale * (1.0 - math.exp(log_sigmoid(x)))
            self.offsets[t] = max(-self.limit, min(self.limit, self.offsets.get(t, 0.0) + self.lr * grad))
        self.observed += 1
