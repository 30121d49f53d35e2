"""`omnidraft cache list | prune`: the export cache that bench, demo and adaptation fill."""

from __future__ import annotations

import argparse
import json
import time

HELP = "list or prune the cached exports (bench, demo and adaptation add one per model variant), with sizes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    ls = sub.add_parser("list", help="every cached export with its size and last use, and the total")
    pr = sub.add_parser("prune", help="remove cached exports by age and/or keep the most recently used")
    pr.add_argument(
        "--older-than", metavar="AGE", help="remove exports unused for AGE: 30d, 12h, 90m (a number is days)"
    )
    pr.add_argument("--keep", type=int, metavar="N", help="keep only the N most recently used exports")
    pr.add_argument("--dry-run", action="store_true", help="show what would be removed, remove nothing")
    for q in (ls, pr):
        q.add_argument("--json", action="store_true", help="print one JSON object")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _ago(t: float) -> str:
    s = max(0.0, time.time() - t)
    return f"{s / 86400:.1f} d" if s >= 86400 else f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min"


def run(args: argparse.Namespace) -> int:
    from omnidraft.bench import export_cache
    from omnidraft.errors import InvalidArgument

    if args.action is None:
        raise InvalidArgument(
            "say what to do: omnidraft cache list, or omnidraft cache prune --older-than AGE | --keep N"
        )
    base = export_cache.root()
    if args.action == "list":
        shown = export_cache.entries()
        total = sum(e.bytes for e in shown)
        if args.json:
            print(json.dumps({"root": str(base), "exports": [e.as_dict() for e in shown], "total_bytes": total}))
            return 0
        for e in shown:
            print(f"{_mib(e.bytes):>11}  used {_ago(e.last_used):>9} ago  {e.path.relative_to(base)}")
        print(f"{len(shown)} cached exports, {_mib(total)} in {base}")
        return 0
    age = None if args.older_than is None else export_cache.parse_age(args.older_than)
    removed, kept = export_cache.prune(older_than=age, keep=args.keep, dry_run=args.dry_run)
    freed, left = sum(e.bytes for e in removed), sum(e.bytes for e in kept)
    if args.json:
        print(
            json.dumps(
                {
                    "root": str(base),
                    "dry_run": args.dry_run,
                    "removed": [e.as_dict() for e in removed],
                    "kept": [e.as_dict() for e in kept],
                    "freed_bytes": freed,
                    "kept_bytes": left,
                }
            )
        )
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for e in removed:
        print(f"{verb} {e.path.relative_to(base)} ({_mib(e.bytes)}, used {_ago(e.last_used)} ago)")
    print(f"{verb} {len(removed)} exports ({_mib(freed)}); kept {len(kept)} ({_mib(left)}) in {base}")
    return 0
