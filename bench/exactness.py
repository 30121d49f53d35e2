"""Greedy speculative output vs target-only output on every stream's held-out prompts, for any pair.

The check an accelerator drafter has to pass: its numerics differ from the CPU's (fp16 or QDQ on an
NPU), and the target's verification must still make the output exactly target-only's. Acceptance is
reported; timings are not, since a simulated accelerator's clock says nothing about a device's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omnidraft.errors import ContextOverflow
from omnidraft.models.streams import STREAMS, load_stream
from omnidraft.runtime.session import open_pair
from omnidraft.runtime.speculative import DecodeConfig


@dataclass
class StreamCheck:
    stream: str
    prompts: int = 0
    identical: int = 0
    proposed: int = 0
    accepted: int = 0
    skipped: int = 0  # prompts that do not fit a model's context with the new tokens
    mismatches: list[str] = field(default_factory=list)  # prompt ids whose outputs differ

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


def check_pair(
    drafter: Path,
    target: Path,
    *,
    streams: tuple[str, ...] = STREAMS,
    prompts: int = 10,
    max_new_tokens: int = 32,
    draft_len: int = 4,
    mode: str = "ngram",
    progress=None,
) -> tuple[dict, list[StreamCheck]]:
    """Run each stream's first ``prompts`` held-out prompts both ways; (pair description, per stream)."""
    dec = open_pair(target, drafter)
    pair = {
        "drafter": str(drafter),
        "drafter_device": dec.drafter.info.get("device", "cpu"),
        "drafter_backend": dec.drafter.backend.name,
        "target": str(target),
        "target_device": dec.target.info.get("device", "cpu"),
        "target_backend": dec.target.backend.name,
    }
    out = []
    for s in streams:
        check = StreamCheck(s)
        for p in load_stream(s, "test")[:prompts]:
            try:
                ref = dec.generate(p.prompt, DecodeConfig(max_new_tokens=max_new_tokens, mode="target-only"))
                got = dec.generate(
                    p.prompt, DecodeConfig(max_new_tokens=max_new_tokens, mode=mode, draft_len=draft_len)
                )
            except ContextOverflow:
                check.skipped += 1
                continue
            check.prompts += 1
            check.proposed += got.stats.proposed
            check.accepted += got.stats.accepted
            if got.token_ids == ref.token_ids:
                check.identical += 1
            else:
                check.mismatches.append(p.id)
            if progress is not None:
                progress(s, check)
        out.append(check)
    return pair, out


def table(pair: dict, checks: list[StreamCheck]) -> str:
    lines = [
        f"drafter {pair['drafter']} on {pair['drafter_device']} ({pair['drafter_backend']}); "
        f"target {pair['target']} on {pair['target_device']} ({pair['target_backend']})",
        "| stream | held-out prompts | identical to target-only | too long for the context | drafted | accepted | acceptance |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in checks:
        lines.append(
            f"| {c.stream} | {c.prompts} | {c.identical} | {c.skipped} | {c.proposed} | {c.accepted} | {c.acceptance:.3f} |"
        )
    return "\n".join(lines)
