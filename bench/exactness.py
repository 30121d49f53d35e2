"""Exactness check: on every stream's held-out prompts, greedy speculative output equals target-only
output token for token, for each drafting mode, through the artifacts a user deploys.

This is the product's first promise and the check a user runs on their own pair before trusting a
speedup, or an accelerator drafter whose numerics differ from the CPU's (fp16 or QDQ on an NPU): the
target's verification must still make the output exactly target-only's. Each stream and mode starts
from an empty n-gram cache; prompts are wrapped in the target's chat template where it has one.
Acceptance is reported; timings are not (a simulated accelerator's clock says nothing of a device's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from omnidraft.bench import token_classes
from omnidraft.bench.token_classes import ClassCounts, tally
from omnidraft.errors import ContextOverflow
from omnidraft.models.streams import STREAMS, load_stream
from omnidraft.runtime.context_lookup import LookupConfig
from omnidraft.runtime.decode_config import DecodeConfig

MODES = ("dm", "ngram")


@dataclass
class StreamCheck:
    stream: str
    mode: str
    prompts: int = 0
    identical: int = 0
    tokens: int = 0
    proposed: int = 0
    accepted: int = 0
    skipped: int = 0  # prompts that do not fit a model's context with the new tokens
    copied_rounds: int = 0  # rounds that copied their draft from the context (with a lookup)
    mismatches: list[str] = field(default_factory=list)  # prompt ids whose outputs differ
    by_class: dict[str, ClassCounts] = field(default_factory=dict)  # bench/token_classes.py

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def exact(self) -> bool:
        return not self.mismatches


def check_pair(
    drafter: Path,
    target: Path,
    *,
    streams: tuple[str, ...] = STREAMS,
    prompts: int = 10,
    max_new_tokens: int = 32,
    draft_len: int = 4,
    modes: tuple[str, ...] = MODES,
    lookup: LookupConfig | None = None,
    chat_from: Path | None = None,
    progress: Callable[[str, StreamCheck], None] | None = None,
) -> tuple[dict, list[StreamCheck]]:
    """Each stream's first ``prompts`` held-out prompts, target-only and in each mode; returns (pair
    description, one check per stream and mode). ``chat_from``: the folder whose chat template wraps
    the prompts (default: the target's own). ``lookup``: rounds may also copy drafts from the context,
    as `generate` does by default."""
    from omnidraft.runtime.session import open_pair

    base = open_pair(target, drafter)
    pair = {
        "drafter": str(drafter),
        "drafter_device": base.drafter.info.get("device", "cpu"),
        "drafter_backend": base.drafter.backend.name,
        "target": str(target),
        "target_device": base.target.info.get("device", "cpu"),
        "target_backend": base.target.backend.name,
    }
    out = []
    for s in streams:
        items = load_stream(s, "test", target=chat_from or target)[:prompts]
        refs = {}
        for p in items:
            try:
                refs[p.id] = base.generate(p.prompt, DecodeConfig(max_new_tokens=max_new_tokens, mode="target-only"))
            except ContextOverflow:
                refs[p.id] = None
        for mode in modes:
            dec = open_pair(target, drafter)  # an empty n-gram cache for every stream and mode
            check = StreamCheck(s, mode)
            for p in items:
                if refs[p.id] is None:
                    check.skipped += 1
                    continue
                got = dec.generate(
                    p.prompt,
                    DecodeConfig(max_new_tokens=max_new_tokens, mode=mode, draft_len=draft_len, lookup=lookup),
                    trace=True,
                )
                tally(got.rounds, dec.target.codec.decode, check.by_class)
                check.prompts += 1
                check.tokens += len(got.token_ids)
                check.proposed += got.stats.proposed
                check.accepted += got.stats.accepted
                check.copied_rounds += got.stats.lookup_rounds
                if got.token_ids == refs[p.id].token_ids:
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
        "| stream | mode | held-out prompts | identical to target-only | too long for the context | tokens | acceptance |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in checks:
        lines.append(
            f"| {c.stream} | {c.mode} | {c.prompts} | {c.identical} | {c.skipped} | {c.tokens} | {c.acceptance:.3f} |"
        )
    lines += ["", "Acceptance by token class (what each proposed or written target token spells):", ""]
    lines.append(token_classes.table({f"{c.stream} ({c.mode})": c.by_class for c in checks}))
    return "\n".join(lines)
