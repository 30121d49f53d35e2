"""How many tokens a round drafts: one policy interface the speculative loop asks "draft another?"
and tells what each drafted token's acceptance logit was.

``FixedK`` drafts K tokens. ``HeadThreshold`` (paper §4, after SpecDec++) stops once the drafter's
acceptance head says a rejection is likely: after drafting d_1..d_i with predicted conditional
acceptances a_1..a_i, stop once 1 - prod(a) > gamma, with i in [1, K_max] (Eq. 6/7).
Cross-vocabulary: the target verifies translated tokens, and a merged n-gram is one target token
whose acceptance is the product over its drafter sub-tokens, so the product over target tokens
equals the product over the drafter tokens they cover; the rule is only *applied* where the draft
ends on a target-token boundary. The online controller (``controller.GammaController``) tunes
``HeadThreshold``'s gamma and K_max between prompts from what the traced rounds show.

Drafting off has one spelling: K_max 0 (``DecodeConfig.drafts`` is False), decoded with plain
target steps. Pure Python: the torch-free ONNX Runtime path runs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from omnidraft.errors import InvalidArgument
from omnidraft.runtime.exact_proposal import FED_LOGIT


@runtime_checkable
class AcceptHeadBackend(Protocol):
    """The optional capability of a drafter backend that carries an acceptance head.

    ``forward_with_accept`` has ``forward``'s cache semantics and returns (logits [len, vocab],
    accept_logits [len]); accept_logits[r] is the head's logit that the token drafted from logits
    row r is accepted, before that token is known. ``accept_bias(token)`` is the head's
    per-drafted-token bias, which the loop adds once it has chosen the token (the graph cannot know
    a sampled token)."""

    has_accept_head: bool

    def forward_with_accept(self, token_ids: Sequence[int], start_pos: int) -> tuple[np.ndarray, np.ndarray]: ...

    def accept_bias(self, token: int) -> float: ...


def has_accept_head(backend: object) -> bool:
    return bool(getattr(backend, "has_accept_head", False))


class DraftPolicy(Protocol):
    """Asked once per drafted token whether the round drafts another."""

    k_max: int  # the longest draft; 0: drafting is off
    uses_head: bool  # reads the drafter's acceptance head (drafting calls forward_with_accept)

    def begin(self) -> None:
        """A new round starts."""

    def drafted(self, token: int, head_logit: float, fed: int) -> None:
        """A token was drafted from a row whose head logit is ``head_logit`` (ignored without a head);
        ``fed`` more sub-tokens were fed after it without being drafted."""

    def more(self, drafted: int, k: int, spans: Callable[[], list[tuple[int, int]]], max_ngram: int) -> bool:
        """Draft another token after ``drafted`` of at most ``k``? ``spans()`` translates the draft so
        far (called only when the rule needs it)."""

    @property
    def accept_logits(self) -> list[float]:
        """This round's accept logits per drafted token (empty without a head)."""


class FixedK:
    uses_head = False

    def __init__(self, k: int) -> None:
        self.k_max = k

    def begin(self) -> None:
        pass

    def drafted(self, token: int, head_logit: float, fed: int) -> None:
        pass

    def more(self, drafted: int, k: int, spans: Callable[[], list[tuple[int, int]]], max_ngram: int) -> bool:
        return True

    @property
    def accept_logits(self) -> list[float]:
        return []


class HeadThreshold:
    uses_head = True

    def __init__(self, gamma: float, k_max: int, offsets: dict[int, float] | None = None) -> None:
        self.gamma, self.k_max, self.offsets = gamma, k_max, offsets or {}
        self.begin()

    def begin(self) -> None:
        self._logits: list[float] = []
        self._log_acc = 0.0

    def drafted(self, token: int, head_logit: float, fed: int) -> None:
        # the head's logit for row r, plus the bias of the token drafted from it and its online offset
        z = head_logit + self.offsets.get(token, 0.0)
        self._logits.append(z)
        self._log_acc += log_sigmoid(z)
        self._logits += [FED_LOGIT] * fed

    def more(self, drafted: int, k: int, spans: Callable[[], list[tuple[int, int]]], max_ngram: int) -> bool:
        # A draft ending inside an n-gram (or on a sub-token with no direct mapping) would lose its
        # tail in translation and its product would count tokens the target never sees, so drafting
        # goes on until the tokens close a target token (or K_max, or the tail can no longer become
        # an n-gram); the product over those drafter tokens is then the product over the merged ones.
        return not (
            drafted < k and rejection_prob(self._log_acc) > self.gamma and may_stop(spans(), drafted, max_ngram)
        )

    @property
    def accept_logits(self) -> list[float]:
        return self._logits


def policy_for(draft_len: int | str, gamma: float, max_draft_len: int, offsets: dict[int, float] | None) -> DraftPolicy:
    return HeadThreshold(gamma, max_draft_len, offsets) if draft_len == "auto" else FixedK(draft_len)


def parse_draft_len(text: str | int) -> int | str:
    """``--draft-len``: a positive integer K, or ``auto`` (the acceptance head decides)."""
    if isinstance(text, int) or (isinstance(text, str) and text.strip().lower() == "auto"):
        return text if isinstance(text, int) else "auto"
    try:
        return int(text)
    except (TypeError, ValueError):
        raise InvalidArgument(f"--draft-len takes a positive integer K or 'auto' (got {text!r})") from None


def validate_adaptive(draft_len: int | str, gamma: float, max_draft_len: int) -> None:
    if draft_len != "auto" and (not isinstance(draft_len, int) or isinstance(draft_len, bool) or draft_len < 1):
        raise InvalidArgument(f"draft length K must be >= 1 (got {draft_len!r}), or 'auto' for the acceptance head")
    if not (isinstance(gamma, (int, float)) and 0.0 < gamma < 1.0):
        raise InvalidArgument(f"--gamma must be within (0, 1) (got {gamma}); 0.3 stops early, 0.7 drafts longer")
    if not isinstance(max_draft_len, int) or max_draft_len < 1:
        raise InvalidArgument(f"--max-draft-len (K_max) must be >= 1 (got {max_draft_len})")


def log_sigmoid(z: float) -> float:
    return -math.log1p(math.exp(-z)) if z >= 0 else z - math.log1p(math.exp(z))


def rejection_prob(log_accept: float) -> float:
    """P(some drafted token is rejected) = 1 - prod(a), from the running sum of log a."""
    return -math.expm1(log_accept)


def observed_targets(spans: list[tuple[int, int]], accepted: int, limit: int | None = None):
    """The target tokens a verified round observed, as the head is trained and corrected on them:
    (first, end, a, b, ok) per group of target tokens ``first:end`` proposed by drafter tokens
    ``a:b``, up to and including the first rejection. A split drafter token proposes several target
    tokens under one span: one group, accepted only if all of them are (the stopping rule multiplies
    per drafter token). ``limit`` caps the target tokens looked at."""
    n = min(len(spans), accepted + 1, len(spans) if limit is None else limit)
    j = 0
    while j < n:
        a, b = spans[j]
        e = j + 1
        while e < len(spans) and spans[e] == (a, b):
            e += 1
        yield j, e, a, b, e <= accepted
        j = e


def may_stop(spans: list[tuple[int, int]], drafted: int, max_ngram: int) -> bool:
    """May drafting stop after ``drafted`` tokens? Yes where the translated target tokens cover the
    whole draft. Also where the untranslated tail is already as long as the longest cached n-gram:
    no further token can complete it, so drafting on would only waste drafter calls."""
    covered = spans[-1][1] if spans else 0
    return covered == drafted or drafted - covered >= max(1, max_ngram)
