"""`omnidraft bench`: the paper's tables in miniature and a head-to-head with HF assisted generation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omnidraft.commands import usable_cpus
from omnidraft.commands._decoding import add_draft_length, add_lookup, add_no_splits, lookup_config

HELP = "benchmark methods, peers (HF assisted generation, prompt lookup) and the n-gram cache; JSON + tables + plots"


def _csv(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _ks(text: str) -> tuple[int, ...]:
    from omnidraft.errors import InvalidArgument

    try:
        return tuple(int(t) for t in _csv(text))
    except ValueError:
        raise InvalidArgument(f"--draft-lens takes comma-separated integers such as 2,3,4,6 (got {text!r})") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pair", default="bundled", help="'bundled' or DRAFTER,TARGET (two Hugging Face model folders)")
    p.add_argument("--streams", default="code,math,text", help="comma-separated: code, math, text")
    p.add_argument(
        "--backend",
        default="ort",
        help="ort (ONNX Runtime int8) | executorch (8da4w .pte) | torch (eager) | qnn-htp (drafter as QNN context binaries on the HTP, the simulator on x86: not device timings; target on ort; needs the npu extra)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2 prompts per stream, 24 tokens, peers hf + --backend, "
        "no adaptation or eviction runs (under 3 minutes once exports are cached)",
    )
    p.add_argument("--prompts", type=int, help="held-out test prompts per stream")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--draft-lens", help="fixed draft lengths K to sweep (default 1,2,3,4,6)")
    p.add_argument("--train-prompts", type=int, help="train prompts that pre-collect the cache of spd-dm+ngram_pp")
    p.add_argument("--adapt-prompts", type=int, help="train prompts of the adaptation pass (adapted rows)")
    p.add_argument(
        "--adapt-lr",
        type=float,
        help="learning rate of every adaptation pass (default: 1e-3, or 1e-4 for a drafter "
        "already trained against the real targets, such as models/bundled/drafter-teachers)",
    )
    p.add_argument(
        "--adapted",
        help="adapted rows to run, comma-separated from l-dm, hybrid, hybrid+lora, "
        "hybrid+adaptive, or 'none' (default: all four; a full pass on math costs ~30 min a row, "
        "hybrid+lora ~100 min)",
    )
    p.add_argument(
        "--tune-prompts",
        type=int,
        help="train prompts the hybrid+adaptive row's controller is tuned on "
        "before its timed run (default 16; 0 starts it untuned)",
    )
    p.add_argument(
        "--peers",
        help="comma-separated from hf, torch, ort, executorch, llama.cpp (the target's GGUF through "
        "llama-cpp-python, extra `peers`), ort-genai (onnxruntime-genai's generator on the ort target "
        "export), or 'none'",
    )
    p.add_argument("--no-eviction", action="store_true", help="skip the LFU/LRU capped-cache runs")
    p.add_argument(
        "--target-quant",
        help="quant of the main backend's target export (ort: fp32, int8, int4; executorch: fp32, 8da4w, 8da8w); "
        "default: the backend's own (ort int8, executorch 8da4w)",
    )
    p.add_argument(
        "--verify-repeats",
        type=int,
        help="target calls per k of the verify cost curve, k = 1..16 (default 20; 0 skips it)",
    )
    add_no_splits(p)
    add_lookup(p, note="; the METHOD+lookup rows decode with it, the paper's rows without")
    p.add_argument(
        "--draft-vocab",
        type=int,
        help="drafter exports keep their N most frequent tokens where the drafter "
        "folder has token_counts.json (default 4096; 0 keeps every token)",
    )
    p.add_argument("--max-seq-len", type=int, default=512, help="KV-cache length of the ort/executorch exports")
    p.add_argument(
        "--threads",
        type=int,
        default=usable_cpus(),
        help="intra-op threads of torch / ONNX Runtime / ExecuTorch (default: every CPU this process may "
        "use, as on a device; on a CPU shared with other jobs use 1; 0 keeps each library's default; "
        "ONNX Runtime drafters always run on one thread)",
    )
    add_draft_length(
        p,
        draft_len=None,
        max_draft_len=False,
        gamma_help="hybrid+adaptive row: initial stopping threshold of adaptive drafting (--draft-len auto), "
        "tuned online from tokens/s",
    )
    p.add_argument("--out", type=Path, default=Path("reports/bench"), help="report folder (bench.json, bench.md, PNGs)")


def run(args: argparse.Namespace) -> int:
    import signal

    from omnidraft.bench.method_table import run_bench
    from omnidraft.bench.settings import BenchSettings

    # A shell starts background jobs with SIGINT ignored, and Python keeps that; a long bench started
    # with `... &` must still stop on `kill -INT` and write the rows it finished.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    common = dict(
        pair=args.pair,
        streams=_csv(args.streams),
        out=args.out,
        max_seq_len=args.max_seq_len,
        threads=args.threads or None,
    )
    s = (
        BenchSettings.quick_settings(args.backend, **common)
        if args.quick
        else BenchSettings(backend=args.backend, **common)
    )
    s.gamma = args.gamma
    for name in (
        "prompts",
        "max_new_tokens",
        "train_prompts",
        "adapt_prompts",
        "tune_prompts",
        "adapt_lr",
        "verify_repeats",
        "target_quant",
    ):
        if getattr(args, name) is not None:
            setattr(s, name, getattr(args, name))
    if args.draft_lens is not None:
        s.sweep_ks = _ks(args.draft_lens)
    if args.peers is not None:
        s.peers = () if args.peers.strip() == "none" else _csv(args.peers)
    if args.adapted is not None:
        s.adapted = () if args.adapted.strip() == "none" else _csv(args.adapted)
    if args.no_eviction:
        s.eviction = False
    s.splits = not args.no_splits
    s.lookup = lookup_config(args)
    if args.draft_vocab is not None:
        s.draft_vocab = args.draft_vocab or None
    report = run_bench(s)
    out = s.out
    print((out / "bench.md").read_text())
    if report["interrupted"]:
        print(f"omnidraft bench: interrupted; rows finished so far are in {out / 'bench.json'}", file=sys.stderr)
        return 130
    print(f"report: {out / 'bench.json'}, {out / 'bench.md'}, plots: {', '.join(report['plots'])}", file=sys.stderr)
    return 0
