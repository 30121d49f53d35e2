"""`omnidraft adapt`: online distillation of the drafter on a task stream (paper Algorithm 2)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omnidraft.commands._decoding import add_draft_length, add_no_splits

HELP = "adapt the drafter online to a target on a prompt stream (hybrid distillation, LoRA or full FT)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", required=True, help="drafter Hugging Face folder (the base weights) or .gguf file")
    p.add_argument(
        "--target",
        required=True,
        help="target: HF folder, export folder, .gguf file or a name from `omnidraft models list`",
    )
    p.add_argument("--stream", required=True, help='code | math | text, or a JSONL file of {"prompt": ...} lines')
    p.add_argument("--out", type=Path, required=True, help="folder for report.json, report.md, acceptance.png")
    p.add_argument(
        "--state", type=Path, help="per-target state (adapter, merged drafter, n-gram cache); default OUT/state"
    )
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--full-ft", action="store_true", help="fine-tune all drafter weights (eager) instead of LoRA")
    p.add_argument(
        "--loss",
        default="hybrid",
        help="hybrid (KL on DM tokens, see --divergence, + 0.2 NLL on n-grams) | dm | "
        "hybrid-dynamic (the NLL of each n-gram weighted by the target's p of it instead of 0.2) | none (drafter frozen; with --train-head, the acceptance head only)",
    )
    p.add_argument("--every", type=int, default=8, metavar="I", help="prompts per drafter update (= batch size)")
    p.add_argument("--steps-per-update", type=int, default=1)
    p.add_argument("--lr", type=float, help="AdamW learning rate (default 1e-4 LoRA, 2e-5 full FT)")
    p.add_argument(
        "--distill-temperature",
        type=float,
        default=1.0,
        help="temperature of the target distribution in the KL (1 = the model's own)",
    )
    p.add_argument(
        "--divergence",
        default="reverse",
        help="KL on direct-map tokens: reverse (the paper's, drafter to target) | "
        "forward (target to drafter: covers what the target finds likely)",
    )
    add_no_splits(p)
    p.add_argument("--engine", default="executorch", help="LoRA gradients from executorch (training runtime) | eager")
    p.add_argument("--seq-len", type=int, default=256, help="drafter tokens per training row (program shape)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    add_draft_length(p)
    p.add_argument(
        "--train-head",
        action="store_true",
        help="train the acceptance head online (saved beside the merged drafter as head.json/head.safetensors)",
    )
    p.add_argument(
        "--head-variant",
        default="joint",
        help="joint (a head step with each drafter update) | "
        "interleaved (head steps between updates from a FIFO replay buffer)",
    )
    p.add_argument(
        "--tune-gamma",
        action="store_true",
        help="auto: tune gamma and K_max online (each prompt replayed at shorter drafts, measured costs)",
    )
    p.add_argument(
        "--head-lr",
        type=float,
        default=1e-3,
        help="AdamW learning rate of the head's MLP (its logit moves ~lr x hidden size per step)",
    )
    p.add_argument(
        "--head-bias-lr", type=float, default=0.1, help="AdamW learning rate of the per-drafted-token biases"
    )
    p.add_argument("--head-reject-weight", type=float, default=1.0, help="BCE weight of rejected tokens (SpecDec++: 6)")
    p.add_argument(
        "--head-steps",
        type=int,
        default=8,
        help="AdamW steps per head update (joint: per drafter update; interleaved: per prompt between them)",
    )
    p.add_argument(
        "--head-replay", type=int, default=64, metavar="N", help="interleaved: FIFO replay buffer, in prompts"
    )
    p.add_argument("--head-batch", type=int, default=8, metavar="B", help="interleaved: prompts per replayed batch")
    p.add_argument("--train-limit", type=int, help="use only the first N prompts of the train stream")
    p.add_argument("--eval-split", default="test", help="held-out split for before/after acceptance ('none' to skip)")
    p.add_argument("--eval-limit", type=int, help="use only the first N held-out prompts")
    p.add_argument(
        "--eval-draft-lens",
        default="",
        metavar="K,...",
        help="also report held-out acceptance before/after at each of these fixed K (e.g. 1,2,3,4)",
    )
    p.add_argument("--guard-window", type=int, default=8, help="recent prompts re-decoded by the drift guard")
    p.add_argument("--guard-margin", type=float, default=0.02, help="largest acceptance drop a delta may cause")
    p.add_argument("--publish-every", type=int, default=8, help="updates between guarded publishes")
    p.add_argument(
        "--export", default="", help="comma list of formats (onnx,executorch) to re-lower the merged drafter"
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


def run(args: argparse.Namespace) -> int:
    from omnidraft.errors import InvalidArgument

    if args.threads < 1:
        raise InvalidArgument(f"--threads must be >= 1 (got {args.threads})")
    import torch

    torch.set_num_threads(args.threads)
    from omnidraft.adapt.config import (
        AdaptConfig,
        Distillation,
        HeadTraining,
        PublishPolicy,
        StreamDecoding,
        UpdateSchedule,
    )
    from omnidraft.adapt.run import adapt_stream
    from omnidraft.runtime.draft_length.policy import parse_draft_len

    formats = tuple(f for f in args.export.split(",") if f)
    bad = [f for f in formats if f not in ("onnx", "executorch")]
    if bad:
        raise InvalidArgument(f"unknown --export format(s) {', '.join(bad)}; use onnx and/or executorch")
    cfg = AdaptConfig(
        schedule=UpdateSchedule(
            mode="full" if args.full_ft else "lora",
            rank=args.lora_rank,
            every=args.every,
            steps_per_update=args.steps_per_update,
            lr=args.lr,
            engine=args.engine,
            seq_len=args.seq_len,
            seed=args.seed,
        ),
        distill=Distillation(
            loss=args.loss,
            temperature=args.distill_temperature,
            divergence=args.divergence,
            splits=not args.no_splits,
        ),
        decoding=StreamDecoding(
            max_new_tokens=args.max_new_tokens,
            draft_len=parse_draft_len(args.draft_len),
            gamma=args.gamma,
            max_draft_len=args.max_draft_len,
            tune_gamma=args.tune_gamma,
        ),
        head=HeadTraining(
            train=args.train_head,
            variant=args.head_variant,
            lr=args.head_lr,
            bias_lr=args.head_bias_lr,
            reject_weight=args.head_reject_weight,
            steps=args.head_steps,
            replay=args.head_replay,
            batch=args.head_batch,
        ),
        publish=PublishPolicy(
            every=args.publish_every,
            guard_window=args.guard_window,
            guard_margin=args.guard_margin,
            export_formats=formats,
        ),
    )
    split = None if args.eval_split in ("none", "") else args.eval_split
    try:
        eval_ks = tuple(int(k) for k in args.eval_draft_lens.split(",") if k.strip())
    except ValueError:
        raise InvalidArgument(
            f"--eval-draft-lens takes comma-separated integers like 1,2,3,4 (got {args.eval_draft_lens!r})"
        ) from None
    from omnidraft.models.sources import resolve

    result = adapt_stream(
        resolve(args.drafter),
        resolve(args.target),
        args.stream,
        args.out,
        cfg,
        args.state,
        args.train_limit,
        split,
        args.eval_limit,
        eval_draft_lens=eval_ks,
    )
    if args.json:
        print(json.dumps(result))
    else:
        from omnidraft.adapt.report import markdown

        print(markdown(result), end="")
        print(
            f"report: {result['files']['json']}  plot: {result['files']['png']}  state: {result['state']}",
            file=sys.stderr,
        )
        if "head" in result:
            h = result["head"]
            print(
                f"acceptance head ({h['variant']}, {h['updates']} head steps, {h['observed_target_tokens']} observed "
                f"target tokens): {h['file']}  calibration: {h.get('plot', '-')}",
                file=sys.stderr,
            )
    return 0
