"""`omnidraft import-gguf`: convert a llama.cpp GGUF file into a Hugging Face model folder."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "convert a GGUF model file (any architecture transformers' GGUF loader reads) into a model folder"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, help="the .gguf file")
    p.add_argument("--out", type=Path, required=True, help="model folder to write (replaced only once complete)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from omnidraft.errors import InvalidArgument
    from omnidraft.models.gguf_import import import_gguf

    if args.out.resolve() == args.file.resolve().parent or args.out.is_file():
        raise InvalidArgument(f"--out {args.out} must be a new or model folder, not the GGUF's own folder or a file")
    print(import_gguf(args.file, args.out, progress=not args.no_progress))
    return 0
