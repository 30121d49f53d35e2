"""What a generation reports: its counts and times (``DecodeStats``), each verified round when
traced (``RoundTrace``), and the result itself (``DecodeResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from omnidraft.runtime.translate import Translation


@dataclass
class DecodeStats:
    steps: int = 0  # target calls
    proposed: int = 0  # translated target tokens sent for verification
    accepted: int = 0
    ngram_proposed: int = 0
    ngram_hits: int = 0  # merged n-gram tokens the target accepted
    ngram_added: int = 0
    split_proposed: int = 0  # target tokens proposed through a split drafter token
    split_accepted: int = 0
    lookup_rounds: int = 0  # rounds that proposed copied tokens (context or answer memory) instead of drafting
    lookup_proposed: int = 0
    lookup_accepted: int = 0
    memory_rounds: int = 0  # of those, the rounds the answer memory proposed
    memory_proposed: int = 0
    memory_accepted: int = 0
    drafter_calls: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0  # the target's prompt pass: the same work in every mode
    drafter_seconds: float = 0.0
    target_seconds: float = 0.0

    def record_round(self, tr: Translation, accepted: int, split: list[bool], added: int) -> None:
        """Count one verified round: ``split`` marks the target tokens a split drafter token proposed."""
        self.proposed += len(tr)
        self.accepted += accepted
        self.ngram_proposed += sum(key is not None for key in tr.keys)
        self.ngram_hits += sum(key is not None for key in tr.keys[:accepted])
        self.split_proposed += sum(split)
        self.split_accepted += sum(split[:accepted])
        self.ngram_added += added

    def __iadd__(self, other: DecodeStats) -> DecodeStats:
        """Sum another decode's counts and times into this one (a stream's total over its prompts)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def decode_seconds(self) -> float:
        """Wall time after the target's prompt pass (the paper's per-step convention compares this)."""
        return self.seconds - self.prefill_seconds

    @property
    def overhead_fraction(self) -> float:
        """Share of wall time spent outside the two models (translation, sampling, bookkeeping)."""
        return 1.0 - (self.drafter_seconds + self.target_seconds) / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class RoundTrace:
    """One verified round as tracing records it. The online controller replays rounds from the
    timings and head logits, the acceptance head learns from draft/spans/accepted, and the Android
    vectors keep every field but the timings (``TIMING``)."""

    draft: list[int] = field(default_factory=list)  # drafter tokens, n-gram sub-tokens fed after a head included
    target_ids: list[int] = field(default_factory=list)  # their translation, as verified
    spans: list[tuple[int, int]] = field(default_factory=list)  # drafter positions [a, b) of each target token
    merged: list[bool] = field(default_factory=list)  # target token i is a cached n-gram
    accepted: int = 0  # target tokens accepted
    extra: int = -1  # the correction or bonus token
    committed: list[int] = field(default_factory=list)  # target tokens appended (cut at EOS / the budget)
    uniforms: list[float] = field(default_factory=list)  # random draws, in order (sampling)
    ngram_added: int = 0
    drafter_cache_kept: int = 0  # drafter KV positions kept after the resync
    context: list[int] = field(default_factory=list)  # the drafter's context the round drafted from
    accept_logits: list[float] = field(default_factory=list)  # per drafted token (adaptive drafting)
    drafter_call_seconds: list[float] = field(default_factory=list)
    target_fed: int = 0  # tokens fed to the verification call
    target_seconds: float = 0.0  # its time

    TIMING: ClassVar[tuple[str, ...]] = ("drafter_call_seconds", "target_fed", "target_seconds")


@dataclass
class DecodeResult:
    text: str
    token_ids: list[int]
    stats: DecodeStats
    rounds: list[RoundTrace] = field(default_factory=list)  # filled only when tracing
