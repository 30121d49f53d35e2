"""`omnidraft bench-adaptive`: fixed draft lengths vs adaptive drafting, per stream.

Per stream: one online pass over train prompts per head variant (joint, interleaved) trains the
acceptance head (``--loss none``: the drafter stays frozen, so every row drafts with the same
weights; ``--loss hybrid`` distils the drafter too, and the fixed-K rows are then repeated on each
variant's drafter). Then, timed in lockstep on held-out test prompts (see bench/engine.py):
target-only, fixed K for every K of the sweep, and adaptive drafting per variant, gamma and K_max
starting from --gamma and --max-draft-len and tuned online. (The pass's own controller tunes for
the pass, which drafts with the eager drafter at ~5x the exported drafter's cost per call; its
final setting is reported, not carried over.) The tuned controller may turn drafting off for a
window where plain target steps replay faster than any draft (runtime/draft_length/controller.py; ``--always-draft``
keeps K within [1, K_max]); each row reports how many test prompts ran so. Every row starts from a copy of the
n-gram cache the pass built. Writes adaptive.json, adaptive.md, calibration.png (predicted vs
observed acceptance of the target tokens the heads proposed on the test prompts) and
adaptive_tokens_per_s.png.
"""

from __future__ import annotations

import datetime
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from omnidraft.bench.adaptive_report import markdown, plot_tokens_per_s
from omnidraft.errors import InvalidArgument
from omnidraft.models.streams import STREAMS, load_stream
from omnidraft.runtime.draft_length.head_file import ET_NO_HEAD

VARIANTS = ("joint", "interleaved")


