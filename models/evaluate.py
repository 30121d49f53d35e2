"""Numbers for the model card: held-out perplexity per stream, drafter-target greedy agreement,
per-step eager latency, and greedy samples. Prints markdown tables and writes a JSON file.

    python -m omnidraft.models.evaluate [--drafter DIR] [--target DIR] [--n 100] [--json out.json]

Perplexities use each model's own tokenizer, so they are not comparable across the pair; bits per
UTF-8 byte of the reference are, and that is the column to compare drafter and target on.
Agreement: at every character position inside the reference where both tokenizations start a token,
do the drafter's and the target's greedy next tokens spell the same bytes? (the cross-vocabulary
"direct mapping" case of the paper, before any n-gram cache or adaptation).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from omnidraft.errors import ModelFolderError
from omnidraft.models.streams import STREAMS, load_stream

BUNDLED = Path(__file__).resolve().parent / "bundled"


def load_pair_member(folder: Path):
    from transformers import AutoModelForCausalLM

    from omnidraft.runtime.tokenizer import load_codec

    if not (folder / "model.safetensors").is_file() or not (folder / "config.json").is_file():
        raise ModelFolderError(
            f"{folder} has no config.json/model.safetensors; run "
            f"`python -m omnidraft.models.train --recipe {folder.name}`"
        )
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return model, load_codec(folder)


@torch.no_grad()
def score(model, codec, prompt: str, reference: str) -> dict:
    """Per-token NLL and greedy predictions over the reference, keyed by the char offset each predicted
    token starts at."""
    text = prompt + reference
    enc = codec.tokenizer.encode(text, add_special_tokens=True)
    ids = torch.tensor([enc.ids])
    logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    greedy = logits.argmax(-1).tolist()
    out = {"nll": 0.0, "tokens": 0, "bytes": 0, "pred": {}}
    for i in range(1, len(enc.ids)):
        start = enc.offsets[i][0]
        if enc.ids[i] in codec.special or start < len(prompt):
            continue
        out["nll"] -= logp[i - 1, enc.ids[i]].item()
        out["tokens"] += 1
        out["bytes"] += len(codec.token_bytes[enc.ids[i]])
        out["pred"][start] = codec.token_bytes[greedy[i - 1]]
    return out


def evaluate_stream(pair: dict, stream: str, n: int) -> dict:
    agg = {k: {"nll": 0.0, "tokens": 0, "bytes": 0} for k in pair}
    agree = compared = 0
    for p in tqdm(load_stream(stream, "test")[:n], desc=f"eval {stream}", file=sys.stderr):
        res = {k: score(m, c, p.prompt, p.reference) for k, (m, c) in pair.items()}
        for k, r in res.items():
            for f in ("nll", "tokens", "bytes"):
                agg[k][f] += r[f]
        if "drafter" in res and "target" in res:
            common = res["drafter"]["pred"].keys() & res["target"]["pred"].keys()
            compared += len(common)
            agree += sum(res["drafter"]["pred"][c] == res["target"]["pred"][c] for c in common)
    row = {}
    for k, a in agg.items():
        row[k] = {
            "ppl": math.exp(a["nll"] / max(1, a["tokens"])),
            "bits_per_byte": a["nll"] / max(1, a["bytes"]) / math.log(2),
            "tokens": a["tokens"],
            "bytes": a["bytes"],
        }
    row["agreement"] = agree / compared if compared else None
    row["agreement_positions"] = compared
    return row


@torch.no_grad()
def decode_latency_ms(model, context: int = 128, steps: int = 50) -> float:
    """Median wall time of one 1-token decode step with a KV cache of `context` tokens (torch eager)."""
    ids = torch.randint(0, 1000, (1, context))
    out = model(input_ids=ids, use_cache=True)
    pkv, tok, times = out.past_key_values, ids[:, -1:], []
    for _ in range(steps):
        t = time.perf_counter()
        out = model(input_ids=tok, past_key_values=pkv, use_cache=True)
        times.append(time.perf_counter() - t)
        pkv = out.past_key_values
    return 1000 * statistics.median(times)


@torch.no_grad()
def greedy_sample(model, codec, prompt: str, new_tokens: int) -> str:
    ids = codec.tokenizer.encode(prompt, add_special_tokens=True).ids
    x = torch.tensor([ids])
    out = model.generate(x, max_new_tokens=new_tokens, do_sample=False, pad_token_id=model.config.eos_token_id)
    return codec.decode(out[0, len(ids) :].tolist())


def print_samples(samples: dict) -> None:
    """Samples as JSON string literals: under-trained models emit runs of spaces and newlines, which
    a markdown code block would hide."""
    for s, items in samples.items():
        for it in items:
            print(f"\n**{s}**, prompt ending `{json.dumps(it['prompt'][-80:])}`\n")
            for k in ("drafter", "target"):
                print(f"- {k}: `{json.dumps(it[k])}`")


def main(argv: list[str] | None = None) -> int:
    from omnidraft.cli import quiet_third_party_logs

    quiet_third_party_logs()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", type=Path, default=BUNDLED / "drafter")
    ap.add_argument("--target", type=Path, default=BUNDLED / "target")
    ap.add_argument("--n", type=int, default=100, help="test prompts per stream")
    ap.add_argument("--samples", type=int, default=1, help="greedy samples per stream and model")
    ap.add_argument("--sample-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write all numbers here")
    ap.add_argument(
        "--latency-only",
        action="store_true",
        help="only time decode steps: --rounds alternating rounds of 100 steps, median reported",
    )
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from omnidraft.errors import OmnidraftError

    try:
        pair = {"drafter": load_pair_member(args.drafter), "target": load_pair_member(args.target)}
    except OmnidraftError as exc:
        print(f"evaluate: error: {exc}", file=sys.stderr)
        return 1
    if args.latency_only:
        times = {k: [] for k in pair}
        for _ in range(args.rounds):  # alternate so both see the same background load
            for k, (m, _c) in pair.items():
                times[k].append(decode_latency_ms(m, steps=100))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"decode step, torch eager fp32, {args.threads} thread(s), context 128, median of {args.rounds} rounds x 100 steps: "
            f"drafter {med['drafter']:.2f} ms, target {med['target']:.2f} ms, ratio {med['target'] / med['drafter']:.1f}x"
        )
        return 0
    results = {"streams": {s: evaluate_stream(pair, s, args.n) for s in STREAMS}}
    results["latency_ms"] = {k: decode_latency_ms(m) for k, (m, _) in pair.items()}
    results["params"] = {k: sum(p.numel() for p in m.parameters()) for k, (m, _) in pair.items()}
    results["samples"] = {
        s: [
            {"prompt": p.prompt, **{k: greedy_sample(m, c, p.prompt, args.sample_tokens) for k, (m, c) in pair.items()}}
            for p in load_stream(s, "test")[: args.samples]
        ]
        for s in STREAMS
    }
    print(f"Held-out test splits, first {args.n} prompts per stream; teacher-forced on the reference.\n")
    print(
        "| stream | drafter ppl (Llama-2 tokens) | target ppl (GPT-2 tokens) | drafter bits/byte | target bits/byte | greedy agreement | positions |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s, r in results["streams"].items():
        d, t = r["drafter"], r["target"]
        print(
            f"| {s} | {d['ppl']:.2f} | {t['ppl']:.2f} | {d['bits_per_byte']:.3f} | {t['bits_per_byte']:.3f} | "
            f"{r['agreement']:.3f} | {r['agreement_positions']} |"
        )
    lat = results["latency_ms"]
    print(
        f"\n| model | parameters | decode step, torch eager fp32, {args.threads} thread(s), context 128 (median ms) |"
    )
    print("|---|---:|---:|")
    for k in ("drafter", "target"):
        print(f"| {k} | {results['params'][k] / 1e6:.2f} M | {lat[k]:.2f} |")
    print(f"| ratio target/drafter | | {lat['target'] / lat['drafter']:.1f}x |")
    print_samples(results["samples"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=lambda b: b.decode("utf-8", "replace")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
