"""`omnidraft android-vectors`: write the vectors the Android app's Java core replays in CI."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "write tokenizer and speculative-loop vectors for android_demo/specdecode-core (Java tests replay them)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from omnidraft.export.android_vectors import VECTOR_DIR

    p.add_argument("--out", type=Path, default=VECTOR_DIR, help=f"output folder (default: {VECTOR_DIR})")
    p.add_argument("--only", choices=("tokenizers", "loop"), help="write just one kind")


def run(args: argparse.Namespace) -> int:
    from omnidraft.export.android_vectors import write_loop_vectors, write_tokenizer_vectors

    written = []
    if args.only in (None, "tokenizers"):
        written += write_tokenizer_vectors(args.out)
    if args.only in (None, "loop"):
        written.append(write_loop_vectors(args.out))
    for path in written:
        print(f"{path}\t{path.stat().st_size} bytes", file=sys.stdout)
    return 0
