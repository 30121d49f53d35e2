"""Decode a list of prompts with one configuration and aggregate what the paper reports."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from tqdm import tqdm

from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.decode_stats import DecodeStats
from omnidraft.runtime.speculative import SpeculativeDecoder


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
            "lookup_rounds": s.lookup_rounds,
            "lookup_acceptance": round(s.lookup_accepted / s.lookup_proposed, 4) if s.lookup_proposed else None,
            "memory_rounds": s.memory_rounds,
            "memory_acceptance": round(s.memory_accepted / s.memory_proposed, 4) if s.memory_proposed else None,
            "tokens_per_s": round(self.tokens_per_s, 2),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "new_tokens": s.new_tokens,
            "steps": s.steps,
            "seconds": round(s.seconds, 3),
            "prefill_seconds": round(s.prefill_seconds, 3),
            "overhead_fraction": round(s.overhead_fraction, 4),
        }


def _add(run: StreamRun, out) -> None:
    run.stats += out.stats
    run.prompts += 1
    run.outputs.append(out.token_ids)
    run.running_acceptance.append(run.stats.acceptance_rate)


def run_lockstep(
    decoder: SpeculativeDecoder,
    prompts: list[str],
    cfgs: dict[str, DecodeConfig],
    label: str,
    progress: bool = True,
    *,
    decoders: dict[str, SpeculativeDecoder] | None = None,
) -> dict[str, StreamRun]:
    """Every configuration decodes prompt i before any decodes prompt i + 1, in an order that rotates
    from prompt to prompt: a drift in the machine's load then slows all of them alike, so the ratio
    of their speeds holds. Ctrl-C keeps the prompts every configuration finished. ``decoders`` gives a
    configuration its own decoder (one whose answer memory must not learn another's answers)."""
    own = {n: (decoders or {}).get(n, decoder) for n in cfgs}
    runs = {name: StreamRun(name, c.mode, c.draft_len) for name, c in cfgs.items()}
    names = list(cfgs)
    bar = tqdm(prompts, desc=label, file=sys.stderr, disable=not progress, leave=False, dynamic_ncols=True)
    try:
        for i, prompt in enumerate(bar):
            outs = {n: own[n].generate(prompt, cfgs[n]) for n in names[i % len(names) :] + names[: i % len(names)]}
            for n in names:
                _add(runs[n], outs[n])
    except KeyboardInterrupt:
        for run in runs.values():
            run.interrupted = True
    finally:
        bar.close()
    return runs
