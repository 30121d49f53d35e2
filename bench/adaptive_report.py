"""What `omnidraft bench-adaptive` writes for people: adaptive.md and the tokens/s plot per stream."""

from __future__ import annotations

from pathlib import Path


def plot_tokens_per_s(streams: list[dict], path: Path) -> bool:
    fixed = [(st["stream"], [r for r in st["rows"] if r["method"].startswith("K=")]) for st in streams]
    if not any(rows for _, rows in fixed):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from omnidraft.atomic import save_figure

    fig, axes = plt.subplots(1, len(streams), figsize=(4.2 * len(streams), 3.6), squeeze=False)
    for ax, st in zip(axes[0], streams):
        groups: dict[str, list[dict]] = {}  # one line per drafter ("K=3 (joint drafter)": --loss distils each)
        for r in st["rows"]:
            if r["method"].startswith("K="):
                suffix = r["method"].partition(" ")[2]
                groups.setdefault(f"fixed K {suffix}".strip(), []).append(r)
        for color, (label, ks) in zip(("C0", "C4", "C5", "C6"), groups.items()):
            ax.plot([r["draft_len"] for r in ks], [r["tokens_per_s"] for r in ks], marker="o", label=label, color=color)
        for r in st["rows"]:
            if r["method"].startswith("adaptive"):
                ax.axhline(
                    r["tokens_per_s"], ls="--", lw=1, label=r["method"], color="C1" if "joint" in r["method"] else "C2"
                )
        base = next(r for r in st["rows"] if r["method"] == "target-only")
        ax.axhline(base["tokens_per_s"], color="grey", lw=1, label="target-only")
        ax.set_title(st["stream"])
        ax.set_xlabel("draft length K")
        ax.set_ylabel("tokens/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return True


def markdown(report: dict) -> str:
    from omnidraft.bench.demo import markdown_table

    def f(v, fmt="{:.3f}"):
        return "–" if v is None else ("yes" if v is True else "**no**" if v is False else fmt.format(v))

    parts = ["# Adaptive drafting vs fixed draft length", ""]
    s = report["meta"]["settings"]
    parts.append(
        f"backend {s['backend']}, {s['max_new_tokens']} new tokens per prompt, head loss "
        f"{'head only (drafter frozen)' if s['loss'] == 'none' else s['loss'] + ' distillation + head'}, "
        f"gamma from {s['gamma']} and K_max {s['max_draft_len']}{', both tuned online' if s['tune_gamma'] else ''}"
        f"{'' if not s['tune_gamma'] else ', drafting may be turned off' if s.get('allow_off', True) else ', always drafting'}; "
        "timed in lockstep."
    )
    for st in report["streams"]:
        parts += [
            "",
            f"## {st['stream']} ({st['test_prompts']} test prompts, heads trained on {st['train_prompts']} "
            f"train prompts; best fixed: {st['best_fixed']})",
            "",
        ]
        rows = [
            {
                "m": r["method"],
                "acc": f(r["acceptance_rate"]),
                "tpc": f(r["tokens_per_step"], "{:.2f}"),
                "calls": f(r["drafter_calls_per_step"], "{:.2f}"),
                "tps": f(r["tokens_per_s"], "{:.1f}"),
                "spd": f(r["speedup"], "{:.2f}x"),
                "vs": f(r.get("vs_best_fixed"), "{:+.1%}"),
                "dspd": f(r.get("decode_speedup"), "{:.2f}x"),
                "dvs": f(r.get("vs_best_fixed_decode"), "{:+.1%}"),
                "g": f(r.get("gamma_final"), "{:.2f}")
                + ("" if r.get("k_max_final") is None else f" / {r['k_max_final'] or 'off'}"),
                "off": "–" if "prompts_without_drafting" not in r else str(r["prompts_without_drafting"]),
                "same": f(r["outputs_match_target_only"]),
            }
            for r in st["rows"]
        ]
        parts.append(
            markdown_table(
                rows,
                [
                    ("m", "method"),
                    ("acc", "acceptance"),
                    ("tpc", "tokens/target call"),
                    ("calls", "drafter calls/target call"),
                    ("tps", "tok/s"),
                    ("spd", "speedup"),
                    ("vs", "vs best fixed K"),
                    ("dspd", "decode speedup"),
                    ("dvs", "decode vs best fixed K"),
                    ("g", "final gamma / K_max"),
                    ("off", "prompts decoded without drafting"),
                    ("same", "same output as target-only"),
                ],
            )
        )
    parts += ["", "## Checks", ""]
    for c in report["checks"]:
        parts.append(
            f"- {c['variant']}: gains vs best fixed K {c['gains_vs_best_fixed']}; >= 5 % on two streams: "
            f"{f(c['beats_best_fixed_by_5pct_on_2_streams'])}; never below -3 %: "
            f"{f(c['never_loses_more_than_3pct'])}; identical greedy output: {f(c['identical_greedy_output'])}"
        )
    if report.get("interrupted"):
        parts += ["", "**interrupted**: streams finished before Ctrl-C only."]
    return "\n".join(parts) + "\n"
