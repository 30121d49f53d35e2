"""Decode a list of prompts with one configuration and aggregate what the paper reports."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from tqdm import tqdm

from omnidraft.runtime.speculative import DecodeConfig, DecodeStats, SpeculativeDecoder


@dataclass
class StreamRun:
    label: str
    mode: str
    draft_len: int
    prompts: int = 0
    stats: DecodeStats = field(default_factory=DecodeStats)
    running_acceptance: list[float] = field(default_factory=list)  # after each prompt
    outputs: list[list[int]] = field(default_factory=list)
    interrupted: bool = False

    @property
    def tokens_per_s(self) -> float:
        return self.stats.new_tokens / self.stats.seconds if self.stats.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second after the target's prompt pass, which every mode pays alike (the
        paper's per-step convention: prefill is not part of a decoding step)."""
        t = self.stats.decode_seconds
        return self.stats.new_tokens / t if t > 0 else 0.0

    def row(self) -> dict:
        s = self.stats
        return {
            "label": self.label,
            "mode": self.mode,
            "draft_len": self.draft_len,
            "prompts": self.prompts,
            "acceptance_rate": round(s.acceptance_rate, 4),
            "tokens_per_step": round(s.tokens_per_step, 4),
            "ngram_hits_per_step": round(s.ngram_hits / s.steps, 4) if s.steps else 0.0,
            "split_tokens_per_step": round(s.split_accepted / s.steps, 4) if s.steps else 0.0,
            "tokens_per_s": round(self.tokens_per_s, 2),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "new_tokens": s.new_tokens,
            "steps": s.steps,
            "seconds": round(s.seconds, 3),
            "prefill_seconds": round(s.prefill_seconds, 3),
            "overhead_fraction": round(s.overhead_fraction, 4),
        }


def run_stream(
    decoder: SpeculativeDecoder,
    prompts: list[str],
    cfg: DecodeConfig,
    label: str,
    progress: bool = True,
    on_verified=None,
) -> StreamRun:
    """Decode every prompt; Ctrl-C keeps the prompts finished so far (``interrupted`` is set)."""
    run = StreamRun(label, cfg.mode, cfg.draft_len)
    bar = tqdm(prompts, desc=label, file=sys.stderr, disable=not progress, leave=False, dynamic_ncols=True)
    try:
        for prompt in bar:
            out = decoder.generate(prompt, cfg, on_verified=on_verified)
            run.stats += out.stats
            run.prompts += 1
            run.outputs.append(out.token_ids)
            run.running_acceptance.append(run.stats.acceptance_rate)
            bar.set_postfix(acc=f"{run.stats.acceptance_rate:.2f}", tok_s=f"{run.tokens_per_s:.0f}")
    except KeyboardInterrupt:
        run.interrupted = True
    finally:
        bar.close()
    return run
