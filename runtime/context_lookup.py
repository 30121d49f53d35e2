"""Context lookup: propose the target's next tokens by copying what followed the same n-gram earlier
in its own context (the prompt and what it has written so far).

Answers repeat their prompt (code echoes the signature and names it was given, summaries quote their
passage) and themselves; where the last few target tokens occurred before, what followed them then is
a draft that needs no model, no translation and no drafter call. A round takes the lookup's proposal
when there is one and the drafter's otherwise; verification is unchanged, so greedy output stays
token for token the target's, and under sampling a copied token is a proposal with all its mass on one
token (q' = 1), which the accept rule of Eq. 1-2 handles as any other.

The index maps each n-gram (min_ngram..max_ngram target tokens) to the position after its latest
occurrence, and is extended as tokens are committed, so a round's lookup costs a few dict reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnidraft.errors import InvalidArgument


@dataclass(frozen=True)
class LookupConfig:
    max_tokens: int = 6  # tokens copied per round at most
    min_ngram: int = 2  # the shortest suffix that may match (1 copies after any repeated token)
    max_ngram: int = 4  # longer matches are tried first: they predict more reliably

    def validate(self) -> None:
        require_counts(self, ("max_tokens", "min_ngram", "max_ngram"), "context lookup")
        if self.max_ngram < self.min_ngram:
            raise InvalidArgument(
                f"context lookup n-grams: the longest ({self.max_ngram}) is shorter than the shortest "
                f"({self.min_ngram}); pass --lookup-ngram MIN-MAX with MIN <= MAX"
            )


def require_counts(cfg: object, names: tuple[str, ...], what: str) -> None:
    """Each named field of ``cfg`` is an integer >= 1, else one line naming it."""
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidArgument(f"{what} {name.replace('_', ' ')} must be an integer >= 1 (got {v!r})")


def parse_ngram_range(text: str) -> tuple[int, int]:
    """``"2-4"`` -> (2, 4); ``"3"`` -> (3, 3). One line naming the fix for anything else."""
    parts = text.split("-")
    if len(parts) in (1, 2) and all(p.strip().isdigit() for p in parts):
        lo, hi = int(parts[0]), int(parts[-1])
        if 1 <= lo <= hi:
            return lo, hi
    raise InvalidArgument(f"--lookup-ngram must be MIN-MAX with 1 <= MIN <= MAX, such as 2-4 (got {text!r})")


class ContextIndex:
    """The n-gram index of one generation's target context."""

    def __init__(self, cfg: LookupConfig, context: list[int]) -> None:
        self.cfg = cfg
        self.ctx: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}
        self.extend(context)

    def extend(self, tokens: list[int]) -> None:
        """Append committed tokens. An n-gram is indexed once a token follows it, so the context's own
        last n-gram never matches itself."""
        ctx, lo, hi = self.ctx, self.cfg.min_ngram, self.cfg.max_ngram
        start = len(ctx)
        ctx += tokens
        for end in range(max(start - 1, 0), len(ctx) - 1):  # n-grams ending at `end`, followed by end + 1
            for n in range(lo, min(hi, end + 1) + 1):
                self.index[tuple(ctx[end - n + 1 : end + 1])] = end + 1

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the longest earlier match of the context's suffix."""
        ctx = self.ctx
        for n in range(min(self.cfg.max_ngram, len(ctx)), self.cfg.min_ngram - 1, -1):
            at = self.index.get(tuple(ctx[-n:]))
            if at is not None:
                return ctx[at : at + min(limit, self.cfg.max_tokens)]
        return []
