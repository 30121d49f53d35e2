"""`omnidraft bench-adaptive`: fixed draft lengths K vs adaptive drafting, one table per stream."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omnidraft.commands import usable_cpus
from omnidraft.commands._decoding import add_draft_length

HELP = "fixed draft lengths vs adaptive drafting (acceptance head, joint/interleaved): tables, calibration plot"


def _csv(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pair", default="bundled", help="'bundled' or DRAFTER,TARGET (two Hugging Face model folders)")
    p.add_argument("--streams", default="code,math,text", help="comma-separated: code, math, text")
    p.add_argument("--backend", default="ort", help="ort (ONNX Runtime int8, head inside the graph) | torch (eager)")
    p.add_argument("--prompts", type=int, default=12, help="held-out test prompts per stream")
    p.add_argument("--train-prompts", type=int, default=48, help="train prompts of each head-training pass")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--draft-lens", default="1,2,3,4,5,6,7,8", help="fixed K rows")
    p.add_argument("--variants", default="joint,interleaved", help="head training variants: joint, interleaved")
    p.add_argument(
        "--loss",
        default="none",
        help="none (head only, drafter frozen: every row drafts with the same "
        "weights) | hybrid | dm (distil the drafter too; fixed-K rows then run on each variant's drafter)",
    )
    p.add_argument(
        "--fixed-gamma", action="store_true", help="keep gamma and K_max fixed instead of tuning them online"
    )
    p.add_argument(
        "--always-draft",
        action="store_true",
        help="keep K within [1, K_max]: never turn drafting off, even where the target alone is faster",
    )
    add_draft_length(p, draft_len=None)  # --gamma: where tuning starts
    p.add_argument("--head-steps", type=int, default=8, help="AdamW steps per head update")
    p.add_argument(
        "--head-lr",
        type=float,
        default=1e-3,
        help="AdamW learning rate of the head's MLP (its logit moves ~lr x hidden size per step)",
    )
    p.add_argument(
        "--head-bias-lr", type=float, default=0.1, help="AdamW learning rate of the per-drafted-token biases"
    )
    p.add_argument(
        "--head-replay",
        type=int,
        default=64,
        metavar="N",
        help="interleaved: FIFO replay buffer of the head, in prompts",
    )
    p.add_argument(
        "--every", type=int, default=8, metavar="I", help="prompts per update (joint head step / replay push)"
    )
    p.add_argument("--max-seq-len", type=int, default=512, help="KV-cache length of the ort exports")
    p.add_argument(
        "--threads",
        type=int,
        default=usable_cpus(),
        help="intra-op threads (default: every CPU this process may use; 0: each library's default)",
    )
    p.add_argument("--out", type=Path, default=Path("reports/adaptive"), help="report folder")


def run(args: argparse.Namespace) -> int:
    from omnidraft.bench.adaptive_drafting import AdaptiveBench, AdaptiveSettings
    from omnidraft.errors import InvalidArgument

    try:
        ks = tuple(int(k) for k in _csv(args.draft_lens))
    except ValueError:
        raise InvalidArgument(
            f"--draft-lens takes comma-separated integers such as 1,2,4 (got {args.draft_lens!r})"
        ) from None
    s = AdaptiveSettings(
        pair=args.pair,
        streams=_csv(args.streams),
        backend=args.backend,
        prompts=args.prompts,
        train_prompts=args.train_prompts,
        max_new_tokens=args.max_new_tokens,
        ks=ks,
        variants=_csv(args.variants),
        loss=args.loss,
        gamma=args.gamma,
        tune_gamma=not args.fixed_gamma,
        allow_off=not args.always_draft,
        max_draft_len=args.max_draft_len,
        every=args.every,
        head_steps=args.head_steps,
        head_lr=args.head_lr,
        head_bias_lr=args.head_bias_lr,
        head_replay=args.head_replay,
        max_seq_len=args.max_seq_len,
        threads=args.threads or None,
        out=args.out,
    )
    report = AdaptiveBench(s).run()
    print((s.out / "adaptive.md").read_text())
    print(f"report: {s.out / 'adaptive.json'}, plots: {', '.join(report['plots'])}", file=sys.stderr)
    return 130 if report["interrupted"] else 0
