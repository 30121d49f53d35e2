"""`omnidraft demo`: one command, no network, the bundled drafter against real targets end to end."""

from __future__ import annotations

import argparse
from pathlib import Path

from omnidraft.commands._decoding import add_draft_length, add_lookup, lookup_config

HELP = (
    "run the bundled drafter against the real targets (Qwen2.5-Coder-0.5B-Instruct on code and math, Gemma 3 270M "
    "on text): export, speculative decoding vs target-only, an online adaptation pass, report"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a smoke run (fewer prompts and tokens, about a minute)")
    p.add_argument(
        "--pair",
        default="real",
        help="real (default: the installed real targets, see `omnidraft models list`) | tiny (the bundled 29 M "
        "target, offline smoke runs) | DRAFTER,TARGET (folders, .gguf files or model names)",
    )
    p.add_argument(
        "--streams", default="code,math,text", help="comma-separated: code, math, text (each pair runs those it covers)"
    )
    p.add_argument(
        "--backend",
        default="ort",
        help="ort (ONNX Runtime int8) | executorch (8da4w .pte) | torch (eager) | qnn-htp (drafter as QNN context "
        "binaries on the HTP, the simulator on x86: not device timings; target on ort; needs the npu extra)",
    )
    p.add_argument("--prompts", type=int, help="held-out prompts per stream")
    p.add_argument("--max-new-tokens", type=int)
    add_draft_length(
        p,
        draft_len="2",
        max_draft_len=False,
        gamma_help="auto: initial stopping threshold in (0, 1), tuned during adaptation",
    )
    p.add_argument(
        "--adapt-prompts",
        type=int,
        metavar="N",
        help="train prompts of the online adaptation pass per stream (default 24; 0 skips it; --quick: 0)",
    )
    p.add_argument(
        "--adapt-streams",
        help="streams that get an adaptation pass: comma list, all, or none "
        "(default: code, or the first of --streams when code is not among them)",
    )
    p.add_argument(
        "--adapt-engine",
        default="executorch",
        help="LoRA gradients from the ExecuTorch training program (as on device) | eager",
    )
    add_lookup(p, note="; omnidraft's rows decode with it")
    p.add_argument("--out", type=Path, default=Path("reports/demo"), help="report folder (JSON + PNG)")


def run(args: argparse.Namespace) -> int:
    from omnidraft.bench.demo import DemoSettings, main_print, run_demo
    from omnidraft.errors import InvalidArgument
    from omnidraft.runtime.draft_length.policy import parse_draft_len, validate_adaptive

    draft_len = parse_draft_len(args.draft_len)
    validate_adaptive(draft_len, args.gamma, 16)

    streams = tuple(s.strip() for s in args.streams.split(",") if s.strip())
    s = (DemoSettings.quick if args.quick else DemoSettings)(
        pair=args.pair, streams=streams, backend=args.backend, draft_len=draft_len, out=args.out
    )
    s.gamma = args.gamma
    s.lookup = lookup_config(args)
    if args.prompts is not None:
        if args.prompts < 1:
            raise InvalidArgument("--prompts must be >= 1")
        s.prompts = args.prompts
    if args.max_new_tokens is not None:
        s.max_new_tokens = args.max_new_tokens
    if args.adapt_prompts is not None:
        s.adapt_prompts = args.adapt_prompts
    elif draft_len == "auto" and args.quick:
        s.adapt_prompts = 8  # auto needs a trained head: a short pass even in a smoke run
    names = (args.adapt_streams or ("code" if "code" in s.streams else ",".join(s.streams[:1]))).strip()
    s.adapt_streams = (
        s.streams
        if names == "all"
        else ()
        if names == "none"
        else tuple(n.strip() for n in names.split(",") if n.strip())
    )
    if args.adapt_engine not in ("executorch", "eager"):
        raise InvalidArgument(f"unknown --adapt-engine {args.adapt_engine!r}; choose executorch or eager")
    s.adapt_engine = args.adapt_engine
    report = run_demo(s)
    main_print(report, s.out)
    return 0
