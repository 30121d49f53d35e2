"""What limits math: the best a drafter could do if it never guessed the target's numbers.

The bundled target writes worked answers whose arithmetic is its own (often wrong), so the numbers
it writes are not predictable from the question. This module decodes the target alone (greedy, the
deployed ONNX Runtime int8 export) and scores an oracle drafter that proposes every other target
token right and every number wrong: each round accepts the run of words up to the next number,
which then comes as the target's correction token. Its tokens per target call and its speedup
under a simple cost model are an upper bound for any drafter that cannot predict the numbers:

    round cost = 1 (a one-token target step) + c * (run + 1) drafter calls + v * run extra verified tokens

with ``c`` a drafter call and ``v`` one more verified token, both as fractions of a one-token target
step (measure them: ``omnidraft bench`` reports c per row; verification cost per token is in
models/README.md). Speedup = tokens / (sum of round costs), target-only costing 1 per token.

    python -m omnidraft.bench.oracle --stream math --prompts 32 --cost-ratio 0.2 --verify-cost 0.2
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

from omnidraft.errors import InvalidArgument, OmnidraftError

NUMBER = re.compile(rb"^ ?\d+$")


@dataclass
class Oracle:
    tokens: int = 0
    rounds: int = 0
    numbers: int = 0
    numbers_seen_before: int = 0  # numbers already written in the prompt or earlier in the answer
    cost: float = 0.0

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0

    @property
    def speedup(self) -> float:
        return self.tokens / self.cost if self.cost else 0.0


def score(oracle: Oracle, prompt: bytes, spelled: list[bytes], c: float, v: float) -> None:
    """Add one target-only answer (its tokens' bytes) to ``oracle``."""
    i = 0
    while i < len(spelled):
        j = i
        while j < len(spelled) and not NUMBER.match(spelled[j]):
            j += 1
        run = j - i
        oracle.tokens += run + (j < len(spelled))
        oracle.rounds += 1
        oracle.cost += 1 + c * (run + 1) + v * run
        if j < len(spelled):
            oracle.numbers += 1
            digits = re.escape(spelled[j].strip())
            if re.search(rb"(?<!\d)" + digits + rb"(?!\d)", prompt + b"".join(spelled[:j])):
                oracle.numbers_seen_before += 1
        i = j + 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream", default="math")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--cost-ratio", type=float, required=True, help="c: one drafter call / one target step")
    ap.add_argument("--verify-cost", type=float, required=True, help="v: one more verified token / one target step")
    args = ap.parse_args(argv)
    try:
        oracle = measure(args.stream, args.prompts, args.max_new_tokens, args.cost_ratio, args.verify_cost)
    except OmnidraftError as exc:
        print(f"omnidraft.bench.oracle: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"{args.stream}, {args.prompts} test prompts: {oracle.tokens} target tokens, {oracle.numbers} numbers "
        f"({oracle.numbers / max(oracle.tokens, 1):.0%}; {oracle.numbers_seen_before} written earlier in the prompt or answer)"
    )
    print(
        f"oracle drafter (every other token right, every number wrong): {oracle.tokens_per_call:.2f} tokens per "
        f"target call, speedup bound {oracle.speedup:.2f}x at c = {args.cost_ratio}, v = {args.verify_cost}"
    )
    return 0


def measure(stream: str, prompts: int, max_new_tokens: int, c: float, v: float) -> Oracle:
    """Decode ``prompts`` test prompts with the bundled target alone and score the oracle on them."""
    from omnidraft.bench.bundled import BUNDLED, cached_export
    from omnidraft.models.streams import load_stream
    from omnidraft.runtime.decode_config import DecodeConfig
    from omnidraft.runtime.session import open_pair

    if prompts < 1:
        raise InvalidArgument(f"--prompts {prompts}: give at least 1")
    test = load_stream(stream, "test")[:prompts]  # before the export: a wrong stream fails at once
    dec = open_pair(cached_export(BUNDLED / "target", "onnx", "int8", 512, progress=True), None)
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, temperature=0.0, mode="target-only")
    oracle = Oracle()
    for p in test:
        ids = dec.generate(p.prompt, cfg).token_ids
        score(oracle, p.prompt.encode(), [dec.target.codec.spell([t]) for t in ids], c, v)
    return oracle


if __name__ == "__main__":
    raise SystemExit(main())