@dataclass
class AdaptiveSettings:
    pair: str = "bundled"
    streams: tuple[str, ...] = STREAMS
    backend: str = "ort"
    prompts: int = 12  # held-out test prompts per stream
    train_prompts: int = 48  # train prompts of each head-training pass
    max_new_tokens: int = 48
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    variants: tuple[str, ...] = VARIANTS
    loss: str = "none"  # "none": head only | "hybrid" | "dm": distil the drafter as well
    gamma: float = 0.5
    tune_gamma: bool = True
    allow_off: bool = True  # the tuned controller may turn drafting off (runtime/draft_length/controller.py)
    max_draft_len: int = 16
    every: int = 8
    head_steps: int = 8
    head_lr: float = 1e-3
    head_bias_lr: float = 0.1
    head_replay: int = 64  # interleaved: FIFO replay buffer, in prompts
    max_seq_len: int = 512
    threads: int | None = 1
    out: Path = Path("reports/adaptive")

    def validate(self) -> None:
        from omnidraft.bench.demo import BACKENDS
        from omnidraft.runtime.draft_length.policy import validate_adaptive

        if self.backend not in BACKENDS:
            raise InvalidArgument(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.backend == "executorch":
            raise InvalidArgument(f"--backend executorch: {ET_NO_HEAD}; use --backend ort or torch")
        bad = [x for x in self.streams if x not in STREAMS]
        if bad or not self.streams:
            raise InvalidArgument(
                f"unknown stream {', '.join(bad) or '(none given)'}; choose from {', '.join(STREAMS)}"
            )
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise InvalidArgument(
                f"unknown head variant {', '.join(bad) or '(none given)'}; choose from {', '.join(VARIANTS)}"
            )
        if self.loss not in ("none", "hybrid", "dm"):
            raise InvalidArgument(f"unknown --loss {self.loss!r}; choose none, hybrid or dm")
        for name in ("prompts", "train_prompts", "max_new_tokens", "every", "max_seq_len", "head_steps", "head_replay"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        if not self.ks or min(self.ks) < 1:
            raise InvalidArgument("every fixed K of --draft-lens must be >= 1")
        validate_adaptive("auto", self.gamma, self.max_draft_len)
        if self.tune_gamma and not 0.05 <= self.gamma <= 0.95:
            raise InvalidArgument(
                f"--gamma must be within [0.05, 0.95] when it is tuned online (got {self.gamma}); "
                "add --fixed-gamma to keep it fixed"
            )
        if not (self.head_lr > 0 and self.head_bias_lr > 0):
            raise InvalidArgument(f"--head-lr and --head-bias-lr must be > 0 (got {self.head_lr}, {self.head_bias_lr})")
        if self.threads is not None and self.threads < 1:
            raise InvalidArgument(f"--threads must be >= 1 (got {self.threads})")


def _observed(result) -> tuple[list[float], list[float]]:
    """(predicted, observed) per proposed target token up to the first rejection, from a trace."""
    from omnidraft.runtime.draft_length.policy import log_sigmoid

    pred, obs = [], []
    for r in result.rounds:
        z, acc = r.accept_logits, r.accepted
        for j, (a, b) in enumerate(r.spans[: acc + 1]):
            if len(z) >= b:
                pred.append(math.exp(sum(log_sigmoid(z[i]) for i in range(a, b))))
                obs.append(1.0 if j < acc else 0.0)
    return pred, obs


@dataclass
class _Pass:
    variant: str
    drafter: Path  # merged drafter folder (head.json beside it)
    cache: Path | None
    summary: dict = field(default_factory=dict)


class AdaptiveBench:
    def __init__(self, s: AdaptiveSettings, progress: bool = True) -> None:
        self.s, self.progress = s, progress
        self.report: dict = {
            "schema": "omnidraft.bench_adaptive",
            "schema_version": 1,
            "interrupted": False,
            "meta": {
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "settings": {
                    k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                    for k, v in asdict(s).items()
                },
            },
            "streams": [],
            "checks": [],
            "plots": [],
        }
        self.calibration: dict[str, dict[str, list[dict]]] = {}  # stream -> curve -> bins

    def run(self) -> dict:
        from omnidraft.atomic import check_writable
        from omnidraft.bench.engine import Engine, resolve_pair, set_threads

        s = self.s
        s.validate()
        self.pair = resolve_pair(s.pair)
        check_writable(s.out, folder=True)  # before any export or pass, not when the report is written
        self.report["meta"]["threads"] = set_threads(s.threads)
        d_path, t_path = self.pair.paths(s.backend, s.max_seq_len, self.progress)
        self.eng = Engine(s.backend, d_path, t_path, s.threads)
        self.report["meta"]["pair"] = {
            "name": self.pair.name,
            "drafter": str(self.pair.drafter),
            "target": str(self.pair.target),
        }
        try:
            for name in s.streams:
                self.report["streams"].append(self.stream(name))
        except KeyboardInterrupt:
            self.report["interrupted"] = True
        finally:
            self.finish()
        return self.report

    def _fit(self, items, count: int) -> list[str]:
        k = max(max(self.s.ks), self.s.max_draft_len)
        return [p.prompt for p in items if self.eng.fits(p.prompt, self.s.max_new_tokens, k)][:count]

    def train_pass(self, stream: str, variant: str, prompts: list[str]) -> _Pass:
        from omnidraft.adapt.config import AdaptConfig, HeadTraining, StreamDecoding
        from omnidraft.adapt.online import OnlineAdapter
        from omnidraft.bench.adapted_rows import FULL
        from omnidraft.bench.engine import adaptation_pass

        s = self.s
        # Distilling the drafter too: the bench's short-stream settings (the paper's lr and one step per
        # update barely move the drafter in a few dozen prompts; see bench/adapted_rows.py).
        distill = {**FULL, "loss": s.loss} if s.loss != "none" else {"mode": "full", "loss": "none", "engine": "eager"}
        cfg = AdaptConfig.from_flat(**distill)  # FULL is spelt as the method table spells options
        cfg.schedule.every = s.every
        cfg.decoding = StreamDecoding(
            max_new_tokens=s.max_new_tokens,
            draft_len="auto",
            gamma=s.gamma,
            max_draft_len=s.max_draft_len,
            tune_gamma=s.tune_gamma,
        )
        cfg.head = HeadTraining(
            train=True,
            variant=variant,
            lr=s.head_lr,
            bias_lr=s.head_bias_lr,
            steps=s.head_steps,
            replay=s.head_replay,
        )
        state = s.out / "state" / f"{stream}.{variant}"
        shutil.rmtree(state, ignore_errors=True)  # our own scratch: never resume an earlier run
        # The pass verifies with the deployed target (this backend's export), so its labels are the
        # acceptances the timed rows will see; the drafter is the HF folder (trained, features recorded).
        ad = OnlineAdapter(self.pair.drafter, self.eng.paths[1], state, cfg)
        log = adaptation_pass(ad, prompts, f"{stream}: train head ({variant})", self.progress)
        from omnidraft.adapt.head import calibration

        cal = calibration(np.asarray(log.head_predicted, np.float32), np.asarray(log.head_observed, np.float32))
        self.calibration.setdefault(stream, {})[f"{variant}, train pass"] = cal
        gamma = ad.gamma_ctl.gamma if ad.gamma_ctl is not None else s.gamma
        k_max = ad.gamma_ctl.k_max if ad.gamma_ctl is not None else s.max_draft_len
        acc, prop = sum(log.accepted), sum(log.proposed)
        steps = [x for x in ad.head.losses if "loss" in x]
        summary = {
            "train_prompts": len(log.acceptance),
            "head_updates": len(steps),
            "stream_acceptance": round(acc / prop, 4) if prop else None,
            "gamma_after": round(gamma, 4),
            "k_max_after": k_max,
            "decode_seconds": round(log.decode_seconds, 1),
            "train_seconds": round(log.train_seconds, 1),
            "last_head_loss": steps[-1]["loss"] if steps else None,
            "calibration": cal,
            "drafter_training": {
                "loss": cfg.distill.loss,
                "updates": ad.updates,
                "lr": ad.trainer.lr,
                "steps_per_update": cfg.schedule.steps_per_update,
                "distill_temperature": cfg.distill.temperature,
            },
        }
        return _Pass(variant, ad.dir / "drafter", ad.cache_path if Path(ad.cache_path).is_file() else None, summary)

    def _drafter(self, folder: Path):
        from omnidraft.bench.bundled import drafter_export
        from omnidraft.bench.demo import BACKENDS
        from omnidraft.bench.engine import load_drafter

        fmt, quant = BACKENDS[self.s.backend]
        path = (
            folder
            if fmt is None
            else drafter_export(folder, fmt, quant, self.s.max_seq_len, self.progress, accept_head=folder)
        )
        return load_drafter(path)

    def stream(self, name: str) -> dict:
        from omnidraft.bench.engine import interleave
        from omnidraft.runtime.draft_length.controller import GammaController
        from omnidraft.runtime.draft_length.head_file import drafter_identity

        s, eng, mnt = self.s, self.eng, self.s.max_new_tokens
        train = self._fit(load_stream(name, "train", target=self.pair.target), s.train_prompts)
        test = self._fit(load_stream(name, "test", target=self.pair.target), s.prompts)
        if not test or not train:
            raise InvalidArgument(f"no {name} prompt fits --max-seq-len {s.max_seq_len}; raise it")
        passes = [self.train_pass(name, v, train) for v in s.variants]
        drafters = {p.variant: self._drafter(p.drafter) for p in passes}
        for d in drafters.values():
            eng.warm_up(test[0][:200], d)
        groups: dict[str, list[_Pass]] = {}
        for p in passes:  # fixed-K rows once per distinct drafter (once in all for --loss none)
            groups.setdefault(drafter_identity(p.drafter).weights_sha256, []).append(p)
        jobs = [eng.job("target-only", test, "target-only", 1, mnt)]
        fixed: dict[str, tuple[int, str]] = {}
        for group in groups.values():
            p = group[0]
            suffix = "" if len(groups) == 1 else f" ({p.variant} drafter)"
            for k in s.ks:
                label = f"K={k}{suffix}"
                fixed[label] = (k, p.variant)
                cache = eng.load_cache(p.cache) if p.cache else eng.new_cache()
                jobs.append(eng.job(label, test, "ngram", k, mnt, cache=cache, drafter=drafters[p.variant]))
        cal: dict[str, tuple[list, list]] = {}
        ctls = {}
        for p in passes:
            label = f"adaptive ({p.variant})"
            cal[label] = ([], [])
            # From --gamma and K_max, not where the pass's controller ended: the pass drafts with the
            # eager drafter (a call costs ~5x the exported one's), so its tuned setting is biased short.
            ctls[label] = (
                GammaController(gamma=s.gamma, k_max=s.max_draft_len, allow_off=s.allow_off) if s.tune_gamma else None
            )

            def collect(out, store=cal[label]) -> None:
                pr, ob = _observed(out)
                store[0].extend(pr)
                store[1].extend(ob)

            cache = eng.load_cache(p.cache) if p.cache else eng.new_cache()
            jobs.append(
                eng.job(
                    label,
                    test,
                    "ngram",
                    "auto",
                    mnt,
                    cache=cache,
                    drafter=drafters[p.variant],
                    gamma=s.gamma,
                    tune=ctls[label],
                    on_result=collect,
                    max_draft_len=s.max_draft_len,
                )
            )
        runs = interleave(jobs, len(test), f"{name}: {len(jobs)} rows in lockstep", self.progress)
        base = runs["target-only"]
        rows = []
        for job in jobs:
            run = runs[job.name]
            st = run.stats
            row = {
                "method": job.name,
                "draft_len": run.draft_len if job.name != "target-only" else None,
                "prompts": run.prompts,
                "acceptance_rate": round(st.acceptance_rate, 4) if st.proposed else None,
                "tokens_per_step": round(st.tokens_per_step, 4),
                "drafter_calls_per_step": round(st.drafter_calls / st.steps, 4) if st.steps else 0.0,
                "tokens_per_s": round(run.tokens_per_s, 2),
                "speedup": round(run.tokens_per_s / base.tokens_per_s, 4) if base.tokens_per_s else None,
                "decode_tokens_per_s": round(run.decode_tokens_per_s, 2),
                "decode_speedup": round(run.decode_tokens_per_s / base.decode_tokens_per_s, 4)
                if base.decode_tokens_per_s
                else None,
                "outputs_match_target_only": run.outputs == base.outputs,
            }
            if job.name in ctls:
                ctl = ctls[job.name]
                pr, ob = cal[job.name]
                from omnidraft.adapt.head import calibration

                row["gamma_final"] = round(ctl.gamma, 4) if ctl else s.gamma
                row["k_max_final"] = ctl.k_max if ctl else s.max_draft_len
                row["gamma_history"] = ctl.history if ctl else []
                # Where plain target steps replayed faster than any draft, the controller turns drafting off
                # for a window at a time (runtime/draft_length/controller.py); how many test prompts ran that way.
                row["prompts_without_drafting"] = (
                    sum(ctl.window for h in ctl.history if h["k_max_was"] == 0) if ctl else 0
                )
                row["calibration"] = calibration(np.asarray(pr, np.float32), np.asarray(ob, np.float32))
                variant = job.name.split("(")[1].rstrip(")")
                self.calibration.setdefault(name, {})[f"{variant}, test prompts"] = row["calibration"]
            rows.append(row)
        best = max((r for r in rows if r["method"] in fixed), key=lambda r: r["tokens_per_s"])
        best_decode = max((r for r in rows if r["method"] in fixed), key=lambda r: r["decode_tokens_per_s"])
        for r in rows:
            if r["method"].startswith("adaptive"):
                r["vs_best_fixed"] = (
                    round(r["tokens_per_s"] / best["tokens_per_s"] - 1.0, 4) if best["tokens_per_s"] else None
                )
                r["vs_best_fixed_decode"] = (
                    round(r["decode_tokens_per_s"] / best_decode["decode_tokens_per_s"] - 1.0, 4)
                    if best_decode["decode_tokens_per_s"]
                    else None
                )
        return {
            "stream": name,
            "test_prompts": len(test),
            "train_prompts": len(train),
            "best_fixed": best["method"],
            "passes": {p.variant: p.summary for p in passes},
            "rows": rows,
        }

    def checks(self) -> list[dict]:
        """The issue's bar, per variant: >= 5 % over the best fixed K on at least two streams, and
        never more than 3 % below it."""
        out = []
        for v in self.s.variants:
            gains = {
                st["stream"]: r["vs_best_fixed"]
                for st in self.report["streams"]
                for r in st["rows"]
                if r["method"] == f"adaptive ({v})" and r.get("vs_best_fixed") is not None
            }
            wins = sum(g >= 0.05 for g in gains.values())
            out.append(
                {
                    "variant": v,
                    "gains_vs_best_fixed": gains,
                    "beats_best_fixed_by_5pct_on_2_streams": wins >= 2 if len(gains) >= 2 else None,
                    "never_loses_more_than_3pct": all(g >= -0.03 for g in gains.values()) if gains else None,
                    "identical_greedy_output": all(
                        r["outputs_match_target_only"]
                        for st in self.report["streams"]
                        for r in st["rows"]
                        if r["method"] == f"adaptive ({v})"
                    ),
                }
            )
        return out

    def finish(self) -> None:
        from omnidraft.adapt.head import plot_calibration
        from omnidraft.atomic import write_json, write_text

        out = self.s.out
        out.mkdir(parents=True, exist_ok=True)
        self.report["checks"] = self.checks()
        plots = []
        if plot_calibration(self.calibration, out / "calibration.png", f"head calibration ({self.s.backend})"):
            plots.append("calibration.png")
        if plot_tokens_per_s(self.report["streams"], out / "adaptive_tokens_per_s.png"):
            plots.append("adaptive_tokens_per_s.png")
        self.report["plots"] = plots
        write_json(out / "adaptive.json", self.report)
        write_text(out / "adaptive.md", markdown(self.report))
