"""`omnidraft check-exact`: speculative greedy output equals target-only on held-out prompts."""

from __future__ import annotations

import argparse

HELP = "check that a pair's speculative greedy output equals target-only, token for token, on held-out prompts"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", required=True, help="HF folder, export folder, .gguf file or model name")
    p.add_argument("--target", required=True, help="HF folder, export folder, .gguf file or model name")
    p.add_argument("--streams", default="code,math,text", help="comma-separated: code, math, text")
    p.add_argument("--prompts", type=int, default=16, help="held-out prompts per stream (default 16)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--draft-len", type=int, default=4, metavar="K")
    p.add_argument("--modes", default="dm,ngram", help="drafting modes to check: dm, ngram")
    p.add_argument(
        "--chat-from", help="model folder or name whose chat template wraps the prompts (default: the target's)"
    )
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from omnidraft.bench.exactness import MODES, check_exact, table
    from omnidraft.errors import InvalidArgument
    from omnidraft.models.sources import resolve
    from omnidraft.models.streams import STREAMS

    streams = tuple(s.strip() for s in args.streams.split(",") if s.strip())
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if bad := [s for s in streams if s not in STREAMS] + [m for m in modes if m not in MODES]:
        raise InvalidArgument(
            f"unknown stream or mode {', '.join(bad)}; streams: {', '.join(STREAMS)}; modes: dm, ngram"
        )
    if args.prompts < 1 or args.max_new_tokens < 1 or args.draft_len < 1:
        raise InvalidArgument("--prompts, --max-new-tokens and --draft-len must be >= 1")
    rows = check_exact(
        resolve(args.drafter),
        resolve(args.target),
        streams=streams,
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        draft_len=args.draft_len,
        modes=modes,
        target_folder=resolve(args.chat_from) if args.chat_from else None,
        progress=not args.no_progress,
    )
    print(table(rows))
    return 0 if all(r.exact for r in rows) else 3
