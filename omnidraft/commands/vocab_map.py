"""`omnidraft vocab-map`: the direct-mapping size of a drafter/target tokenizer pair."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "print the drafter<->target direct-mapping (vocabulary intersection) size of a tokenizer pair"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--drafter",
        required=True,
        help="tokenizer.json, a model/export folder, or a converted "
        "vocabulary name (llama-spm, llama-bpe, qwen2, gpt-2, phi-3)",
    )
    p.add_argument("--target", required=True, help="same forms as --drafter")
    p.add_argument("--json", action="store_true")


def _resolve(spec: str) -> Path:
    from omnidraft.models import gguf_tokenizers

    p = Path(spec)
    if p.exists():
        return p
    if spec in gguf_tokenizers.VOCABS:
        return gguf_tokenizers.get_tokenizer_dir(spec)
    from omnidraft.errors import TokenizerError

    raise TokenizerError(f"{spec!r} is neither a path nor one of {', '.join(gguf_tokenizers.VOCABS)}")


def run(args: argparse.Namespace) -> int:
    from omnidraft.runtime.tokenizer import load_codec
    from omnidraft.runtime.vocab import build_vocab_map, string_intersection_size

    d, t = load_codec(_resolve(args.drafter)), load_codec(_resolve(args.target))
    vm = build_vocab_map(d, t)
    doc = {
        "drafter_vocab": d.vocab_size,
        "target_vocab": t.vocab_size,
        "direct_map": vm.size,
        "paper_string_convention": string_intersection_size(d, t),
    }
    if args.json:
        print(json.dumps(doc))
    else:
        print(
            f"drafter {d.vocab_size} tokens, target {t.vocab_size} tokens: direct map {vm.size} "
            f"(byte-exact; {100 * vm.size / d.vocab_size:.1f}% of the drafter), "
            f"{doc['paper_string_convention']} under the paper's string convention"
        )
    return 0
