"""PNG plots of a bench report (matplotlib, Agg), each written atomically."""

from __future__ import annotations

from pathlib import Path

from omnidraft.atomic import save_figure


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    save_figure(fig, path)


def _grouped_bars(ax, groups: list[str], series: list[str], value) -> list:
    """Bars for every (group, series) with a value; returns the bar containers per series."""
    width = 0.8 / max(1, len(series))
    out = []
    for i, s in enumerate(series):
        xs, ys = [], []
        for g_i, g in enumerate(groups):
            v = value(g, s)
            if v is not None:
                xs.append(g_i - 0.4 + width * (i + 0.5))
                ys.append(v)
        out.append(ax.bar(xs, ys, width, label=s))
    ax.set_xticks(range(len(groups)), groups)
    return out


def plot_speedup(rows: list[dict], path: Path, title: str) -> bool:
    """Measured speedup per stream and method, with each row's physical bound as a black tick."""
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return False
    plt = _plt()
    streams = list(dict.fromkeys(r["stream"] for r in ok))
    methods = list(dict.fromkeys(r["method"] for r in ok))
    by = {(r["stream"], r["method"]): r for r in ok}
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(streams) * len(methods) / 3), 4.2))
    bars = _grouped_bars(ax, streams, methods, lambda g, s: by[(g, s)]["speedup"] if (g, s) in by else None)
    for s, cont in zip(methods, bars):
        present = [g for g in streams if (g, s) in by]
        for rect, g in zip(cont, present):
            b = by[(g, s)].get("bound")
            if b is not None:
                ax.plot([rect.get_x(), rect.get_x() + rect.get_width()], [b, b], color="black", lw=1.5)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("speedup over target-only (black: bound)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)
    plt.close(fig)
    return True


def plot_peers(peers: list[dict], path: Path, title: str) -> bool:
    ok = [p for p in peers if p.get("tokens_per_s") is not None]
    if not ok:
        return False
    plt = _plt()
    streams = list(dict.fromkeys(p["stream"] for p in ok))
    names = list(dict.fromkeys(p["name"] for p in ok))
    by = {(p["stream"], p["name"]): p["tokens_per_s"] for p in ok}
    fig, ax = plt.subplots(figsize=(8, 4.2))
    _grouped_bars(ax, streams, names, lambda g, s: by.get((g, s)))
    ax.set_ylabel("tokens / s (greedy)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)
    plt.close(fig)
    return True


def plot_growth(curves: dict[str, list[tuple[int, int]]], path: Path, title: str) -> bool:
    """Cache entries against target tokens processed, one line per stream (paper Fig. 9)."""
    curves = {k: v for k, v in curves.items() if len(v) > 1}
    if not curves:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, pts in curves.items():
        ax.plot([t for t, _ in pts], [n for _, n in pts], label=label, drawstyle="steps-post")
    ax.set_xlabel("target tokens processed")
    ax.set_ylabel("n-gram cache entries")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)
    return True


def plot_acceptance(curves: dict[str, list[float]], path: Path, title: str) -> bool:
    """Running acceptance after each prompt, one line per (stream, method)."""
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), ys, label=label)
    ax.set_xlabel("prompts decoded")
    ax.set_ylabel("running acceptance rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    _save(fig, path)
    plt.close(fig)
    return True


def plot_verify_cost(curves: list[dict], path: Path, title: str) -> bool:
    """ms of one target call verifying k tokens, one line per backend (bench/verify_cost.py)."""
    if not curves:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in curves:
        ks = sorted(c["target_ms"], key=int)
        ax.plot([int(k) for k in ks], [c["target_ms"][k] for k in ks], marker="o", label=f"{c['backend']} target")
        ax.axhline(
            c["drafter_step_ms"], ls=":", lw=1, color=ax.lines[-1].get_color(), label=f"{c['backend']} drafter step"
        )
    _finish_ms_plot(plt, fig, ax, path, title, "tokens in one target call (k)", "ms per call (median)")
    return True


def plot_drafter_sizes(rows: list[dict], budget_ms: float | None, path: Path, title: str) -> bool:
    """Deployed step ms against parameters, one line per layer count, the budget as a dashed line."""
    if not rows:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for n in sorted({r["layers"] for r in rows}):
        pts = sorted((r["parameters"] / 1e6, r["step_ms"], r["hidden"]) for r in rows if r["layers"] == n)
        ax.plot([p for p, _, _ in pts], [ms for _, ms, _ in pts], marker="o", label=f"{n} layers")
        for p, ms, h in pts:
            ax.annotate(str(h), (p, ms), textcoords="offset points", xytext=(3, 3), fontsize=7)
    if budget_ms:
        ax.axhline(budget_ms, color="grey", ls="--", lw=1, label=f"budget {budget_ms} ms")
    _finish_ms_plot(plt, fig, ax, path, title, "parameters (M; labels: hidden size)", "one-token step ms (median)")
    return True


def _finish_ms_plot(plt, fig, ax, path: Path, title: str, xlabel: str, ylabel: str) -> None:
    """Axes from zero, labels, grid and legend of a milliseconds plot; written and closed."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)
