"""Acceptance of a drafter on a set of prompts (drift guard window, held-out evaluation).

Each measurement decodes greedily with its own copy of the n-gram cache, so measurements compare
drafter weights on equal terms and never leak test text into the pair's saved cache.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from omnidraft.errors import ContextOverflow
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.speculative import SpeculativeDecoder


@dataclass
class Measure:
    prompts: int = 0
    skipped: int = 0
    accepted: int = 0
    proposed: int = 0
    steps: int = 0
    new_tokens: int = 0
    ngram_hits: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    def summary(self) -> dict:
        return {
            "prompts": self.prompts,
            "skipped": self.skipped,
            "acceptance": round(self.acceptance, 4),
            "accepted": self.accepted,
            "proposed": self.proposed,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "ngram_hits": self.ngram_hits,
        }


def measure(
    decoder: SpeculativeDecoder, prompts: list[str], cfg: DecodeConfig, copy_cache: bool = True, progress=None
) -> Measure:
    """Decode ``prompts`` with ``cfg`` through a decoder sharing the models but with a copy of the cache."""
    cache = copy.deepcopy(decoder.cache) if copy_cache else decoder.cache
    dec = SpeculativeDecoder(decoder.target, decoder.drafter if cfg.mode != "target-only" else None, cache)
    m = Measure()
    for p in prompts:
        try:
            r = dec.generate(p, cfg)
        except ContextOverflow:
            m.skipped += 1
            continue
        st = r.stats
        m.prompts += 1
        m.accepted += st.accepted
        m.proposed += st.proposed
        m.steps += st.steps
        m.new_tokens += st.new_tokens
        m.ngram_hits += st.ngram_hits
        m.outputs.append(r.token_ids)
        if progress is not None:
            progress(m)
    return m
