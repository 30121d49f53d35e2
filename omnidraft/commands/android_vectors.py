"""`omnidraft android-vectors`: write the vectors the Android app's Java core replays in CI."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "write tokenizer and speculative-loop vectors for android_demo/specdecode-core (Java tests replay them)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from omnidraft.android.vectors import VECTOR_DIR

    p.add_argument("--out", type=Path, default=VECTOR_DIR, help=f"output folder (default: {VECTOR_DIR})")
    p.add_argument(
        "--only",
        choices=("tokenizers", "loop", "pair"),
        help="write just one kind: tokenizer vectors, scripted-pair loop vectors, or bundled-pair loop vectors",
    )
    p.add_argument(
        "--drafter", type=Path, help="drafter HF folder for the pair vectors (default: models/bundled/drafter)"
    )
    p.add_argument("--target", type=Path, help="target HF folder for the pair vectors (default: models/bundled/target)")
    p.add_argument("--top-n", type=int, help="logits kept per row in the pair vectors (default: 32)")


def run(args: argparse.Namespace) -> int:
    from omnidraft.android.vectors import (
        write_loop_vectors,
        write_pair_vectors,
        write_tokenizer_vectors,
    )
    from omnidraft.errors import InvalidArgument

    if args.top_n is not None and not 1 <= args.top_n <= 4096:
        raise InvalidArgument(f"--top-n must be between 1 and 4096 (got {args.top_n}); 32 keeps the files small")

    written = []
    if args.only in (None, "tokenizers"):
        written += write_tokenizer_vectors(args.out)
    if args.only in (None, "loop"):
        written.append(write_loop_vectors(args.out))
    if args.only in (None, "pair"):
        written.append(write_pair_vectors(args.out, args.drafter, args.target, args.top_n))
    for path in written:
        print(f"{path}\t{path.stat().st_size} bytes", file=sys.stdout)
    return 0
