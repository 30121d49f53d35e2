"""How one generation decodes: the mode, K or the adaptive policy, sampling, the context lookup.
``DecodeConfig.validate`` is the one place these settings are checked."""

from __future__ import annotations

import math
from dataclasses import dataclass

from omnidraft.errors import InvalidArgument
from omnidraft.runtime.context_lookup import LookupConfig
from omnidraft.runtime.draft_length.policy import validate_adaptive

MODES = ("ngram", "dm", "target-only")
# Sampling with merged n-grams: "exact" proposes only what it can score (runtime/exact_proposal.py);
# "paper" merges every cached n-gram with Eq. 1-2, approximately (tests/test_exact_sampling.py
# measures its gap on an adversarial n-gram).
NGRAM_SAMPLING = ("exact", "paper")


@dataclass
class DecodeConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0
    draft_len: int | str = 4  # K, or "auto": the drafter's acceptance head decides
    mode: str = "ngram"
    seed: int = 0
    lookbehind: int = 8
    gamma: float = 0.5  # auto: stop once P(some drafted token is rejected) > gamma
    max_draft_len: int = 16  # auto: K_max; 0 turns drafting off (the online controller sets it)
    splits: bool = True  # ngram mode, greedy: draft unmapped tokens the target spells with several
    # auto: logit offsets per drafted token, learned online from past verifications (runtime.accept_online)
    accept_offsets: dict[int, float] | None = None
    ngram_sampling: str = "exact"  # temperature > 0, ngram mode: "exact" | "paper" (NGRAM_SAMPLING)
    lookup: LookupConfig | None = None  # copy drafts from the context where it repeats (runtime/context_lookup.py)

    @property
    def uses_splits(self) -> bool:
        # Sampling needs q' for every proposed target token (Eq. 1-2), which a split does not define.
        return self.splits and self.mode == "ngram" and self.temperature == 0

    @property
    def exact_ngrams(self) -> bool:
        return self.mode == "ngram" and self.temperature > 0 and self.ngram_sampling == "exact"

    @property
    def adaptive(self) -> bool:
        return self.draft_len == "auto"

    @property
    def k_max(self) -> int:
        return self.max_draft_len if self.adaptive else self.draft_len

    @property
    def longest_proposal(self) -> int:
        """The most target tokens one round can propose (the KV room a generation must leave)."""
        return max(self.k_max, self.lookup.max_tokens if self.lookup is not None else 0)

    @property
    def drafts(self) -> bool:
        """The one test of "drafting off": the target-only mode, or a longest draft of 0."""
        return self.mode != "target-only" and self.k_max > 0

    def validate(self) -> None:
        if self.mode not in MODES:
            raise InvalidArgument(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise InvalidArgument(
                f"temperature must be >= 0 and finite (got {self.temperature}); use 0 for greedy decoding"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InvalidArgument(f"seed must be an integer >= 0 (got {self.seed})")
        if self.ngram_sampling not in NGRAM_SAMPLING:
            raise InvalidArgument(
                f"unknown n-gram sampling rule {self.ngram_sampling!r}; choose one of {', '.join(NGRAM_SAMPLING)}"
            )
        validate_adaptive(self.draft_len, self.gamma, self.max_draft_len or 1)
        if self.lookup is not None:
            self.lookup.validate()
        if self.max_new_tokens < 1:
            raise InvalidArgument(f"max new tokens must be >= 1 (got {self.max_new_tokens})")
