"""Acceptance by token class: which kinds of target tokens a drafter gets right and which it costs.

A drafter that proposes whitespace and punctuation well and identifiers badly needs other training
than one that misses the template's markers, so the exactness check splits its acceptance by what the
proposed target token spells: whitespace (spaces, newlines, indentation), word (identifiers and words,
a leading space allowed), number, punctuation (operators, brackets, quotes), mixed (several of these)
and special (tokens that decode to no text, such as chat-template markers). Per class it reports how
many target tokens the drafter proposed and how many of them the target accepted, and of the tokens
the target wrote, the share that came from an accepted draft (coverage).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

CLASSES = ("whitespace", "word", "number", "punctuation", "mixed", "special")


def classify(text: str) -> str:
    core = text.strip()
    if not text:
        return "special"
    if not core:
        return "whitespace"
    if core.replace("_", "a").isalnum() and not core.isdigit():
        return "word" if not any(c.isdigit() for c in core[:1]) else "mixed"
    if core.replace(".", "").replace(",", "").isdigit():
        return "number"
    if not any(c.isalnum() for c in core):
        return "punctuation"
    return "mixed"


@dataclass
class ClassCounts:
    proposed: int = 0
    accepted: int = 0
    written: int = 0  # target tokens committed
    covered: int = 0  # of those, from an accepted draft

    def add(self, other: ClassCounts) -> None:
        self.proposed += other.proposed
        self.accepted += other.accepted
        self.written += other.written
        self.covered += other.covered


def tally(rounds: Iterable, decode: Callable[[list[int]], str], into: dict[str, ClassCounts]) -> None:
    """Add traced rounds (runtime.decode_stats.RoundTrace) to ``into``, class by class. A round's
    first ``accepted`` proposals were accepted; its committed tokens past them are the target's own."""
    cls: dict[int, str] = {}

    def of(token: int) -> str:
        if token not in cls:
            cls[token] = classify(decode([token]))
        return cls[token]

    for r in rounds:
        for i, t in enumerate(r.target_ids):
            c = into.setdefault(of(t), ClassCounts())
            c.proposed += 1
            c.accepted += i < r.accepted
        for i, t in enumerate(r.committed):
            c = into.setdefault(of(t), ClassCounts())
            c.written += 1
            c.covered += i < r.accepted


def table(by_stream: dict[str, dict[str, ClassCounts]]) -> str:
    """One row per (stream and mode, class) that has any token."""
    lines = [
        "| stream | class | target tokens written | share of them | proposed | acceptance | coverage |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, counts in by_stream.items():
        total = sum(c.written for c in counts.values()) or 1
        for k in CLASSES:
            c = counts.get(k)
            if c is None or not (c.written or c.proposed):
                continue
            acc = f"{c.accepted / c.proposed:.3f}" if c.proposed else "–"
            cov = f"{c.covered / c.written:.3f}" if c.written else "–"
            lines.append(f"| {name} | {k} | {c.written} | {c.written / total:.1%} | {c.proposed} | {acc} | {cov} |")
    return "\n".join(lines)
