"""`omnidraft exactness`: speculative greedy output vs target-only on the streams' held-out prompts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omnidraft.commands._decoding import add_draft_length, add_lookup, lookup_config

HELP = "check that a drafter/target pair's greedy speculative output equals target-only on held-out prompts"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", required=True, help="drafter: export folder (any device), HF folder, .gguf or name")
    p.add_argument("--target", required=True, help="target: export folder, HF folder, .gguf file or model name")
    p.add_argument("--streams", default="code,math,text", help="comma-separated: code, math, text")
    p.add_argument("--prompts", type=int, default=10, help="held-out prompts per stream (default 10)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    add_draft_length(p, auto=False)
    p.add_argument("--modes", default="dm,ngram", help="drafting modes to check, comma-separated: dm, ngram")
    add_lookup(p, default=0, note="; acceptance then counts copied and drafted tokens together")
    p.add_argument(
        "--chat-from", help="model folder or name whose chat template wraps the prompts (default: the target's)"
    )
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")


def run(args: argparse.Namespace) -> int:
    from omnidraft.atomic import write_text
    from omnidraft.bench.exactness import MODES, check_pair, table
    from omnidraft.errors import InvalidArgument
    from omnidraft.models.sources import resolve
    from omnidraft.models.streams import STREAMS

    streams = tuple(s.strip() for s in args.streams.split(",") if s.strip())
    if args.prompts < 1 or args.max_new_tokens < 1 or args.draft_len < 1:
        raise InvalidArgument("--prompts, --max-new-tokens and --draft-len must be >= 1")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if bad := [s for s in streams if s not in STREAMS] + [m for m in modes if m not in MODES]:
        raise InvalidArgument(
            f"unknown stream or mode {', '.join(bad)}; streams: {', '.join(STREAMS)}; modes: dm, ngram"
        )

    def progress(stream, c) -> None:
        print(f"{stream} ({c.mode}): {c.identical}/{c.prompts} identical", file=sys.stderr)

    pair, checks = check_pair(
        resolve(args.drafter),
        resolve(args.target),
        streams=streams,
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        draft_len=args.draft_len,
        modes=modes,
        lookup=lookup_config(args),
        chat_from=resolve(args.chat_from) if args.chat_from else None,
        progress=progress,
    )
    print(table(pair, checks))
    if args.json:
        rows = [
            {**vars(c), "acceptance": c.acceptance, "by_class": {k: vars(v) for k, v in c.by_class.items()}}
            for c in checks
        ]
        write_text(args.json, json.dumps({"pair": pair, "streams": rows}, indent=2) + "\n")
    bad = [m for c in checks for m in c.mismatches]
    if bad:
        print(
            f"speculative output differs from target-only on {len(bad)} prompt(s): {', '.join(bad[:5])}",
            file=sys.stderr,
        )
        return 1
    return 0
