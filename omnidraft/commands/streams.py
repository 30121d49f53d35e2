"""`omnidraft streams`: list the task streams and print their prompts."""

from __future__ import annotations

import argparse
import sys

HELP = "list the task streams (code, math, text) with prompt counts, or print prompts of one"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream", help="code | math | text (default: all)")
    p.add_argument("--split", help="train | test (default: both in the listing, test for --show)")
    p.add_argument("--show", type=int, default=0, metavar="N", help="print the first N prompts of each listed stream")
    p.add_argument("--file", help="instead of a built-in stream, check and print a JSONL stream file")


def run(args: argparse.Namespace) -> int:
    from omnidraft.errors import InvalidArgument
    from omnidraft.models import streams

    if args.show < 0:
        raise InvalidArgument(f"--show must be >= 0, got {args.show}")
    if args.file:
        prompts = {("file", "-"): streams.load_stream_file(args.file)}
    else:
        names = [args.stream] if args.stream else list(streams.STREAMS)
        splits = [args.split] if args.split else (["test"] if args.show else list(streams.SPLITS))
        prompts = {(n, s): streams.load_stream(n, s) for n in names for s in splits}
    if not args.show:
        print("| stream | split | prompts | mean prompt chars | mean reference chars |")
        print("|---|---|---:|---:|---:|")
    for (name, split), ps in prompts.items():
        if not args.show:
            mp = sum(len(p.prompt) for p in ps) / len(ps)
            mr = sum(len(p.reference) for p in ps) / len(ps)
            print(f"| {name} | {split} | {len(ps)} | {mp:.0f} | {mr:.0f} |")
            continue
        for p in ps[: args.show]:
            sys.stdout.write(f"=== {p.id}\n{p.prompt}\n")
            if p.reference:
                sys.stdout.write(f"--- reference\n{p.reference}\n")
    return 0
