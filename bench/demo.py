"""`omnidraft demo`: the bundled pair, exported, decoding the task streams against target-only."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from omnidraft.atomic import save_figure, write_json
from omnidraft.bench.bundled import cached_export, check_bundled
from omnidraft.bench.streams_eval import StreamRun, run_stream
from omnidraft.errors import InvalidArgument
from omnidraft.models.streams import STREAMS, load_stream
from omnidraft.runtime.speculative import DecodeConfig

BACKENDS = {"ort": ("onnx", "int8"), "executorch": ("executorch", "8da4w"), "torch": (None, None)}


@dataclass
class DemoSettings:
    streams: tuple[str, ...] = STREAMS
    prompts: int = 12
    max_new_tokens: int = 48
    draft_len: int = 4
    backend: str = "ort"
    max_seq_len: int = 512
    out: Path = Path("reports/demo")

    @classmethod
    def quick(cls, **kw) -> "DemoSettings":
        return cls(prompts=4, max_new_tokens=32, **kw)


def open_models(backend: str, max_seq_len: int, progress: bool = True) -> tuple[Path, Path]:
    """Paths (HF folders or cached exports) of the bundled drafter and target for ``backend``."""
    if backend not in BACKENDS:
        raise InvalidArgument(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    folders = check_bundled()
    fmt, quant = BACKENDS[backend]
    if fmt is None:
        return folders["drafter"], folders["target"]
    return tuple(cached_export(folders[r], fmt, quant, max_seq_len, progress) for r in ("drafter", "target"))




def plot_acceptance(runs: dict[str, StreamRun], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, run in runs.items():
        ax.plot(range(1, len(run.running_acceptance) + 1), run.running_acceptance, label=label)
    ax.set_xlabel("prompts decoded")
    ax.set_ylabel("running acceptance rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def markdown_table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    head = "| " + " | ".join(h for _, h in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(str(r.get(k, "")) for k, _ in cols) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def run_demo(s: DemoSettings, progress: bool = True) -> dict:
    from omnidraft.runtime.session import open_pair

    for name in s.streams:
        load_stream(name, "test")  # unknown names fail here, listing the valid ones
    drafter_path, target_path = open_models(s.backend, s.max_seq_len, progress)
    state = s.out / "state"
    rows, curves = [], {}
    for name in s.streams:
        prompts = [p.prompt for p in load_stream(name, "test")[: s.prompts]]
        cache_file = state / f"ngram_cache.{name}.json"
        dec = open_pair(target_path, drafter_path, cache_path=cache_file)
        cfg = DecodeConfig(max_new_tokens=s.max_new_tokens, draft_len=s.draft_len)
        base = run_stream(dec, prompts, DecodeConfig(max_new_tokens=s.max_new_tokens, mode="target-only"),
                          f"{name}: target-only", progress)
        spec = run_stream(dec, prompts, cfg, f"{name}: omnidraft", progress)
        dec.cache.save(cache_file)
        n = min(base.prompts, spec.prompts)
        curves[name] = spec
        r = spec.row()
        r.update(stream=name, target_only_tokens_per_s=round(base.tokens_per_s, 2),
                 speedup=round(spec.tokens_per_s / base.tokens_per_s, 3) if base.tokens_per_s else 0.0,
                 identical_to_target_only=base.outputs[:n] == spec.outputs[:n],
                 ngram_cache_entries=len(dec.cache))
        rows.append(r)
        if base.interrupted or spec.interrupted:
            break
    report = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(s).items()},
              "drafter": str(drafter_path), "target": str(target_path), "rows": rows}
    write_json(s.out / "report.json", report)
    plot_acceptance(curves, s.out / "acceptance.png", f"omnidraft demo ({s.backend}): acceptance over the stream")
    return report


def summary_table(report: dict) -> str:
    return markdown_table(report["rows"], [
        ("stream", "stream"), ("target_only_tokens_per_s", "target-only tok/s"), ("tokens_per_s", "omnidraft tok/s"),
        ("speedup", "speedup"), ("acceptance_rate", "acceptance"), ("tokens_per_step", "tokens/target call"),
        ("ngram_hits_per_step", "n-gram hits/step"), ("ngram_cache_entries", "cache entries"),
        ("identical_to_target_only", "identical output")])


def main_print(report: dict, out: Path) -> None:
    print(summary_table(report))
    print(f"\nreport: {out / 'report.json'}, plot: {out / 'acceptance.png'}", file=sys.stderr)
