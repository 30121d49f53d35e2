"""`omnidraft bench-export`: one table of size / load time / step latency per format x quant."""

from __future__ import annotations

import argparse

HELP = "export a model in every format x quant and measure size, load time and k-token step latency"


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model to export: HF folder, .gguf file or model name")
    parser.add_argument("--out", required=True, help="folder for the exports and bench_export.{json,md}")
    parser.add_argument("--formats", type=_csv, default=None, help="comma list (default: onnx,executorch)")
    parser.add_argument("--quants", type=_csv, default=None, help="comma list (default: every quant of each format)")
    parser.add_argument("--max-seq-len", type=int, default=256, help="exported cache size (default 256)")
    parser.add_argument("--context", type=int, default=64, help="tokens in the cache when timing (default 64)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=100,
        help="timed calls per figure; medians reported (sub-ms calls on a shared VM: 20 left medians 1.6x apart between runs)",
    )
    parser.add_argument("--et-path", default="auto", help="executorch lowering path: auto, llm or static")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads per engine (default 1: spinning pools cost more than they bring "
        "on a small shared CPU); 0 = each library's default",
    )
    parser.add_argument("--reuse", action="store_true", help="skip exports already present in --out")
    parser.add_argument(
        "--draft-vocab",
        type=int,
        metavar="N",
        help="a drafter: cut its output layer to its N most frequent tokens, as `omnidraft export --draft-vocab` does",
    )


def run(args: argparse.Namespace) -> int:
    from omnidraft.bench.export_timing import run_bench
    from omnidraft.models.sources import resolve

    result = run_bench(
        resolve(args.model),
        args.out,
        formats=args.formats,
        quants=args.quants,
        max_seq_len=args.max_seq_len,
        context=args.context,
        repeats=args.repeats,
        reuse=args.reuse,
        et_path=args.et_path,
        threads=args.threads or None,
        draft_vocab=args.draft_vocab,
    )
    from omnidraft.bench.export_timing import markdown

    print(markdown(result), end="")
    return 0
