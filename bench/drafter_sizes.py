"""How large a drafter can be: the deployed step cost of drafter shapes, before training any of them.

Each shape (hidden size x layers, the drafter recipe's vocabulary and proportions otherwise) is built
with random weights, exported as it ships (ONNX, the recipe's quant, head cut to the bundled drafter's
most frequent tokens) and timed by ``bench-export``'s one-token step (median of ``repeats`` calls, one
thread, context 64). Weights do not change the step cost, so the curve says which shapes fit a budget
(a share of the target's step) before any CPU hour goes into training one.

    python -m omnidraft.bench.drafter_sizes --hidden 128,256,384,512,768 --layers 2,4 \\
        --budget-ms 0.84 --out reports/drafter-sizes
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

from omnidraft.atomic import check_writable, write_text
from omnidraft.bench.plots import plot_drafter_sizes
from omnidraft.errors import InvalidArgument, OmnidraftError

HEAD_DIM = 64  # the bundled drafter's 128 / 4 = 32 is kept for hidden 128; wider shapes use 64


def shape_recipe(base: dict, hidden: int, layers: int) -> dict:
    """The drafter recipe with another width and depth: MLP 3x hidden, as the bundled drafter."""
    if hidden % 32 or hidden < 64:
        raise InvalidArgument(f"--hidden {hidden}: use multiples of 32 from 64 up")
    if layers < 1:
        raise InvalidArgument(f"--layers {layers}: a drafter needs at least one layer")
    r = copy.deepcopy(base)
    heads = 4 if hidden <= 128 else hidden // HEAD_DIM
    r["model"].update(
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
    )
    return r


def parameters(recipe: dict) -> int:
    m = recipe["model"]
    h, layers, v = m["hidden_size"], m["num_hidden_layers"], m["vocab_size"]
    per_layer = 4 * h * h + 3 * h * m["intermediate_size"] + 2 * h
    return v * h + layers * per_layer + h + (0 if m.get("tie_word_embeddings") else v * h)


def measure(*, hiddens: list[int], layers: list[int], draft_vocab: int, quant: str, repeats: int) -> list[dict]:
    from tqdm import tqdm

    from omnidraft.bench.export_timing import run_bench
    from omnidraft.export.recipes import COUNTS_FILE
    from omnidraft.models.train import BUNDLED_DIR, build_model, export_hf, load_recipe, load_tokenizer

    base = load_recipe("drafter")
    _, tok_path = load_tokenizer(base["tokenizer"])
    counts = BUNDLED_DIR / "drafter" / COUNTS_FILE  # the deployed head keeps the bundled drafter's top tokens
    shapes = [(h, n) for h in hiddens for n in layers]
    rows = []
    with tempfile.TemporaryDirectory(prefix="drafter-sizes-") as tmp:
        for h, n in tqdm(shapes, desc="drafter shapes", file=sys.stderr, dynamic_ncols=True):
            recipe = shape_recipe(base, h, n)
            folder = Path(tmp) / f"h{h}-l{n}"
            export_hf(build_model(recipe), recipe, tok_path, folder)
            shutil.copy(counts, folder / COUNTS_FILE)
            res = run_bench(
                folder,
                Path(tmp) / f"bench-h{h}-l{n}",
                formats=["onnx"],
                quants=[quant],
                repeats=repeats,
                draft_vocab=draft_vocab,
                threads=1,
            )
            r = res["rows"][0]
            rows.append(
                {
                    "hidden": h,
                    "layers": n,
                    "heads": recipe["model"]["num_attention_heads"],
                    "parameters": parameters(recipe),
                    "size_mib": round(r["size_mib"], 2),
                    "step_ms": round(r["step_ms"], 4),
                    "step_ms_min": round(r["verify_ms_min"]["1"], 4),
                    "verify_4_ms": round(r["verify_ms"]["4"], 4),
                }
            )
    return rows


def markdown(result: dict) -> str:
    budget = result.get("budget_ms")
    lines = [
        f"Drafter shapes, ONNX {result['quant']}, head cut to {result['draft_vocab']} tokens, one thread, "
        f"median of {result['repeats']} one-token calls at context 64"
        + (f"; budget {budget} ms per step" if budget else "")
        + ".",
        "",
        "| hidden | layers | heads | parameters | graph MiB | step ms (min) | 4-token call ms |"
        + (" within budget |" if budget else ""),
        "|---|---|---|---:|---:|---:|---:|" + ("---|" if budget else ""),
    ]
    for r in result["rows"]:
        fits = (" yes |" if r["step_ms"] <= budget else " no |") if budget else ""
        lines.append(
            f"| {r['hidden']} | {r['layers']} | {r['heads']} | {r['parameters'] / 1e6:.1f} M | {r['size_mib']:.1f} | "
            f"{r['step_ms']:.3f} ({r['step_ms_min']:.3f}) | {r['verify_4_ms']:.3f} |{fits}"
        )
    return "\n".join(lines) + "\n"


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidArgument(f"{flag} takes comma-separated integers (got {text!r})") from None
    if not values:
        raise InvalidArgument(f"{flag} needs at least one value")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m omnidraft.bench.drafter_sizes", description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", default="128,256,384,512,768", help="hidden sizes (multiples of 32)")
    ap.add_argument("--layers", default="2,4", help="layer counts")
    ap.add_argument("--draft-vocab", type=int, default=4096, help="tokens the deployed head keeps")
    ap.add_argument("--quant", default="int8", choices=("fp32", "int8", "int4"))
    ap.add_argument("--repeats", type=int, default=100, help="timed calls per shape")
    ap.add_argument("--budget-ms", type=float, help="the step a drafter may cost (e.g. 3 %% of the target's step)")
    ap.add_argument("--out", type=Path, default=Path("reports/drafter-sizes"))
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging

    from omnidraft.cli import quiet_third_party_logs

    quiet_third_party_logs()
    hf_logging.disable_progress_bar()  # one bar per saved random model says nothing here
    try:
        hiddens, layers = _ints(args.hidden, "--hidden"), _ints(args.layers, "--layers")
        for h in hiddens:
            shape_recipe({"model": {}}, h, min(layers))  # bad shapes fail before any export
        if args.repeats < 1 or args.draft_vocab < 1:
            raise InvalidArgument("--repeats and --draft-vocab must be >= 1")
        check_writable(args.out, folder=True)
        rows = measure(
            hiddens=hiddens,
            layers=layers,
            draft_vocab=args.draft_vocab,
            quant=args.quant,
            repeats=args.repeats,
        )
    except OmnidraftError as exc:
        print(f"drafter_sizes: {exc}", file=sys.stderr)
        return 2
    result = {
        "quant": args.quant,
        "draft_vocab": args.draft_vocab,
        "repeats": args.repeats,
        "budget_ms": args.budget_ms,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "drafter_sizes.json", json.dumps(result, indent=2) + "\n")
    write_text(args.out / "drafter_sizes.md", markdown(result))
    plot_drafter_sizes(rows, args.budget_ms, args.out / "drafter_sizes.png", f"drafter step, ONNX {args.quant}")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
