"""fleet.json, fleet.md and fleet.png in ``--out`` (each written atomically, after every round)."""

from __future__ import annotations

from pathlib import Path

from omnidraft import atomic


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def markdown(report: dict) -> str:
    streams = list(report["untrained"])
    lines = [
        f"# Fleet run: pair {report['pair']}",
        "",
        f"Untrained drafter, held-out acceptance: {_fmt(report.get('untrained_acceptance'))} "
        + "("
        + ", ".join(f"{s} {report['untrained'][s]['acceptance']:.3f}" for s in streams)
        + ")",
        "",
        "| round | global | " + " | ".join(streams) + " | global on unseen | local on unseen | excluded | "
        "bytes/client | A/B gap | s |",
        "|---:|---:|" + "---:|" * len(streams) + "---:|---:|---|---:|---:|---:|",
    ]
    for r in report["rounds"]:
        gap = r.get("ab_vs_merged") or {}
        lines.append(
            f"| {r['round']} | {r['global_acceptance']:.3f} | "
            + " | ".join(f"{r['global_by_stream'][s]['acceptance']:.3f}" for s in streams)
            + f" | {_fmt(r.get('global_on_unseen_mean'))} | {_fmt(r.get('local_unseen_mean'))} | "
            f"{', '.join(map(str, r['excluded_clients'])) or '–'} | {r['bytes_per_client']:,} | "
            f"{_fmt(gap.get('relative_gap'))} | {r['seconds']} |"
        )
    g = report.get("greedy_identical")
    if g:
        lines += ["", f"Greedy output with the global drafter identical to target-only: {g['same']}/{g['checked']}."]
    if report.get("seconds") is not None:
        lines += [f"Wall time: {report['seconds']} s."]
    lines += [
        "",
        "*global on unseen*: the global drafter on each client's unseen streams, averaged over the kept clients; "
        "*local on unseen*: each kept client's own drafter (the round's starting global plus its own delta) on "
        "the same streams. *A/B gap*: relative distance between averaging A and B separately and averaging "
        "the merged updates BA.",
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = report["rounds"]
    if not rounds:
        return None
    xs = [0] + [r["round"] for r in rounds]

    def series(key: str) -> list[float]:
        return [float("nan") if r.get(key) is None else r[key] for r in rounds]

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(
        xs,
        [report["untrained_acceptance"]] + [r["global_acceptance"] for r in rounds],
        "o-",
        label="global drafter (all streams)",
    )
    ax.plot(
        [r["round"] for r in rounds],
        series("global_on_unseen_mean"),
        "s--",
        label="global, on each client's unseen streams",
    )
    ax.plot(
        [r["round"] for r in rounds],
        series("local_unseen_mean"),
        "^:",
        label="local drafters, on their unseen streams",
    )
    ax.axhline(report["untrained_acceptance"], color="grey", lw=0.8, label="untrained drafter")
    ax.set_xlabel("round")
    ax.set_ylabel("held-out acceptance")
    ax.set_title(f"fleet learning, pair {report['pair']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic.save_figure(fig, path)
    plt.close(fig)
    return path


def write_report(out: Path, report: dict) -> dict[str, str]:
    out = Path(out)
    files = {"json": out / "fleet.json", "md": out / "fleet.md", "png": out / "fleet.png"}
    atomic.write_json(files["json"], report)
    atomic.write_text(files["md"], markdown(report))
    plot(report, files["png"])
    return {k: str(v) for k, v in files.items()}
