"""The decoding arguments every command that decodes shares, declared once."""

from __future__ import annotations

import argparse


def add_draft_length(
    p: argparse.ArgumentParser,
    *,
    draft_len: str | None = "4",
    max_draft_len: bool = True,
    gamma_help: str = "auto: stopping threshold in (0, 1) (paper: 0.3 text, 0.7 code/math; default 0.5)",
    auto: bool = True,
) -> None:
    """``--draft-len`` (omitted where ``draft_len`` is None), ``--gamma`` and ``--max-draft-len`` (where
    ``max_draft_len``). ``auto`` False: a command that decodes at a fixed K only: ``--draft-len`` is an
    integer and neither of the others is declared."""
    if draft_len is not None:
        p.add_argument(
            "--draft-len",
            default=draft_len,
            type=str if auto else int,
            metavar="K",
            help=f"drafter tokens per round, or 'auto': the drafter's acceptance head stops drafting once "
            f"P(a rejection) > --gamma (default {draft_len})"
            if auto
            else f"drafter tokens per round (default {draft_len})",
        )
    if not auto:
        return
    p.add_argument("--gamma", type=float, default=0.5, help=gamma_help)
    if max_draft_len:
        p.add_argument(
            "--max-draft-len", type=int, default=16, metavar="K_MAX", help="auto: longest draft (default 16)"
        )


def add_no_splits(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-splits",
        action="store_true",
        help="translate as the paper does (direct map + n-grams): never propose an unmapped drafter token as "
        "the several target tokens that spell it (greedy only; adapt: no split labels in the NLL term)",
    )


def check_draft_length(args: argparse.Namespace) -> None:
    """What a user may ask for: K_max 0 (drafting off) is the online controller's alone."""
    from omnidraft.runtime.draft_length.policy import parse_draft_len, validate_adaptive

    validate_adaptive(parse_draft_len(args.draft_len), args.gamma, args.max_draft_len)


def add_lookup(p: argparse.ArgumentParser, *, default: int = 6, note: str = "") -> None:
    """``--lookup`` and ``--lookup-ngram``: drafts copied from the context where it repeats; ``note`` says
    where the command applies them."""
    p.add_argument(
        "--lookup",
        type=int,
        default=default,
        metavar="N",
        help="copy up to N tokens from the context where its last tokens occurred before, instead of "
        f"drafting that round (greedy output is unchanged; 0 turns it off; default {default}){note}",
    )
    p.add_argument(
        "--lookup-ngram",
        default="2-4",
        metavar="MIN-MAX",
        help="context lookup: the suffix lengths that may match, longest first (default 2-4)",
    )


def lookup_config(args: argparse.Namespace):
    """The LookupConfig ``--lookup`` and ``--lookup-ngram`` ask for, or None (off)."""
    from omnidraft.errors import InvalidArgument
    from omnidraft.runtime.context_lookup import LookupConfig, parse_ngram_range

    if args.lookup < 0:
        raise InvalidArgument(f"--lookup must be >= 0 (got {args.lookup}); 0 turns the context lookup off")
    if args.lookup == 0:
        return None
    cfg = LookupConfig(args.lookup, *parse_ngram_range(args.lookup_ngram))
    cfg.validate()
    return cfg
