"""Exactness check: on held-out stream prompts, speculative greedy output equals target-only greedy
output token for token, for each drafting mode, through the artifacts a user deploys.

This is the product's first promise, and the check a user runs on their own pair before trusting a
speedup: the same prompts are decoded target-only and then in each mode (a fresh n-gram cache per
stream), and every output is compared; the table says where any differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omnidraft.bench.streams_eval import run_stream
from omnidraft.models.streams import load_stream
from omnidraft.runtime.speculative import DecodeConfig

MODES = ("dm", "ngram")


@dataclass(frozen=True)
class ExactnessRow:
    stream: str
    mode: str
    prompts: int
    tokens: int
    identical: int  # prompts whose output equals target-only's
    acceptance: float
    tokens_per_call: float

    @property
    def exact(self) -> bool:
        return self.identical == self.prompts


def check_exact(
    drafter: Path,
    target: Path,
    *,
    streams: tuple[str, ...],
    prompts: int,
    max_new_tokens: int,
    draft_len: int,
    modes: tuple[str, ...] = MODES,
    target_folder: Path | None = None,
    progress: bool = True,
) -> list[ExactnessRow]:
    """``target_folder``: the model folder whose chat template wraps the prompts (default: ``target``)."""
    from omnidraft.runtime.session import open_pair

    rows = []
    for name in streams:
        texts = [p.prompt for p in load_stream(name, "test", target=target_folder or target)[:prompts]]
        base_dec = open_pair(target, None)
        only = DecodeConfig(max_new_tokens=max_new_tokens, mode="target-only")
        base = run_stream(base_dec, texts, only, f"{name}: target-only", progress)
        for mode in modes:
            dec = open_pair(target, drafter)  # a fresh n-gram cache per stream and mode
            cfg = DecodeConfig(max_new_tokens=max_new_tokens, mode=mode, draft_len=draft_len)
            run = run_stream(dec, texts, cfg, f"{name}: {mode}", progress)
            same = sum(a == b for a, b in zip(base.outputs, run.outputs))
            st = run.stats
            rows.append(
                ExactnessRow(name, mode, run.prompts, st.new_tokens, same, st.acceptance_rate, st.tokens_per_step)
            )
    return rows


def table(rows: list[ExactnessRow]) -> str:
    lines = [
        "| stream | mode | prompts | tokens | identical to target-only | acceptance | tokens/target call |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        same = "yes" if r.exact else f"NO ({r.identical}/{r.prompts})"
        lines.append(
            f"| {r.stream} | {r.mode} | {r.prompts} | {r.tokens} | {same} | {r.acceptance:.3f} | {r.tokens_per_call:.2f} |"
        )
    return "\n".join(lines)
