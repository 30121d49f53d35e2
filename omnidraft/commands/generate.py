"""`omnidraft generate`: cross-vocabulary speculative decoding of one prompt."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omnidraft.commands._decoding import add_draft_length, add_lookup, add_no_splits, check_draft_length, lookup_config

HELP = "generate text with a drafter speeding up a target (any mix of HF and export folders)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--drafter", help="drafter: HF folder, export folder, .gguf file or model name (not for --mode target-only)"
    )
    p.add_argument(
        "--target",
        required=True,
        help="target: HF folder, export folder, .gguf file or a name from `omnidraft models list`",
    )
    p.add_argument("--prompt", required=True)
    p.add_argument(
        "--chat",
        default="auto",
        help="auto (default): wrap the prompt in the target's chat template where it has one (instruct models) | "
        "on: require one | off: send the prompt as raw text",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (lossless, token-exact)")
    add_draft_length(p)
    p.add_argument(
        "--accept-head",
        type=Path,
        help="acceptance-head folder to attach to a Hugging Face drafter "
        "(one saved in the drafter folder is attached anyway; export folders carry theirs in the graph)",
    )
    p.add_argument("--mode", default="ngram", help="ngram (full method) | dm (direct mapping only) | target-only")
    add_no_splits(p)
    add_lookup(p)
    p.add_argument(
        "--lookup-memory",
        type=Path,
        metavar="FILE",
        help="answer memory of this target: rounds with no context match copy what the target wrote after "
        "the same tokens in earlier runs; loaded if present, this run's answer added and saved after it "
        "(with --lookup 0 it only records)",
    )
    p.add_argument(
        "--ngram-sampling",
        default="exact",
        help="temperature > 0 with merged n-grams: exact (default; proposes only what it can score, so "
        "the output follows the target's own distribution) | paper (Eq. 1-2, merges every cached n-gram, "
        "approximately: measured total variation 0.09 from the target on an adversarial n-gram)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", type=Path, help="n-gram cache file of this pair: loaded if present, saved after the run")
    p.add_argument("--cache-capacity", type=int, help="bound the n-gram cache (LFU eviction)")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress and logs go to stderr)")


def run(args: argparse.Namespace) -> int:
    from omnidraft.models.sources import resolve
    from omnidraft.runtime.chat import wrap
    from omnidraft.runtime.decode_config import DecodeConfig
    from omnidraft.runtime.draft_length.policy import parse_draft_len
    from omnidraft.runtime.session import open_pair, save_cache

    check_draft_length(args)
    cfg = DecodeConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        draft_len=parse_draft_len(args.draft_len),
        mode=args.mode,
        seed=args.seed,
        gamma=args.gamma,
        max_draft_len=args.max_draft_len,
        splits=not args.no_splits,
        ngram_sampling=args.ngram_sampling,
        lookup=lookup_config(args),
    )
    cfg.validate()
    target = resolve(args.target)
    prompt = wrap(target, args.prompt, args.chat)
    decoder = open_pair(
        target,
        None if args.mode == "target-only" or args.drafter is None else resolve(args.drafter),
        cache_path=args.cache,
        cache_capacity=args.cache_capacity,
        accept_head=args.accept_head,
        memory_path=args.lookup_memory,
    )
    stream = None if args.json else (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    result = decoder.generate(prompt, cfg, on_text=stream)
    st = result.stats
    summary = {
        "text": result.text,
        "token_ids": result.token_ids,
        "steps": st.steps,
        "proposed": st.proposed,
        "accepted": st.accepted,
        "acceptance_rate": round(st.acceptance_rate, 4),
        "tokens_per_step": round(st.tokens_per_step, 4),
        "ngram_hits": st.ngram_hits,
        "split_proposed": st.split_proposed,
        "split_accepted": st.split_accepted,
        "lookup_rounds": st.lookup_rounds,
        "lookup_proposed": st.lookup_proposed,
        "lookup_accepted": st.lookup_accepted,
        "memory_rounds": st.memory_rounds,
        "memory_accepted": st.memory_accepted,
        "memory_generations": len(decoder.memory) if decoder.memory is not None else 0,
        "ngram_cache_size": len(decoder.cache) if decoder.cache is not None else 0,
        "new_tokens": st.new_tokens,
        "seconds": round(st.seconds, 4),
        "overhead_fraction": round(st.overhead_fraction, 4),
        "mode": cfg.mode,
        "draft_len": cfg.draft_len,
        "drafter_calls_per_step": round(st.drafter_calls / st.steps, 4) if st.steps else 0.0,
    }
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        print()
        print(
            f"[{cfg.mode}] {st.new_tokens} tokens in {st.seconds:.2f}s ({st.new_tokens / max(st.seconds, 1e-9):.1f} tok/s), "
            f"{st.steps} target calls, acceptance {st.acceptance_rate:.2f}, {st.tokens_per_step:.2f} tokens/call, "
            f"n-gram hits {st.ngram_hits}, {st.lookup_rounds} rounds copied ({st.memory_rounds} from the answer memory), outside-model time {100 * st.overhead_fraction:.0f}%",
            file=sys.stderr,
        )
    if args.cache is not None and decoder.cache is not None:
        save_cache(decoder.cache, args.cache)  # after the result: a cache that cannot be saved costs no output
    if args.lookup_memory is not None:
        decoder.memory.save(args.lookup_memory)
    return 0
