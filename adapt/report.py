"""Report of an adaptation run: JSON, a markdown table and a PNG of acceptance over the stream."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from omnidraft.atomic import save_figure, write_bytes


def running_mean(values: list[float], window: int) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    lo = np.maximum(np.arange(1, v.size + 1) - window, 0)
    return (c[1:] - c[lo]) / (np.arange(1, v.size + 1) - lo)


def cumulative_acceptance(accepted: list[int], proposed: list[int]) -> np.ndarray:
    a, p = np.cumsum(accepted, dtype=np.float64), np.cumsum(proposed, dtype=np.float64)
    return np.divide(a, p, out=np.zeros_like(a), where=p > 0)


def plot(
    path: Path,
    accepted: list[int],
    proposed: list[int],
    every: int,
    title: str,
    before: float | None = None,
    after: float | None = None,
    window: int = 32,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = [a / p if p else 0.0 for a, p in zip(accepted, proposed)]
    x = np.arange(1, len(per) + 1)
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    ax.scatter(x, per, s=6, alpha=0.25, color="tab:gray", label="per prompt")
    ax.plot(x, running_mean(per, window), color="tab:blue", label=f"moving mean ({window} prompts)")
    ax.plot(x, cumulative_acceptance(accepted, proposed), color="tab:orange", label="cumulative")
    if before is not None:
        ax.axhline(before, color="tab:red", ls="--", lw=1, label=f"test before ({before:.3f})")
    if after is not None:
        ax.axhline(after, color="tab:green", ls="--", lw=1, label=f"test after ({after:.3f})")
    ax.set_xlabel(f"prompt in stream (drafter update every {every})")
    ax.set_ylabel("acceptance rate (greedy)")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def markdown(report: dict) -> str:
    ev = report.get("eval") or {}
    cfg = report["config"]
    lines = [
        f"# omnidraft adapt: {report['stream']} ({cfg['mode']}, loss {cfg['loss']}, engine {report['engine']})",
        "",
    ]
    if ev.get("before") or ev.get("after"):
        lines += [
            "| split | drafter | n-gram cache | prompts | acceptance | tokens/step | n-gram hits |",
            "|---|---|---|---:|---:|---:|---:|",
        ]
    names = {"before": ("base", "fresh"), "cache_only": ("base", "after stream"), "after": ("adapted", "after stream")}
    for key, (drf, cache) in names.items():
        m = ev.get(key)
        if m:
            lines.append(
                f"| {ev.get('split', 'test')} | {drf} | {cache} | {m['prompts']} | {m['acceptance']:.4f} | "
                f"{m['tokens_per_step']:.3f} | {m['ngram_hits']} |"
            )
    if "before" in ev and "after" in ev:
        lift = f"Lift: {ev['after']['acceptance'] - ev['before']['acceptance']:+.4f} acceptance"
        if "cache_only" in ev:
            lift += f" (adapted vs base drafter, same cache: {ev['after']['acceptance'] - ev['cache_only']['acceptance']:+.4f})"
        lines += ["", lift]
    if ev.get("by_draft_len"):
        lines += [
            "",
            "Held-out acceptance at each fixed draft length K (base drafter with a fresh cache, base drafter "
            "with the stream's cache, adapted drafter with it):",
            "",
            "| K | base, fresh cache | base, stream cache | adapted | lift |",
            "|---:|---:|---:|---:|---:|",
        ]
        for k, row in ev["by_draft_len"].items():
            b, c, a = (row[x]["acceptance"] for x in ("before", "cache_only", "after"))
            lines.append(f"| {k} | {b:.4f} | {c:.4f} | {a:.4f} | {a - b:+.4f} |")
    s = report["stream_summary"]
    lines += [
        "",
        f"Stream: {s['prompts']} prompts, {s['updates']} updates ({s['skipped_updates']} skipped), "
        f"acceptance first/last quarter {s['first_quarter']:.4f} / {s['last_quarter']:.4f}, "
        f"rollbacks {s['rollbacks']}.",
    ]
    if "greedy_identical" in ev:
        g = ev["greedy_identical"]
        lines.append(f"Greedy output equals target-only greedy on {g['same']}/{g['checked']} test prompts.")
    return "\n".join(lines) + "\n"


def write(out: Path, report: dict, accepted: list[int], proposed: list[int], every: int) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    ev = report.get("eval") or {}
    title = (
        f"{report['stream']}: {report['config']['mode']} / {report['config']['loss']} "
        f"({len(accepted)} prompts, update every {every})"
    )
    png = out / "acceptance.png"
    plot(
        png,
        accepted,
        proposed,
        every,
        title,
        (ev.get("before") or {}).get("acceptance"),
        (ev.get("after") or {}).get("acceptance"),
    )
    paths = {"json": str(out / "report.json"), "markdown": str(out / "report.md"), "png": str(png)}
    report = {**report, "files": paths}
    write_bytes(out / "report.json", json.dumps(report, indent=1).encode())
    write_bytes(out / "report.md", markdown(report).encode())
    return paths
