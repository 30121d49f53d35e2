"""Answer memory: propose the target's next tokens from what it wrote after the same n-gram in earlier
generations (their prompts and answers), counted across runs.

A user's prompts resemble each other, and so do the target's answers: the same openings ("To solve
this problem, we need to ..."), numbered plans and phrases recur from one answer to the next. The
context lookup (runtime/context_lookup.py) sees only the current generation; the memory keeps the
target tokens of the last ``capacity`` tokens' worth of generations and, for every n-gram of them
(min_ngram..max_ngram), how often each token followed it.
A round with no context match asks the memory: the longest n-gram of the context's suffix it has seen
gives the continuation it saw most often, chained token by token while the continuation is confident
(seen ``min_count`` times and at least ``min_share`` of the n-gram's continuations). Like a copied
draft it needs no drafter call and no translation, and verification is unchanged, so greedy output
stays token for token the target's; under sampling each token is a proposal with q' = 1.

The memory grows as it is used: the decoder adds every finished generation, oldest generations leave
first once it holds ``capacity`` tokens. On disk it is JSON (the generations themselves; the counts
are rebuilt on load) bound to the target tokenizer's hash, written atomically.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import asdict, dataclass
from pathlib import Path

from omnidraft.atomic import write_json
from omnidraft.errors import CacheFileError, InvalidArgument
from omnidraft.runtime.context_lookup import require_counts
from omnidraft.validate import Fields, MiB, parse_json, read_bytes

FORMAT = "omnidraft-answer-memory"
VERSION = 1
MAX_FILE_BYTES = 32 * MiB  # ~4 M token ids: far above any capacity a phone would keep
HINT = "delete it to start an empty memory"


@dataclass(frozen=True)
class MemoryConfig:
    capacity: int = 65536  # target tokens kept, whole generations, oldest dropped first
    min_ngram: int = 2
    max_ngram: int = 4  # longer matches are tried first: they predict more reliably
    # A continuation is proposed when it followed its n-gram at least min_count times and at least
    # min_share of the time: replaying saved Qwen and Gemma answers, 1 and 0.5 proposed the most
    # accepted tokens per verify cost (2 halves the rounds it proposes in; a lower share wastes them).
    min_count: int = 1
    min_share: float = 0.5

    def validate(self) -> None:
        require_counts(self, ("capacity", "min_ngram", "max_ngram", "min_count"), "answer memory")
        if self.max_ngram < self.min_ngram:
            raise InvalidArgument(
                f"answer memory n-grams: the longest ({self.max_ngram}) is shorter than the shortest ({self.min_ngram})"
            )
        if (
            isinstance(self.min_share, bool)
            or not isinstance(self.min_share, (int, float))
            or not 0 <= self.min_share <= 1
        ):
            raise InvalidArgument(f"answer memory min share must be a number in [0, 1] (got {self.min_share!r})")


class AnswerMemory:
    """Continuation counts over the target tokens of earlier generations of one target tokenizer."""

    def __init__(self, tokenizer: str, cfg: MemoryConfig | None = None) -> None:
        self.cfg = cfg or MemoryConfig()
        self.cfg.validate()
        self.tokenizer = tokenizer
        self.sequences: deque[list[int]] = deque()
        self.tokens = 0
        self.counts: dict[tuple[int, ...], Counter[int]] = {}

    def __len__(self) -> int:
        return len(self.sequences)

    def add(self, tokens: list[int]) -> None:
        """Remember one generation (prompt and answer, target ids); the oldest leave past capacity."""
        seq = list(tokens[-self.cfg.capacity :])
        if len(seq) < self.cfg.min_ngram + 1:
            return
        self._count(seq, +1)
        self.sequences.append(seq)
        self.tokens += len(seq)
        while self.tokens > self.cfg.capacity:
            old = self.sequences.popleft()
            self._count(old, -1)
            self.tokens -= len(old)

    def _count(self, seq: list[int], delta: int) -> None:
        lo, hi, counts = self.cfg.min_ngram, self.cfg.max_ngram, self.counts
        for end in range(lo - 1, len(seq) - 1):  # n-grams ending at `end`, followed by end + 1
            nxt = seq[end + 1]
            for n in range(lo, min(hi, end + 1) + 1):
                key = tuple(seq[end - n + 1 : end + 1])
                c = counts.get(key)
                if c is None:
                    c = counts[key] = Counter()
                c[nxt] += delta
                if c[nxt] <= 0:
                    del c[nxt]
                    if not c:
                        del counts[key]

    def propose(self, context: list[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens, each the confident continuation of the longest n-gram it has seen
        ending the context (with the tokens proposed so far appended)."""
        cfg, out, ctx = self.cfg, [], list(context[-self.cfg.max_ngram :])
        while len(out) < limit:
            for n in range(min(cfg.max_ngram, len(ctx)), cfg.min_ngram - 1, -1):
                c = self.counts.get(tuple(ctx[-n:]))
                if c is not None:
                    break
            else:
                break
            tok, k = c.most_common(1)[0]
            if k < cfg.min_count or k < cfg.min_share * sum(c.values()):
                break  # the longest match is unsure: a shorter one would only guess more
            out.append(tok)
            ctx.append(tok)
        return out

    def save(self, path: str | Path) -> None:
        write_json(
            path,
            {
                "format": FORMAT,
                "version": VERSION,
                "tokenizer": self.tokenizer,
                "config": asdict(self.cfg),
                "sequences": list(self.sequences),
            },
            compact=True,
        )

    @classmethod
    def load(cls, path: str | Path, tokenizer: str, vocab_size: int) -> AnswerMemory:
        """The memory saved at ``path``, refused in one line when it is not one, belongs to another
        target tokenizer, or holds ids outside the target's vocabulary."""
        where = f"answer memory {path}"
        data = read_bytes(path, error=CacheFileError, what="answer memory", fix=HINT, limit=MAX_FILE_BYTES)
        doc = parse_json(data, error=CacheFileError, where=where, fix=HINT)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise CacheFileError(f"{path} is not an omnidraft answer memory (format {FORMAT} v{VERSION}); {HINT}")
        f = Fields(doc, where=where, error=CacheFileError, fix=HINT)
        if f.str("tokenizer") != tokenizer:
            raise CacheFileError(f"{where} was built for another target tokenizer; use this target's memory or {HINT}")
        c = f.sub("config")
        try:
            cfg = MemoryConfig(
                capacity=c.int("capacity", lo=1),
                min_ngram=c.int("min_ngram", lo=1),
                max_ngram=c.int("max_ngram", lo=1),
                min_count=c.int("min_count", lo=1),
                min_share=c.number("min_share", lo=0, hi=1),
            )
            memory = cls(tokenizer, cfg)
        except InvalidArgument as exc:
            raise CacheFileError(f"{where}: {exc}; {HINT}") from None
        seqs = f.list("sequences")
        for n, s in enumerate(seqs):
            if not isinstance(s, list) or any(
                isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size for t in s
            ):
                raise CacheFileError(f"{where}: sequence {n} must be a list of token ids in [0, {vocab_size}); {HINT}")
            memory.add(s)
        return memory
