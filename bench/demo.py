"""`omnidraft demo`: the bundled drafter and real targets, exported, decoding the task streams
against target-only, before and after one online adaptation pass."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path

from omnidraft.atomic import check_writable, save_figure, write_json
from omnidraft.bench.adapted_rows import short_pass_lr
from omnidraft.bench.bundled import REAL_DRAFTER, check_bundled, drafter_export, drafter_vocab, target_export
from omnidraft.bench.streams_eval import StreamRun, run_lockstep
from omnidraft.errors import InvalidArgument
from omnidraft.models.streams import STREAMS, load_stream
from omnidraft.runtime.context_lookup import LookupConfig
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.draft_length.head_file import ET_NO_HEAD
from omnidraft.runtime.speculative import SpeculativeDecoder

BACKENDS = {
    "ort": ("onnx", "int8"),
    "executorch": ("executorch", "8da4w"),
    "torch": (None, None),
    "qnn-htp": ("onnx", "int8"),  # the target's format; the drafter is compiled for the HTP (below)
}
# Backends whose drafter is compiled for an accelerator beside a CPU target. On x86 the QNN HTP runs
# as a simulator: its drafter timings are not a phone's.
DRAFTER_DEVICES = {"qnn-htp": "qnn-htp"}
# The real pairs: the drafter that learned from the real targets (bench/bundled.py: REAL_DRAFTER)
# against each installed target, on the streams it is good at.
REAL_TARGETS = (("qwen2.5-coder-0.5b-instruct", ("code", "math")), ("gemma-3-270m", ("text",)))
PAIRS = ("real", "tiny")


@dataclass(frozen=True)
class DemoPair:
    label: str
    drafter: Path  # Hugging Face folders; exports are derived per backend
    target: Path
    streams: tuple[str, ...]


@dataclass
class DemoSettings:
    pair: str = "real"  # "real" (installed real targets), "tiny" (the bundled pair) or "DRAFTER,TARGET"
    streams: tuple[str, ...] = STREAMS
    prompts: int = 10
    max_new_tokens: int = 48
    # K = 2: K = 4 costs the untrained drafter most (its acceptance sits on the first drafted token),
    # and K = 1 leaves the adapted drafter too little to gain.
    draft_len: int | str = 2  # "auto": the adaptation pass trains the acceptance head
    gamma: float = 0.5
    # Rounds copy from the context where it repeats (runtime/context_lookup.py); None: the drafter alone.
    lookup: LookupConfig | None = field(default_factory=LookupConfig)
    backend: str = "ort"
    max_seq_len: int = 512
    out: Path = Path("reports/demo")
    # 24 = three updates of 8, so the first run, exports included, stays within a few minutes on two
    # cores; each further update adds ExecuTorch training-program steps.
    adapt_prompts: int = 24  # train prompts of the adaptation pass per stream (0: no adaptation)
    # One stream keeps the run within 5 minutes; code is where a short pass lifts acceptance most.
    adapt_streams: tuple[str, ...] = ("code",)
    adapt_rank: int = 32
    # Short-stream settings (see bench/adapted_rows.py): 8 AdamW steps per update of 8 prompts, sharpened target.
    # lr None: the drafter's short-pass lr (bench/adapted_rows.py: short_pass_lr), lower for a drafter
    # that learned from the real targets already.
    adapt_lr: float | None = None
    adapt_every: int = 8
    adapt_steps: int = 8
    adapt_temperature: float = 0.1
    adapt_engine: str = "executorch"

    @classmethod
    def quick(cls, **kw) -> DemoSettings:
        return cls(prompts=4, max_new_tokens=32, **{"adapt_prompts": 0, **kw})


def demo_pairs(s: DemoSettings) -> list[DemoPair]:
    """The pairs the demo decodes, each with the requested streams it covers (checked before any work)."""
    from omnidraft.models.sources import resolve

    if s.pair == "tiny":
        folders = check_bundled()
        pairs = [DemoPair("bundled target", folders["drafter"], folders["target"], STREAMS)]
    elif s.pair == "real":
        drafter = check_bundled(roles=(REAL_DRAFTER,))[REAL_DRAFTER]
        pairs = [DemoPair(name, drafter, resolve(name), streams) for name, streams in REAL_TARGETS]
    else:
        parts = [p.strip() for p in s.pair.split(",")]
        if len(parts) != 2 or not all(parts):
            raise InvalidArgument(f"unknown --pair {s.pair!r}; use real, tiny or DRAFTER,TARGET")
        pairs = [DemoPair(parts[1], resolve(parts[0]), resolve(parts[1]), STREAMS)]
    pairs = [DemoPair(p.label, p.drafter, p.target, tuple(n for n in p.streams if n in s.streams)) for p in pairs]
    pairs = [p for p in pairs if p.streams]
    if not pairs:
        raise InvalidArgument(f"--streams {','.join(s.streams)} selects no stream of the {s.pair} pairs")
    return pairs


def open_models(pair: DemoPair, backend: str, max_seq_len: int, progress: bool = True) -> tuple[Path, Path]:
    """Paths (HF folders or cached exports) of the pair's drafter and target for ``backend``."""
    if backend not in BACKENDS:
        raise InvalidArgument(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    fmt, quant = BACKENDS[backend]
    if fmt is None:
        return pair.drafter, pair.target
    device = DRAFTER_DEVICES.get(backend, "cpu")
    return (
        drafter_export(pair.drafter, fmt, quant, max_seq_len, progress, device=device),
        target_export(pair.target, fmt, quant, max_seq_len, progress),
    )


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


def _adapt(
    s: DemoSettings, name: str, pair: DemoPair, target_path: Path, state: Path, progress: bool
) -> tuple[Path, Path, Path, dict]:
    """One pass of online adaptation over the stream's first train prompts: returns the adapted
    drafter (exported for the demo's backend), its n-gram cache, the answer memory of the pass (the
    target's answers to those prompts), and a summary."""
    from tqdm import tqdm

    from omnidraft.adapt.config import AdaptConfig, Distillation, HeadTraining, StreamDecoding, UpdateSchedule
    from omnidraft.adapt.online import OnlineAdapter

    auto = s.draft_len == "auto"
    cfg = AdaptConfig(
        schedule=UpdateSchedule(
            mode="lora",
            rank=s.adapt_rank,
            lr=s.adapt_lr if s.adapt_lr is not None else short_pass_lr(pair.drafter),
            every=s.adapt_every,
            steps_per_update=s.adapt_steps,
            engine=s.adapt_engine,
        ),
        distill=Distillation(loss="hybrid", temperature=s.adapt_temperature),
        decoding=StreamDecoding(max_new_tokens=s.max_new_tokens, draft_len=s.draft_len, gamma=s.gamma, tune_gamma=auto),
        head=HeadTraining(train=auto, variant="interleaved"),
    )
    train = [p.prompt for p in load_stream(name, "train", target=pair.target)[: s.adapt_prompts]]
    # The adapter decodes with the deployed target (the backend's export) so its targets are on-policy.
    ad = OnlineAdapter(pair.drafter, target_path, state / "adapt" / name, cfg)
    bar = tqdm(
        total=len(train),
        desc=f"{name}: adapt (LoRA, hybrid)",
        file=sys.stderr,
        disable=not progress,
        leave=False,
        dynamic_ncols=True,
    )
    acc = [0, 0]

    def on_prompt(i: int, rec) -> None:
        if rec is not None:
            acc[0], acc[1] = acc[0] + rec.accepted, acc[1] + rec.proposed
        bar.update(1)
        bar.set_postfix(acc=f"{acc[0] / max(acc[1], 1):.2f}", updates=ad.updates)

    try:
        log = ad.run(train, on_prompt)
    finally:
        bar.close()
    merged = ad.dir / "drafter"
    fmt, quant = BACKENDS[s.backend]
    if fmt is not None:
        from omnidraft.export.pipeline import export_model

        out = ad.dir / f"drafter-{fmt}-{quant}"
        export_model(
            merged,
            fmt,
            quant,
            s.max_seq_len,
            out,
            progress=progress,
            accept_head=merged if auto else None,  # the head goes inside the ONNX graph
            draft_vocab=drafter_vocab(merged),
        )
        merged = out
    summary = {
        "train_prompts": len(log.acceptance),
        "updates": ad.updates,
        "engine": ad.trainer.engine,
        "train_stream_acceptance": round(sum(log.accepted) / max(sum(log.proposed), 1), 4),
        "rollbacks": sum(1 for e in log.events if e.get("action") == "rolled-back"),
        "seconds": {
            "decode": round(log.decode_seconds, 1),
            "train": round(log.train_seconds, 1),
            "publish": round(log.publish_seconds, 1),
        },
    }
    if auto:
        summary["gamma"] = round(ad.gamma_ctl.gamma if ad.gamma_ctl is not None else s.gamma, 4)
        summary["k_max"] = ad.gamma_ctl.k_max if ad.gamma_ctl is not None else DecodeConfig().max_draft_len
    return merged, ad.cache_path, ad.memory_path, summary


def _warm_up(dec, prompt: str) -> None:
    """A few untimed steps, so one-time session costs (graph optimisation, first allocations) do not
    land in the first timed prompt; dm mode leaves the n-gram cache untouched, and a decoder without
    the answer memory keeps the warm-up's answer out of it."""
    SpeculativeDecoder(dec.target, dec.drafter, dec.cache).generate(
        prompt, DecodeConfig(max_new_tokens=4, draft_len=2, mode="dm")
    )


def _row(target: str, name: str, phase: str, run: StreamRun, base: StreamRun, cache_entries: int) -> dict:
    n = min(base.prompts, run.prompts)
    r = run.row()
    r.update(
        target=target,
        stream=name,
        phase=phase,
        target_only_tokens_per_s=round(base.tokens_per_s, 2),
        speedup=round(run.tokens_per_s / base.tokens_per_s, 3) if base.tokens_per_s else 0.0,
        decode_speedup=round(run.decode_tokens_per_s / base.decode_tokens_per_s, 3)
        if base.decode_tokens_per_s
        else 0.0,
        identical_to_target_only=base.outputs[:n] == run.outputs[:n],
        ngram_cache_entries=cache_entries,
    )
    return r


def run_demo(s: DemoSettings, progress: bool = True) -> dict:
    """Per stream: target-only, omnidraft with the drafter as shipped and an empty cache, then (unless
    ``adapt_prompts`` is 0) one adaptation pass over train prompts and omnidraft again with the
    adapted drafter and its cache, all on the same held-out prompts."""
    import shutil

    from omnidraft.runtime.session import open_pair

    for name in s.streams:
        load_stream(name, "test")  # unknown names fail here, listing the valid ones
    if s.adapt_prompts < 0:
        raise InvalidArgument(f"--adapt-prompts must be >= 0 (got {s.adapt_prompts}); 0 skips adaptation")
    auto = s.draft_len == "auto"
    if auto and s.backend == "executorch":
        raise InvalidArgument(f"--draft-len auto: {ET_NO_HEAD}; use --backend ort or torch, or a fixed --draft-len K")
    unknown = [n for n in s.adapt_streams if n not in STREAMS]
    if unknown:
        raise InvalidArgument(
            f"unknown --adapt-streams {', '.join(unknown)}; choose from {', '.join(STREAMS)}, all or none"
        )
    if auto and not (s.adapt_prompts and set(s.adapt_streams) & set(s.streams)):
        raise InvalidArgument(
            "--draft-len auto needs the acceptance head the adaptation pass trains; "
            "set --adapt-prompts N >= 1 and --adapt-streams, or use a fixed --draft-len K"
        )
    pairs = demo_pairs(s)  # a missing or uninstalled model fails here, before any export
    check_writable(s.out, folder=True)  # before the exports and passes, not when the report is written
    state = s.out / "state"
    shutil.rmtree(state, ignore_errors=True)  # each demo run starts from the drafter as shipped
    rows, curves, adaptation, artifacts = [], {}, {}, []
    # auto: the drafter as shipped has no head yet, so its row drafts a fixed K = 4
    cfg = DecodeConfig(max_new_tokens=s.max_new_tokens, draft_len=4 if auto else s.draft_len, lookup=s.lookup)
    stop = False
    for pair in pairs:
        drafter_path, target_path = open_models(pair, s.backend, s.max_seq_len, progress)
        artifacts.append(
            {"target": pair.label, "drafter_artifact": str(drafter_path), "target_artifact": str(target_path)}
        )
        for name in pair.streams:
            prompts = [p.prompt for p in load_stream(name, "test", target=pair.target)[: s.prompts]]
            # The answer memory starts empty, like the n-gram cache, and learns each answer as it goes;
            # target-only decodes through a decoder of its own, so the memory never sees its answers.
            dec = open_pair(target_path, drafter_path, memory_path=state / pair.label / f"answer_memory.{name}.json")
            plain = {"target-only": SpeculativeDecoder(dec.target)}
            _warm_up(dec, prompts[0])
            only = DecodeConfig(max_new_tokens=s.max_new_tokens, mode="target-only")
            runs = run_lockstep(
                dec, prompts, {"target-only": only, "omnidraft": cfg}, f"{pair.label} {name}", progress, decoders=plain
            )
            base, spec = runs["target-only"], runs["omnidraft"]
            # "as shipped": the drafter before any online adaptation (no user data; it may have learned
            # from the targets offline, as bundled/drafter-teachers did)
            rows.append(_row(pair.label, name, "as shipped", spec, base, len(dec.cache)))
            curves[f"{pair.label} {name} (as shipped)"] = spec
            if stop := base.interrupted or spec.interrupted:
                break
            if s.adapt_prompts and name in s.adapt_streams:
                adapted, cache_path, memory_path, adaptation[f"{pair.label}/{name}"] = _adapt(
                    s, name, pair, target_path, state / pair.label, progress
                )
                dec = open_pair(target_path, adapted, cache_path=cache_path, memory_path=memory_path)
                plain = {"target-only": SpeculativeDecoder(dec.target)}
                _warm_up(dec, prompts[0])
                # --draft-len auto keeps --gamma and K_max 16 rather than the pass's tuned setting: the pass
                # drafts with the eager drafter (~5x the exported drafter's cost per call), so that
                # setting is biased toward short drafts.
                acfg = (
                    cfg
                    if not auto
                    else DecodeConfig(max_new_tokens=s.max_new_tokens, draft_len="auto", gamma=s.gamma, lookup=s.lookup)
                )
                # target-only again, beside the adapted drafter: the pass ran in between, and the machine's
                # load then is not what it was for the first pair of rows
                runs = run_lockstep(
                    dec,
                    prompts,
                    {"target-only": only, "omnidraft adapted": acfg},
                    f"{pair.label} {name}",
                    progress,
                    decoders=plain,
                )
                base, after = runs["target-only"], runs["omnidraft adapted"]
                phase = "adapted + adaptive K" if auto else "adapted"
                rows.append(_row(pair.label, name, phase, after, base, len(dec.cache)))
                curves[f"{pair.label} {name} (adapted)"] = after
                if stop := after.interrupted:
                    break
        if stop:
            break
    report = {
        "settings": {
            k: (str(v) if isinstance(v, Path) else asdict(v) if is_dataclass(v) else v) for k, v in vars(s).items()
        },
        "pairs": artifacts,
        "rows": rows,
        "adaptation": adaptation,
    }
    write_json(s.out / "report.json", report)
    plot_acceptance(curves, s.out / "acceptance.png", f"omnidraft demo ({s.backend}): acceptance on held-out prompts")
    return report


def summary_table(report: dict) -> str:
    return markdown_table(
        report["rows"],
        [
            ("target", "target"),
            ("stream", "stream"),
            ("phase", "drafter"),
            ("target_only_tokens_per_s", "target-only tok/s"),
            ("tokens_per_s", "omnidraft tok/s"),
            ("speedup", "speedup"),
            ("decode_speedup", "decode speedup"),
            ("acceptance_rate", "acceptance"),
            ("tokens_per_step", "tokens/target call"),
            ("ngram_hits_per_step", "n-gram hits/step"),
            ("lookup_rounds", "rounds copied"),
            ("memory_rounds", "of them from earlier answers"),
            ("ngram_cache_entries", "cache entries"),
            ("identical_to_target_only", "identical output"),
        ],
    )


def main_print(report: dict, out: Path) -> None:
    print(summary_table(report))
    if report.get("settings", {}).get("backend") in DRAFTER_DEVICES:
        print(
            "note: the drafter ran on the QNN HTP simulator (x86): its timings and the speedups above are not "
            "device timings; acceptance and identical output hold on any device",
            file=sys.stderr,
        )
    print(f"\nreport: {out / 'report.json'}, plot: {out / 'acceptance.png'}", file=sys.stderr)
